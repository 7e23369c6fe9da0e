"""A drafting call for the whole batch that raises part-way, after the draft's cache or a row's
state changed, is retried by the engine for each request alone: every request goes on, and
drafts from then on exactly as if the call had never failed."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdec import LLM, SamplingParams
from specdec_draft_target.drafter import DraftModel

PROMPTS = ("hello world, hello", "the cat sat on the mat. the cat", "a b c a b c a")
#: Drafting calls for the whole batch before the one that fails.
FAILING_STEP = 2


def run(tiny, draft: Path, fail_at: int | None = None) -> tuple[list, dict[tuple[int, int], list[int]], list]:
    """The outputs of the prompts decoded as one batch; every proposal the drafter returned, by
    (request, tokens so far); and (row lengths, recorded lengths) wherever a drafting call left
    rows holding other tokens than their state records. ``fail_at``: the drafter's
    ``fail_at``-th ``_draft_logits`` call (from 0) in the batch's drafting call number
    ``FAILING_STEP`` raises, once."""
    options = {"method": "draft_target", "speculative_model": str(draft), "max_draft_len": 3,
               "adaptive_draft_len": False}
    proposals: dict[tuple[int, int], list[int]] = {}
    out_of_step: list[tuple[list[int], list[int]]] = []
    with LLM(tiny.model, options, tokenizer=tiny.tokenizer) as llm:
        drafter: DraftModel = llm.engine.resource_manager.drafter
        propose, draft_logits = drafter.propose, drafter._draft_logits
        batched, calls = [], []

        def recording_propose(requests):
            if len(requests) == len(PROMPTS):
                batched.append(1)
                calls.clear()
            out = propose(requests)
            recorded = [len(r.method_state.tokens) for r in requests]
            if drafter.cache.lengths != recorded:  # a row holds other tokens than its state records
                out_of_step.append((list(drafter.cache.lengths), recorded))
            for request, proposal in zip(requests, out):
                proposals[request.request_id, len(request.token_ids)] = list(proposal.token_ids)
            return out

        def failing_draft_logits(logits):
            calls.append(1)
            if fail_at is not None and len(batched) == FAILING_STEP + 1 and len(calls) == fail_at + 1:
                raise RuntimeError("injected failure")
            return draft_logits(logits)

        drafter.propose, drafter._draft_logits = recording_propose, failing_draft_logits
        params = SamplingParams(max_tokens=24, ignore_eos=True)
        outputs = llm.generate([{"prompt_token_ids": tiny.encode(p)} for p in PROMPTS], params)
        if fail_at is not None:
            assert len(calls) > fail_at, "the injected failure never happened"
    return outputs, proposals, out_of_step


@pytest.mark.parametrize(
    "fail_at",
    [
        0,  # after the forward feeding every row its new token, before the rows' state records it
        3,  # after the first chain forward: the rows' state already records the fed token
    ],
    ids=["after-feed", "after-chain-forward"],
)
def test_a_retried_drafting_call_drafts_as_if_it_never_failed(tiny, small_draft_dir: Path, fail_at: int) -> None:
    """Each request's greedy output is its plain output, none ends with an error, every row
    holds the tokens its state records, and every proposal (the retried ones included) and
    acceptance count equal those of a run without the failure.

    Only the first request's retry drafts from its old row: a request drafted alone drops the
    other rows, so the other retries, and then the next step, prefill rows again. Those hold the
    same tokens, computed in another summation order, which this fp32 draft's greedy choices
    do not see."""
    plain = LLM(tiny.model, None, tokenizer=tiny.tokenizer)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    expected = [plain.generate({"prompt_token_ids": tiny.encode(p)}, params)[0].token_ids for p in PROMPTS]
    clean, clean_proposals, _ = run(tiny, small_draft_dir)
    failed, failed_proposals, out_of_step = run(tiny, small_draft_dir, fail_at)
    assert out_of_step == []
    assert [out.token_ids for out in clean] == expected
    assert [out.token_ids for out in failed] == expected
    assert [out.finish_reason for out in failed] == ["length"] * len(PROMPTS)
    assert sum(out.metrics.num_accepted_tokens for out in clean) > 0
    assert failed_proposals == clean_proposals
    for got, want in zip(failed, clean):
        assert (got.metrics.num_drafts, got.metrics.num_accepted_tokens, got.metrics.num_accepted_tokens_per_pos) == (
            want.metrics.num_drafts, want.metrics.num_accepted_tokens, want.metrics.num_accepted_tokens_per_pos)
