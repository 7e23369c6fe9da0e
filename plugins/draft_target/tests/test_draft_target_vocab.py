"""A frequency-ranked draft vocabulary (``draft_vocab_size``): lossless, and each draft is the full
draft's choice among the kept tokens; its ranking is written by ``specdec train draft-vocab``; a
bad ranking or size is a one-line error naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from draft_target_helpers import save
from specdec import LLM, ConfigError, Request, SamplingParams
from specdec.sampling import PositionNoise
from specdec.testing.conformance import MethodConformance
from specdec.testing.tiny import shuffled_ranking
from specdec.training.conversations import tokenize_all
from specdec.training.synthesize import SynthesisOptions, synthesize
from specdec_draft_target import DraftTargetDecodingConfig
from specdec.cli.train_vocab import train_draft_vocab
from specdec.draft_vocab import load_ranking, save_ranking
from specdec_draft_target.drafter import DraftModel
from specdec_draft_target.train import build_draft

#: Tokens kept of the tiny vocabulary's 36.
KEPT = 24


class TestTrimmedVocabConformance(MethodConformance):
    """Greedy, batched and sampled (chi-square) output stay the target's with 24 of 36 tokens kept:
    the target's tokens outside them come from the verify step alone."""

    def make_config(self, target, tmp_path):
        draft = save(build_draft(target.model, [0]), target.tokenizer, tmp_path / "draft")
        ranking = shuffled_ranking(len(target.tokenizer), tmp_path / "ranking.safetensors")
        return DraftTargetDecodingConfig(max_draft_len=4, speculative_model=str(draft), draft_vocab=str(ranking),
                                         draft_vocab_size=KEPT)

    def test_drafts_are_the_full_drafts_choice_among_kept_tokens(self, target, config, prompts: list[list[int]]) -> None:
        """A greedy chain is what the untrimmed draft picks when only kept tokens may be picked
        (so rows map back to the right token ids); sampled drafts hold only kept tokens, with
        probabilities over the target's vocabulary that are zero off the kept tokens."""
        from specdec.models import load_model

        vocab = len(target.tokenizer)
        kept = load_ranking(Path(config.draft_vocab), vocab)[:KEPT].sort().values
        off = torch.ones(vocab, dtype=torch.bool)
        off[kept] = False
        full, _ = load_model(config.speculative_model, torch.float32, "cpu")
        expected = list(prompts[0])
        with torch.no_grad():
            for _ in range(4):
                logits = full(torch.tensor([expected])).logits[0, -1]
                expected.append(int(logits.masked_fill(off, float("-inf")).argmax()))

        trimmed, _ = load_model(config.speculative_model, torch.float32, "cpu")
        drafter = DraftModel(trimmed, vocab, vocab=kept)
        greedy, sampled = SamplingParams(max_tokens=32), SamplingParams(temperature=1.0, max_tokens=32)
        requests = [Request(i, list(prompts[0]), len(prompts[0]), params, PositionNoise(i, vocab))
                    for i, params in enumerate((greedy, sampled))]
        for request in requests:
            request.method_state = drafter.add(request)
            request.max_draft_len = 4
        chain, draws = drafter.propose(requests)
        assert chain.token_ids == expected[len(prompts[0]):]
        assert len(draws) == 4 and set(draws.token_ids) <= set(kept.tolist())
        assert draws.probs.shape == (4, vocab)
        torch.testing.assert_close(draws.probs.sum(-1), torch.ones(4))
        assert float(draws.probs[:, off].abs().sum()) == 0.0


@pytest.mark.parametrize(("update", "message"), [
    ({"draft_vocab": None}, "draft_vocab: required with draft_vocab_size for a drafter of your own"),
    ({"draft_vocab_size": 37}, "draft_vocab_size: 37 exceeds the 36 tokens ranked in"),
    ({"draft_vocab": "missing.safetensors"}, "draft_vocab: no such file: missing.safetensors"),
])
def test_bad_draft_vocabulary_refused(tiny, small_draft_dir: Path, tmp_path: Path, update: dict, message: str) -> None:
    ranking = shuffled_ranking(len(tiny.tokenizer), tmp_path / "ranking.safetensors")
    config = DraftTargetDecodingConfig(speculative_model=str(small_draft_dir), draft_vocab=str(ranking),
                                       draft_vocab_size=KEPT).model_copy(update=update)
    with pytest.raises(ConfigError, match=message):
        LLM(tiny.model, config, tokenizer=tiny.tokenizer)


def test_bad_ranking_files_refused(tiny, tmp_path: Path) -> None:
    """Each names the field and the file: not safetensors, no ranking in it, ids outside the
    target's vocabulary, an id ranked twice."""
    from safetensors.torch import save_file

    vocab = len(tiny.tokenizer)
    text = tmp_path / "ranking.txt"
    text.write_text("1 2 3")
    other = tmp_path / "other.safetensors"
    save_file({"weights": torch.zeros(3)}, str(other))
    wide, twice = tmp_path / "wide.safetensors", tmp_path / "twice.safetensors"
    save_ranking(wide, torch.arange(vocab + 1), torch.zeros(vocab + 1), {})
    save_ranking(twice, torch.tensor([3, 4, 3]), torch.zeros(3), {})
    for path, message in ((text, "is not a safetensors file"), (other, "holds no 'token_ids' tensor"),
                          (wide, f"outside the target's vocabulary of {vocab}"), (twice, "ranks some token ids twice")):
        with pytest.raises(ConfigError, match=f"draft_vocab: .*{message}"):
            load_ranking(path, vocab)


def test_train_draft_vocab_ranks_reply_tokens(tiny, target_dir: Path, tmp_path: Path) -> None:
    """`specdec train draft-vocab` counts the target's reply tokens, most used first, and reports
    coverage; data without replies is refused."""
    records = [{"conversation_id": str(i), "conversations": [{"role": "user", "content": text}]}
               for i, text in enumerate(["hello there", "the cat sat", "one two three"])]
    data = tmp_path / "synth.jsonl"
    synthesize(tiny.model, tiny.tokenizer, records, data, SynthesisOptions(max_new_tokens=12, batch_size=3))
    out = tmp_path / "ranking.safetensors"
    result = CliRunner().invoke(train_draft_vocab, ["--data", str(data), "--model", str(target_dir), "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert "reply tokens covered" in result.output and "1024" not in result.output  # sizes past the vocabulary are left out

    # Reply tokens as the training data marks them: each assistant turn's tokens in the chat template.
    examples = tokenize_all([json.loads(line) for line in data.read_text().splitlines()], tiny.tokenizer, 2048)
    counts = sum(torch.bincount(e.input_ids[e.loss_mask], minlength=len(tiny.tokenizer)) for e in examples)
    ranking = load_ranking(out, len(tiny.tokenizer))
    assert sorted(ranking.tolist()) == list(range(len(tiny.tokenizer)))
    ranked_counts = counts[ranking]
    assert torch.all(ranked_counts[:-1] >= ranked_counts[1:])
    assert int(ranked_counts[0]) == int(counts.max()) > 0

    unanswered = tmp_path / "prompts.jsonl"
    unanswered.write_text("".join(json.dumps(r) + "\n" for r in records))
    result = CliRunner().invoke(train_draft_vocab, ["--data", str(unanswered), "--model", str(target_dir), "--output", str(out)])
    assert isinstance(result.exception, ConfigError) and "no assistant reply tokens" in str(result.exception)
