"""ReDrafter's draft vocabulary: the beams draft among the kept tokens only, and keeping every
token (in a shuffled order) drafts exactly the beams of the full output layer, so the trimmed
rows map back to the right token ids."""

from __future__ import annotations

import pytest
from redrafter_tiny import fitted_drafter

from specdec import LLM, SamplingParams
from specdec.draft_vocab import kept_tokens, load_ranking
from specdec.testing.conformance import fixed_draft_len, recorded_proposals
from specdec.testing.tiny import make_tiny_target, shuffled_ranking
from specdec_redrafter import save_drafter
from specdec_redrafter.drafter import ReDrafterResources


@pytest.mark.parametrize("kept", [24, 36])
def test_beams_draft_among_the_kept_tokens(tmp_path, monkeypatch: pytest.MonkeyPatch, kept: int) -> None:
    target = make_tiny_target(seed=0)
    vocab = target.model.config.vocab_size
    directory = save_drafter(fitted_drafter(target.model), tmp_path / "drafter")
    ranking = shuffled_ranking(vocab, tmp_path / "ranking.safetensors")
    allowed = set(kept_tokens(load_ranking(ranking, vocab), kept, "test").tolist())
    seen = recorded_proposals(monkeypatch, ReDrafterResources)
    prompts = [{"prompt_token_ids": target.encode("hello world")}, {"prompt_token_ids": target.encode("the cat")}]
    drafted = {}
    for options in ({}, {"draft_vocab": str(ranking), "draft_vocab_size": kept}):
        seen.clear()
        config = fixed_draft_len({"method": "redrafter", "speculative_model": str(directory), "redrafter_num_beams": 4,
                                  "max_draft_len": 3, **options})
        with LLM(target.model, config, tokenizer=target.tokenizer) as llm:
            llm.generate(prompts, SamplingParams(max_tokens=16))
        drafted[bool(options)] = [(p.token_ids, p.parents) for _, p in seen]
    assert any(tokens for tokens, _ in drafted[True])
    assert all(t in allowed for tokens, _ in drafted[True] for t in tokens)
    if kept == vocab:
        assert drafted[True] == drafted[False]
    else:
        assert drafted[True] != drafted[False]
