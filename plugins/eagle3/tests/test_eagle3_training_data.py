"""Training data: draft-vocabulary calibration and the offline dump."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from eagle3_training_data import tiny_target

from specdec.errors import ConfigError
from specdec.testing import TWO_TURNS
from specdec.training.conversations import tokenize_all
from specdec_eagle3.training.dump import DumpDataset, write_dump
from specdec.training.token_frequency import coverage, token_counts
from specdec_eagle3.training.vocab import calibrate

@pytest.fixture(scope="module")
def target():
    return tiny_target()


def test_calibration_keeps_the_most_frequent_reply_tokens() -> None:
    """Reply-token counts rank first, prompt counts break ties, then lower ids; d2t and t2d agree."""
    ids = torch.tensor([5, 5, 5, 9, 9, 2, 7, 7, 7, 7, 3])
    mask = torch.tensor([1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0], dtype=torch.bool)
    assistant, every = token_counts([(ids, mask)], 12)
    assert assistant.tolist() == [0, 0, 1, 0, 0, 3, 0, 0, 0, 2, 0, 0]
    d2t, t2d = calibrate(assistant, every, 4)
    chosen = torch.arange(4) + d2t
    assert chosen.tolist() == [2, 5, 7, 9]  # 5, 9, 2 from the replies; 7 is the most frequent of the rest
    assert t2d.nonzero().flatten().tolist() == chosen.tolist()
    assert coverage(assistant, t2d) == 1.0
    d2t, t2d = calibrate(assistant, every, 6)  # past every seen token: 3 (seen once), then the lowest unused id
    assert (torch.arange(6) + d2t).tolist() == [0, 2, 3, 5, 7, 9]
    with pytest.raises(ConfigError, match="--draft-vocab-size: must be in 1..12"):
        calibrate(assistant, every, 13)


def test_dump_round_trips_the_target_states(target, tmp_path: Path) -> None:
    """Every conversation comes back with its ids and mask, the fused layers' states, the final
    state that reproduces the target's logits, and the target's greedy tokens, across shards."""
    records = [{"conversation_id": f"c{n}", "conversations": [
        {"role": "user", "content": "the cat " * (n + 1)}, {"role": "assistant", "content": "sat on the mat" + "." * n}]}
        for n in range(5)]
    examples = tokenize_all(records, target.tokenizer, 512)
    index = write_dump(target.model, examples, (0, 2), tmp_path / "dump", target_name="tiny", batch_size=2, shard_size=2)
    assert len(index["shards"]) == 3 and index["conversations"] == 5 and index["layers"] == [0, 2]
    dataset = DumpDataset(tmp_path / "dump")
    weights = dataset.target_tensors()
    assert torch.equal(weights["embed_tokens.weight"], target.model.get_input_embeddings().weight)
    by_id = {e.conversation_id: e for e in examples}
    order = [c["id"] for s in index["shards"] for c in s["conversations"]]
    for n, conversation_id in enumerate(order):
        item, example = dataset[n], by_id[conversation_id]
        assert torch.equal(item["input_ids"], example.input_ids) and torch.equal(item["loss_mask"], example.loss_mask)
        with torch.no_grad():
            out = target.model(example.input_ids[None], output_hidden_states=True)
        want = torch.cat([out.hidden_states[0][0], out.hidden_states[2][0]], dim=-1)
        torch.testing.assert_close(item["features"], want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(item["final_hidden"] @ weights["lm_head.weight"].T, out.logits[0], atol=1e-4, rtol=1e-4)
        assert torch.equal(item["target_argmax"], out.logits[0].argmax(-1))
    assert [len(ids) for ids, _ in dataset.sequences()] == [len(by_id[i].input_ids) for i in order]


def test_dump_refuses_to_overwrite_and_reports_broken_dumps(target, tmp_path: Path) -> None:
    examples = tokenize_all([TWO_TURNS], target.tokenizer, 512)
    write_dump(target.model, examples, (1,), tmp_path / "d", target_name="tiny")
    with pytest.raises(ConfigError, match="already holds a dump"):
        write_dump(target.model, examples, (1,), tmp_path / "d", target_name="tiny")
    (tmp_path / "d" / "shard-00000.safetensors").unlink()
    with pytest.raises(ConfigError, match="missing file shard-00000.safetensors"):
        DumpDataset(tmp_path / "d")
    (tmp_path / "d" / "index.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(ConfigError, match="not a specdec EAGLE-3 dump index"):
        DumpDataset(tmp_path / "d")
    with pytest.raises(ConfigError, match="no index.json"):
        DumpDataset(tmp_path)


def test_several_dumps_read_as_one_and_must_match(target, tmp_path: Path) -> None:
    """Dumps of parts of the data (made in parallel) train together; dumps of other layers are refused."""
    examples = tokenize_all([TWO_TURNS, {**TWO_TURNS, "conversation_id": "z"}], target.tokenizer, 512)
    write_dump(target.model, examples[:1], (0, 1), tmp_path / "a", target_name="tiny")
    write_dump(target.model, examples[1:], (0, 1), tmp_path / "b", target_name="tiny")
    write_dump(target.model, examples[1:], (0, 2), tmp_path / "c", target_name="tiny")
    both = DumpDataset([tmp_path / "a", tmp_path / "b"])
    assert len(both) == 2 and torch.equal(both[1]["input_ids"], examples[1].input_ids)
    assert len(list(both.sequences())) == 2
    with pytest.raises(ConfigError, match=r"its layers \[0, 2\] differs .* dumps must share a target and layers"):
        DumpDataset([tmp_path / "a", tmp_path / "c"])


def test_dump_of_a_target_with_tied_embeddings(tmp_path: Path) -> None:
    """Targets whose output layer is their input embedding (SmolLM2) dump both copies."""
    tied = tiny_target()
    tied.model.lm_head.weight = tied.model.model.embed_tokens.weight
    write_dump(tied.model, tokenize_all([TWO_TURNS], tied.tokenizer, 512), (0,), tmp_path / "d", target_name="tiny")
    weights = DumpDataset(tmp_path / "d").target_tensors()
    assert torch.equal(weights["lm_head.weight"], weights["embed_tokens.weight"])
