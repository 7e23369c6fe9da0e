"""`specdec_hf_generate_kwargs` gives transformers' assisted generation the same draft, with the
same fixed draft length, and it runs (greedy: same tokens as plain generate)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers.generation import candidate_generator

from specdec_draft_target import DraftTargetDecodingConfig

from specdec.testing import hf_peer_kwargs


def test_assistant_model_is_the_configured_draft(tiny, small_draft_dir: Path) -> None:
    kwargs = hf_peer_kwargs(tiny, DraftTargetDecodingConfig(max_draft_len=3, speculative_model=str(small_draft_dir)))
    assistant = kwargs["assistant_model"]
    assert Path(assistant.name_or_path) == small_draft_dir
    assert assistant.generation_config.num_assistant_tokens == 3
    assert assistant.generation_config.num_assistant_tokens_schedule == "constant"
    ids = torch.tensor([tiny.encode("the cat sat on the mat. the cat")], device=tiny.model.device)
    plain = tiny.model.generate(ids, max_new_tokens=12, do_sample=False)
    assisted = tiny.model.generate(ids, max_new_tokens=12, do_sample=False, **kwargs)
    assert torch.equal(plain, assisted)


@pytest.mark.parametrize(("threshold", "drafted"), [(0.0, 3), (0.99, 1)])
def test_assistant_drafts_with_the_same_confidence_threshold(tiny, small_draft_dir: Path, threshold: float, drafted: int,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a threshold the assistant drafts its full 3 tokens every step (transformers would
    otherwise apply its own default threshold of 0.4); with one that the tiny draft (probabilities
    0.06-0.09) never reaches, every chain stops after one token, as specdec's do.

    That holds while transformers keeps the threshold fixed, which it does without scikit-learn.
    With scikit-learn installed it re-fits the threshold once more than five drafts were judged,
    some accepted and some not (a ROC curve of the draft's probabilities against acceptance), and
    chains grow; the test pins the fixed case."""
    monkeypatch.setattr(candidate_generator, "is_sklearn_available", lambda: False)
    config = DraftTargetDecodingConfig(max_draft_len=3, speculative_model=str(small_draft_dir), confidence_threshold=threshold)
    kwargs = hf_peer_kwargs(tiny, config)
    assistant = kwargs["assistant_model"]
    assert assistant.generation_config.assistant_confidence_threshold == threshold
    chains = []
    generate = assistant.generate

    def recording_generate(*args, **kw):
        out = generate(*args, **kw)
        chains.append(out.sequences.shape[1] - kw["input_ids"].shape[1])
        return out

    assistant.generate = recording_generate
    ids = torch.tensor([tiny.encode("the cat sat on the mat. the cat")], device=tiny.model.device)
    tiny.model.generate(ids, max_new_tokens=24, do_sample=False, **kwargs)
    assert len(chains) > 3 and set(chains[:-1]) == {drafted}


def test_other_methods_get_no_kwargs(tiny) -> None:
    assert "assistant_model" not in (hf_peer_kwargs(tiny, {"method": "ngram"}) or {})
