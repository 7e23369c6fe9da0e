"""Adaptive draft length: speculate only when the expected tokens pay for the verify cost."""

import pytest

from specdec import LLM, SamplingParams
from specdec.draft_policy import PRIOR_ACCEPTANCE, AcceptanceEstimate, ForwardCost


def test_expected_tokens_follow_the_acceptance_chain():
    """E[tokens | L drafts] = 1 + sum_j prod_{i<=j} alpha_i."""
    est = AcceptanceEstimate([0.5, 0.5, 0.25])
    assert est.expected_tokens(3) == pytest.approx([1.0, 1.5, 1.75, 1.8125])
    # Positions never seen use the prior.
    assert est.expected_tokens(4)[-1] == pytest.approx(1.8125 + 0.0625 * PRIOR_ACCEPTANCE)


def test_update_counts_only_reached_positions():
    """A rejection at position i is evidence about i, not about the positions after it."""
    est = AcceptanceEstimate()
    est.update(num_drafted=4, num_accepted=1)
    assert len(est.alpha) == 2
    assert est.alpha[0] > PRIOR_ACCEPTANCE > est.alpha[1]


def test_flat_cost_keeps_every_draft():
    """Where wider forwards cost the same (bf16 on CPU), every offered draft is worth verifying,
    however unlikely; with a few percent of measured spread, still so at typical acceptance."""
    assert ForwardCost([1.0] * 5).best_length(AcceptanceEstimate([0.05] * 4), offered=4) == 4
    near_flat = ForwardCost([1.0, 1.02, 0.98, 1.01, 1.03])
    assert near_flat.best_length(AcceptanceEstimate([0.6] * 4), offered=4) == 4


def test_expensive_short_widths_are_skipped():
    """float32 on CPU: 2-3 tokens cost ~2x, 4-5 tokens ~1.15x; short drafts do not pay, long ones do."""
    cost = ForwardCost([1.0, 1.9, 2.0, 1.15, 1.2])
    est = AcceptanceEstimate([0.5] * 4)
    assert cost.best_length(est, offered=1) == 0
    assert cost.best_length(est, offered=2) == 0
    assert cost.best_length(est, offered=4) == 4
    assert cost.best_length(AcceptanceEstimate([0.05] * 4), offered=4) == 0


def test_noise_sized_differences_do_not_cut_drafts():
    """A longer draft within the tolerance of the best rate is kept: costs measured on a busy
    machine spread by a few percent, and a cut must not rest on that."""
    cost = ForwardCost([1.0, 1.0, 1.0, 1.04, 1.04])
    # The 4th draft adds ~0.1 expected tokens at 4% more cost: nearly even, so keep it.
    assert cost.best_length(AcceptanceEstimate([0.3] * 4), offered=4) == 4


def test_relax_drifts_back_to_the_prior():
    est = AcceptanceEstimate([0.0])
    for _ in range(200):
        est.relax()
    assert est.alpha[0] == pytest.approx(PRIOR_ACCEPTANCE, abs=1e-3)


def test_engine_cuts_drafts_losslessly(tiny):
    """With a cost model under which drafting never pays, the engine decodes plainly (no drafts);
    with expensive short widths it verifies only long drafts; the output never changes."""
    prompt = tiny.encode("hello world, hello world, hello")
    params = SamplingParams(max_tokens=40)
    plain = LLM(tiny.model, None, tokenizer=tiny.tokenizer).generate({"prompt_token_ids": prompt}, params)[0]
    with LLM(tiny.model, {"method": "ngram", "num_speculative_tokens": 4}, tokenizer=tiny.tokenizer) as llm:
        llm.engine.forward_cost = ForwardCost([1.0, 50.0, 50.0, 50.0, 50.0])
        never = llm.generate({"prompt_token_ids": prompt}, params)[0]
        assert never.token_ids == plain.token_ids and never.metrics.num_drafts == 0
        llm.engine.forward_cost = ForwardCost([1.0, 3.0, 3.0, 1.0, 1.0])
        long_only = llm.generate({"prompt_token_ids": prompt}, params)[0]
        assert long_only.token_ids == plain.token_ids and long_only.metrics.num_drafts > 0
        # Only 3- and 4-token drafts were verified: no draft ever ended at position 1 or 2.
        per_pos = long_only.metrics.num_accepted_tokens_per_pos
        assert long_only.metrics.num_draft_tokens >= 3 * long_only.metrics.num_drafts and len(per_pos) >= 3
