"""`specdec train medusa` end to end on a tiny target and its own answers: the loss falls, the
export (shared or own lm_head) loads in the plugin and drafts without changing greedy output,
`specdec validate` measures it, a resumed run equals an uninterrupted one, bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from specdec import LLM, SamplingParams
from specdec.cli.main import main
from specdec.errors import ModelLoadError
from specdec.training.distributed import World
from specdec.training.examples import ExampleDataset, load_examples
from specdec.testing.training import Interrupted, answered, interrupted_after_save, saved_target
from specdec.training.state import STATE_FILE
from specdec.training.target import FrozenTarget
from specdec_medusa.checkpoint import load_heads
from specdec_medusa.training.loop import FitOptions, evaluate
from specdec_medusa.training.model import new_heads


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    directory = tmp_path_factory.mktemp("medusa-train")
    path = directory / "target"
    target = saved_target(path)
    return {"dir": directory, "target": target, "target_dir": str(path), "data": str(answered(target, directory))}


def train(files: dict, output: Path, *extra: str) -> list[str]:
    return ["train", "medusa", "--model", files["target_dir"], "--dtype", "float32", "--data", files["data"],
            "--output", str(output), "--num-heads", "3", "--batch-size", "4", "--precision", "float32", *extra]


def one_line_error(args: list[str], text: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert text in err, err


def test_train_export_draft_validate(files: dict, capsys: pytest.CaptureFixture[str]) -> None:
    """Shared lm_head (the default): the held-out loss (here the training set itself: overfitting is
    the point) falls well below the untrained heads'; the directory holds blocks only and loads
    with the target's lm_head; greedy output with the heads is plain decoding's; validate runs."""
    out = files["dir"] / "shared"
    target = files["target"]
    examples = load_examples((files["data"],), target.tokenizer, 2048)
    before = evaluate(new_heads(3, 1, target.model.get_output_embeddings().weight, True), FrozenTarget(target.model),
                      ExampleDataset(examples), FitOptions(batch_size=4), World())
    assert main(train(files, out, "--epochs", "8", "--lr", "1e-2", "--warmup", "2", "--eval-data", files["data"],
                      "--export-dtype", "float32")) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "training 3 Medusa heads x 1 block(s), sharing the target lm_head: 16 conversations read" in err
    assert "held-out loss per head" in err and "wrote 3 heads (shared lm_head, float32)" in err
    record = json.loads((out / "training.json").read_text())
    assert record["position"] == {"step": 32, "epoch": 8, "batch": 0} and record["share_lm_head"] is True
    after = record["heldout_loss_per_head"]
    assert all(a < 0.7 * b for a, b in zip(after, before.losses)), (before.losses, after)
    assert record["heldout_chain_acceptance_length"] > before.acceptance_length
    config = json.loads((out / "config.json").read_text())
    assert config["medusa_num_heads"] == 3 and config["medusa_num_layers"] == 1 and config["medusa_shared_lm_head"] is True
    assert config["base_model_name_or_path"] == files["target_dir"]
    assert sorted(load_file(str(out / "medusa_lm_head.safetensors"))) == sorted(
        f"{i}.0.linear.{w}" for i in range(3) for w in ("weight", "bias"))

    prompts = [{"prompt_token_ids": target.encode(t)} for t in ("the cat sat on", "hello world one two", "big red")]
    params = SamplingParams(max_tokens=16)
    with LLM(target.model, None, tokenizer=target.tokenizer) as plain:
        expected = [o.token_ids for o in plain.generate(prompts, params)]
    config = {"method": "medusa", "model": str(out), "adaptive_draft_len": False}
    with LLM(target.model, config, tokenizer=target.tokenizer) as llm:
        outputs = llm.generate(prompts, params)
    assert [o.token_ids for o in outputs] == expected
    assert sum(o.metrics.num_accepted_tokens for o in outputs) > 0

    report = files["dir"] / "validate.json"
    assert main(["validate", "--model", files["target_dir"], "--dtype", "float32", "--method", "medusa", "--speculative-model",
                 str(out), "--dataset", files["data"], "--num-prompts", "4", "--max-tokens", "16", "--json", str(report)]) == 0
    overall = json.loads(report.read_text())["overall"]
    assert overall["num_drafts"] > 0 and overall["mean_acceptance_length"] > 1.0


def test_own_lm_head_layout_and_loader_errors(files: dict, capsys: pytest.CaptureFixture[str]) -> None:
    """--own-lm-head writes each head's projection ({i}.{L}.weight, whole, after training over a
    narrowed vocabulary) and no shared flag; a shared
    checkpoint needs the target's lm_head and uses it as it is; a non-shared checkpoint missing a
    projection names it and the flag."""
    target = files["target"]
    own, shared = files["dir"] / "own", files["dir"] / "shared-small"
    for out, flag in ((own, "--own-lm-head"), (shared, "--share-lm-head")):
        # --train-vocab narrows the softmax only: the export is the same layout over the whole vocabulary.
        assert main(train(files, out, flag, "--max-steps", "2", "--num-layers", "2", "--train-vocab", "12")) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "softmax over the 12 most frequent reply tokens" in err
    assert json.loads((own / "training.json").read_text())["options"]["train_vocab"] == 12
    tensors = load_file(str(own / "medusa_lm_head.safetensors"))
    assert json.loads((own / "config.json").read_text())["medusa_shared_lm_head"] is False
    assert {f"{i}.2.weight" for i in range(3)} <= set(tensors) and tensors["0.2.weight"].dtype == torch.bfloat16
    hidden, vocab = target.model.config.hidden_size, target.model.config.vocab_size
    heads = load_heads(own, hidden, vocab)
    assert not heads.uses_target_lm_head and heads.lm_heads[0] is not heads.lm_heads[1]
    lm_head = target.model.get_output_embeddings().weight
    heads = load_heads(shared, hidden, vocab, target_lm_head=lm_head)
    assert heads.uses_target_lm_head and all(h.weight.data_ptr() == lm_head.data_ptr() for h in heads.lm_heads)
    with pytest.raises(ModelLoadError, match="medusa_shared_lm_head is true, so the heads need the target's lm_head"):
        load_heads(shared, hidden, vocab)
    config = json.loads((shared / "config.json").read_text())
    (shared / "config.json").write_text(json.dumps({**config, "medusa_shared_lm_head": False}))
    with pytest.raises(ModelLoadError, match=r"tensor '0.2.weight' is missing \(a head's vocabulary projection; .*"
                                             r"\"medusa_shared_lm_head\": true"):
        load_heads(shared, hidden, vocab, target_lm_head=lm_head)


def test_resume_takes_the_steps_an_uninterrupted_run_takes(files: dict, capsys: pytest.CaptureFixture[str]) -> None:
    """A run stopped after its step-3 save and resumed ends with exactly the weights (and
    optimizer state) of a run never stopped: same batches, schedule and Adam moments."""
    whole, resumed = files["dir"] / "whole", files["dir"] / "resumed"
    common = ("--max-steps", "7", "--save-every", "3", "--export-dtype", "float32", "--own-lm-head")
    assert main(train(files, whole, *common)) == 0
    with interrupted_after_save(3), pytest.raises(Interrupted):
        main(train(files, resumed, *common))
    capsys.readouterr()
    assert json.loads((resumed / "training.json").read_text())["position"]["step"] == 3
    one_line_error(train(files, resumed, *common), "holds a training state; pass --resume to continue it", capsys)
    assert main(train(files, resumed, *common, "--resume")) == 0
    assert "resuming from step 3 (epoch 1, batch 3)" in " ".join(capsys.readouterr().err.split())
    a, b = load_file(str(whole / "medusa_lm_head.safetensors")), load_file(str(resumed / "medusa_lm_head.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    state_a = torch.load(whole / STATE_FILE, weights_only=True)
    state_b = torch.load(resumed / STATE_FILE, weights_only=True)
    assert state_a["position"] == state_b["position"] == {"step": 7, "epoch": 1, "batch": 3}
    moments = [(s["exp_avg"], s["exp_avg_sq"]) for s in state_a["optimizer"]["state"].values()]
    others = [(s["exp_avg"], s["exp_avg_sq"]) for s in state_b["optimizer"]["state"].values()]
    assert all(torch.equal(x, y) and torch.equal(u, v) for (x, u), (y, v) in zip(moments, others))
    one_line_error(train(files, resumed, *common, "--resume", "--num-layers", "2"),
                   "the saved state holds heads {'num_heads': 3, 'num_layers': 1, 'shared_lm_head': False}, this run asks for", capsys)


@pytest.mark.parametrize(("extra", "message"), [
    (["--num-heads", "0"], "--num-heads: must be at least 1, got 0"),
    (["--max-steps", "0"], "--max-steps: must be at least 1, got 0"),
    (["--eval-fraction", "0.1", "--eval-data", "x"], "--eval-fraction and --eval-data are alternatives; give one"),
    (["--eval-fraction", "1.5"], "--eval-fraction: must be in [0, 1), got 1.5"),
])
def test_bad_options_are_one_line(extra: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one_line_error(["train", "medusa", "--data", "nothing.jsonl", "--output", str(tmp_path / "o"), *extra], message, capsys)


def test_bad_files_are_one_line(files: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one_line_error(["train", "medusa", "--data", str(tmp_path / "missing.jsonl"), "--output", str(tmp_path / "o")],
                   f"--data: no file {str(tmp_path / 'missing.jsonl')!r}", capsys)
    one_line_error(train(files, tmp_path / "o", "--resume"), "--resume: no training_state.pt in", capsys)
    unanswered = tmp_path / "unanswered.jsonl"
    unanswered.write_text('{"conversation_id": 1, "conversations": [{"role": "user", "content": "hi"}]}\n')
    one_line_error(train(files, tmp_path / "o", "--eval-data", str(unanswered)),
                   "--eval-data: no conversation has an assistant reply to measure on", capsys)


def test_cached_states_replace_the_target(files: dict, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """--cache-states: the first run writes the target's states and trains as a run without the cache
    does; a later run reads them and never runs the target; a cache of other data is refused."""
    cache = files["dir"] / "states"
    plain, first, again = (files["dir"] / name for name in ("uncached", "cached", "cached-again"))
    common = ("--epochs", "2", "--export-dtype", "float32", "--eval-fraction", "0.25")
    assert main(train(files, plain, *common)) == 0
    assert main(train(files, first, *common, "--cache-states", str(cache))) == 0
    assert (cache / "index.json").is_file() and (cache / "shard-00000.safetensors").is_file()
    a, b = load_file(str(plain / "medusa_lm_head.safetensors")), load_file(str(first / "medusa_lm_head.safetensors"))
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)

    def no_target(*args, **kwargs):
        raise AssertionError("the target ran")

    from transformers.models.llama.modeling_llama import LlamaModel
    monkeypatch.setattr(LlamaModel, "forward", no_target)
    assert main(train(files, again, *common, "--cache-states", str(cache))) == 0
    c = load_file(str(again / "medusa_lm_head.safetensors"))
    assert all(torch.equal(b[k], c[k]) for k in b)
    capsys.readouterr()
    one_line_error(train(files, files["dir"] / "x", "--limit", "8", "--cache-states", str(cache)),
                   "caches other conversations or another target (conversations, fingerprint differ)", capsys)
