"""Adaptive draft length: speculate only when the expected tokens pay for the verify cost."""

import time
from types import SimpleNamespace

import pytest
import torch

from specdec import LLM, DraftProposal, SamplingParams, UserProvidedDecodingConfig, VerifyResult
from specdec.draft_budget import StepBudget
from specdec.draft_policy import (
    MIN_GAIN,
    PRIOR_ACCEPTANCE,
    PRIOR_WEIGHT,
    STEP_TIME_FORGET,
    STEP_TIME_STALE,
    TOLERANCE,
    TREND_DECAY,
    AcceptanceEstimate,
    ContextCost,
    CostMeasurement,
    DraftTime,
    ForwardCost,
    ResumeCost,
    StepTime,
    _interpolated,
    measured_widths,
    progress,
)
from specdec.resources import ResourceManager
from specdec.testing import PadDrafter


def estimate(*steps: tuple[int, int], window: int = 16) -> AcceptanceEstimate:
    est = AcceptanceEstimate(window)
    for drafted, accepted in steps:
        est.update(drafted, accepted)
    return est


def steady(rate_steps: int, drafted: int, accepted: int) -> AcceptanceEstimate:
    return estimate(*[(drafted, accepted)] * rate_steps)


def test_expected_tokens_follow_the_acceptance_chain():
    """E[tokens | L drafts] = 1 + sum_j prod_{i<=j} alpha_i, alpha from the window's counts."""
    est = estimate((4, 4), (4, 2), (4, 0), (4, 1))
    a0, a1, a2 = est.alpha(0), est.alpha(1), est.alpha(2)
    prior = PRIOR_WEIGHT * PRIOR_ACCEPTANCE
    assert a0 == pytest.approx((3 + prior) / (4 + PRIOR_WEIGHT))
    assert a1 == pytest.approx((2 + prior) / (3 + PRIOR_WEIGHT))
    assert a2 == pytest.approx((1 + prior) / (2 + PRIOR_WEIGHT))
    assert est.expected_tokens(3) == pytest.approx([1, 1 + a0, 1 + a0 + a0 * a1, 1 + a0 + a0 * a1 + a0 * a1 * a2])
    # A request with no evidence uses the prior.
    assert AcceptanceEstimate().alpha(5) == pytest.approx(PRIOR_ACCEPTANCE)


def test_a_rejection_is_evidence_only_about_its_position():
    """A rejection at position i says nothing about positions after i."""
    est = estimate((4, 1))
    assert est.alpha(0) > PRIOR_ACCEPTANCE > est.alpha(1)
    assert est.alpha(2) == pytest.approx(PRIOR_ACCEPTANCE)


def test_window_forgets_old_steps_and_paused_steps_age_it():
    """Only the last ``window`` steps count; steps without drafts push evidence out, so a
    paused request returns to the prior and probes again."""
    est = estimate(*[(4, 0)] * 8, window=8)
    assert est.alpha(0) < 0.15
    for _ in range(7):
        est.skip()
    assert est.alpha(0) < 0.5
    est.skip()
    assert est.alpha(0) == pytest.approx(PRIOR_ACCEPTANCE)


def test_engine_window_counts_batch_steps_not_request_steps():
    """The engine-wide estimate pools every drafting request of a step into one window entry, so
    a batch of 8 forgets its evidence no faster than a batch of 1: after 8 paused steps each
    request's own window of 8 holds no evidence and falls back to the engine's, which (a window of
    32 batch steps) still remembers that the method's drafts were rejected."""
    engine = AcceptanceEstimate(window=32)
    requests = [AcceptanceEstimate(window=8, prior=engine) for _ in range(8)]
    for _ in range(8):
        for r in requests:
            r.update(4, 0)
        engine.record_batch([(4, 0)] * 8)
    low = engine.alpha(0)
    assert low == pytest.approx(PRIOR_WEIGHT * PRIOR_ACCEPTANCE / (64 + PRIOR_WEIGHT))
    for _ in range(8):
        for r in requests:
            r.skip()
        engine.skip()
    assert engine.alpha(0) == pytest.approx(low)
    assert all(r.alpha(0) == pytest.approx(low) for r in requests)
    # Once the whole window has passed without drafts, the engine is optimistic again and probes.
    for _ in range(24):
        engine.skip()
    assert engine.alpha(0) == pytest.approx(PRIOR_ACCEPTANCE)
    # Pooled outcomes count per position, as a request's own do.
    engine.record_batch([(4, 4), (2, 1)])
    assert engine.alpha(1) == pytest.approx((1 + PRIOR_WEIGHT * PRIOR_ACCEPTANCE) / (2 + PRIOR_WEIGHT))


def test_flat_cost_keeps_every_draft():
    """Where wider forwards cost the same (bf16 on CPU), every offered draft is worth verifying,
    however unlikely; with a few percent of measured spread, still so at typical acceptance."""
    assert ForwardCost([1.0] * 5).best_length([steady(16, 4, 0)], [4]) == 4
    near_flat = ForwardCost([1.0, 1.02, 0.98, 1.01, 1.03])
    assert near_flat.best_length([AcceptanceEstimate()], [4]) == 4


def test_expensive_short_widths_are_skipped():
    """float32 on CPU: 2-3 tokens cost ~2x, 4-5 tokens ~1.25x; short drafts do not pay, long ones do."""
    cost = ForwardCost([1.0, 1.9, 2.2, 1.2, 1.3])
    half = estimate(*[(4, 4), (4, 0)] * 8)
    assert cost.best_length([half], [1]) == 0
    assert cost.best_length([half], [2]) == 0
    assert cost.best_length([half], [4]) == 4
    assert cost.best_length([steady(16, 4, 0)], [4]) == 0


def test_noise_sized_differences_do_not_cut_drafts():
    """A longer draft within the tolerance of the best rate is kept: costs measured on a busy
    machine spread by a few percent, and a cut must not rest on that."""
    cost = ForwardCost([1.0, 1.0, 1.0, 1.04, 1.04])
    # The 4th draft adds ~0.1 expected tokens at 4% more cost: nearly even, so keep it.
    assert cost.best_length([estimate(*[(4, 1), (4, 0), (4, 0)] * 5)], [4]) == 4


def test_batch_length_weighs_every_request():
    """In a batch every row pays for the common width: one request that accepts everything
    cannot justify drafting for seven that accept nothing when width costs grow with the batch."""
    cost = ForwardCost([1.0, 1.6, 2.2, 2.8, 3.4])
    good, bad = steady(16, 4, 4), steady(16, 4, 0)
    assert cost.best_length([good], [4]) == 4
    assert cost.best_length([good] + [bad] * 7, [4] * 8) == 0
    # A row offering fewer drafts than the width gains only what it offers.
    assert ForwardCost([1.0, 1.1, 1.2, 1.3, 1.4]).best_length([good, good], [4, 0]) == 4


def test_the_tolerance_never_keeps_a_length_that_does_not_clearly_beat_plain_decoding():
    """When drafting barely beats plain decoding, the tolerance may keep a longer draft near the
    best, but not one expected to gain less than MIN_GAIN over no draft at all; and a best gain
    under MIN_GAIN drafts nothing. A first draft right 7% of the time, flat forward costs: at 3% of
    a forward per drafted token, 2 drafts gain 4.4% (the best), 3 gain 3.7% and 4 only 2.2%,
    within the tolerance of the best but under the bar; at 5%, one draft gains 1.6% and none is kept."""
    rarely = steady(16, 4, 0)
    assert rarely.alpha(0) == pytest.approx(2 * PRIOR_ACCEPTANCE / 18)
    flat = ForwardCost([1.0] * 5)
    rates = flat.rates([rarely], [4], draft_cost=0.03)
    assert max(rates) == rates[2] and rates[4] >= rates[2] * (1 - TOLERANCE) and 1 < rates[4] < 1 + MIN_GAIN < rates[3]
    assert flat.best_length([rarely], [4], draft_cost=0.03) == 3
    assert 1 < max(flat.rates([rarely], [4], draft_cost=0.05)) < 1 + MIN_GAIN
    assert flat.best_length([rarely], [4], draft_cost=0.05) == 0


def trees(*steps: tuple[int, set[int]], window: int = 16) -> AcceptanceEstimate:
    """An estimate from tree steps: ``(nodes drafted, nodes on the accepted path)``."""
    est = AcceptanceEstimate(window)
    for nodes, accepted in steps:
        est.update(nodes, len(accepted), (nodes, frozenset(accepted)))
    return est


def test_tree_nodes_are_estimated_one_by_one():
    """A node's rate is how often it lay on the accepted path when drafted, shrunk toward the
    prior PRIOR_ACCEPTANCE / (i + 1), or toward the trend of the two nodes before it where both
    were drafted and that is higher; the expected tokens of a tree's first n nodes add them up;
    nodes never drafted after nodes that were hardly ever accepted keep the prior."""
    est = trees(*[(6, {0, 1}), (6, {0}), (6, {2}), (6, set())] * 4)
    rates = est.node_rates(10)
    for node, hits in ((0, 8), (1, 4), (2, 4), (4, 0), (5, 0)):
        assert rates[node] == pytest.approx((hits + PRIOR_WEIGHT * PRIOR_ACCEPTANCE / (node + 1)) / (16 + PRIOR_WEIGHT))
    # Nodes 1 and 2 hold up (0.26, then 0.24): their trend gives node 3 more than its prior 0.15.
    trend = rates[2] ** 2 / rates[1]
    assert trend > PRIOR_ACCEPTANCE / 4
    assert rates[3] == pytest.approx(PRIOR_WEIGHT * trend / (16 + PRIOR_WEIGHT))
    assert rates[9] == pytest.approx(PRIOR_ACCEPTANCE / 10)
    # Steps leaving the window take their counts with them.
    aged = trees(*[(6, {0})] * 4, *[(3, set())] * 4, window=4)
    assert aged.node_rates(5)[0] == pytest.approx(PRIOR_WEIGHT * PRIOR_ACCEPTANCE / (4 + PRIOR_WEIGHT))
    assert aged.node_rates(5)[3:] == pytest.approx([PRIOR_ACCEPTANCE / 4, PRIOR_ACCEPTANCE / 5])
    assert est.expected_tree_tokens(3) == pytest.approx([1, 1 + rates[0], 1 + rates[0] + rates[1], 1 + sum(rates[:3])])


def test_a_tree_whose_nodes_hold_up_prices_the_nodes_past_them_by_their_trend():
    """A repeated request's suffix matches: the three nodes drafted so far are nearly always
    accepted. The fourth, never drafted, is priced near them (the old prior, 0.15, never let the
    policy try it); past it the trend goes on at no more than TREND_DECAY of the node before, so
    the next nodes are priced together and the far ones fall back to the prior. Each request's
    own trend counts on top of the engine's."""
    engine = trees(*[(3, {0, 1, 2})] * 15, (3, {0}), window=64)
    rates = engine.node_rates(10)
    assert rates[3] == pytest.approx(rates[2] * min(1.0, rates[2] / rates[1])) and rates[3] > 0.8
    assert rates[4] == pytest.approx(rates[3] * TREND_DECAY) and rates[4] > PRIOR_ACCEPTANCE / 5
    assert rates[5] == pytest.approx(rates[4] * TREND_DECAY)
    assert rates[8:] == pytest.approx([PRIOR_ACCEPTANCE / 9, PRIOR_ACCEPTANCE / 10])
    # A request that drafted four nodes, all accepted, where the engine has seen only three.
    request = AcceptanceEstimate(16, prior=engine)
    for _ in range(4):
        request.update(4, 4, (4, frozenset(range(4))))
    own = request.node_rates(6)
    assert own[4] > engine.node_rates(6)[4] and own[4] == pytest.approx(own[3] * min(1.0, own[3] / own[2]))
    assert own[5] == pytest.approx(own[4] * TREND_DECAY)


def test_a_step_in_the_forwards_cost_does_not_hold_a_tree_below_it(monkeypatch):
    """One run's warm-up measured a six-token verify at 1.57 one-token forwards and five at 1.15
    (float32, a 2-core CPU). A tree drafted four nodes at a time, nearly always all accepted: the
    fifth node alone, however well its trend prices it, does not pay for that step, and priced
    alone (the trend stopping at the first node never drafted) it kept suffix decoding at four
    nodes a step for whole turns. Priced with the next few, the policy tries seven."""
    est = trees(*[(4, {0, 1, 2, 3})] * 15, (4, {0}))
    cliff = ForwardCost([1.0, 1.01, 1.06, 1.0, 1.15, 1.57, 1.6, 1.59, 1.72, 1.85, 1.86, 1.87, 1.88, 1.96, 2.03])
    assert cliff.best_length([est], [14], tree=True) == 7
    monkeypatch.setattr("specdec.draft_policy.TREND_DECAY", 0.0)
    assert cliff.best_length([est], [14], tree=True) == 4


def test_trees_keep_the_nodes_that_pay_for_their_width():
    """A 12-node tree whose first three nodes carry its acceptance: where every width costs about
    the same the whole tree is kept (the later nodes cost nothing and may still be accepted);
    where widths past 3 tokens cost twice a forward (a CPU in float32) only the first nodes are,
    rather than dropping the tree; a tree nobody accepts is not drafted. Chain estimates from the
    same steps' depths would cut the tree by a chain's per-position acceptance instead."""
    est = trees(*[(12, {0, 1}), (12, {0}), (12, {2}), (12, {0, 1})] * 4)
    flat = ForwardCost([1.0, 1.0, 1.0, 1.0, 1.02, 1.02, 1.02, 1.02, 1.04, 1.04, 1.04, 1.04, 1.05])
    assert flat.best_length([est], [12], tree=True) == 12
    steep = ForwardCost([1.0, 1.05, 1.1, 1.15] + [2.0] * 9)
    assert steep.best_length([est], [12], tree=True) == 3
    # Never accepted in 16 steps, the first node's rate is the prior's weight alone (0.07).
    assert ForwardCost([1.0, 1.1, 1.15, 1.2] + [2.0] * 9).best_length([trees(*[(12, set())] * 16)], [12], tree=True) == 0
    # Drafting is charged per node: at 0.3 forwards a node the third node (on the accepted path a
    # quarter of the time) no longer pays; at a whole forward a node none does.
    assert steep.best_length([est], [12], draft_cost=0.3, tree=True) == 2
    assert steep.best_length([est], [12], draft_cost=1.0, tree=True) == 0


def test_progress_counts_the_mean_or_the_end_of_a_draining_batch():
    """Without remainders a step's progress is the mean of its expected tokens. In a batch that
    only drains toward known lengths it is how much sooner the batch ends: a request ahead of the
    others adds nothing, the one behind decides."""
    assert progress([1.0, 3.0]) == pytest.approx(2.0)
    assert progress([1.0, 3.0], remaining=[50, 50]) == pytest.approx(1.0)
    # The request drafting for is 10 tokens behind: the batch ends sooner by its gain, unless the
    # other one would then become the last (50 / (40 / 1) = 1.25 caps the gain of 3).
    assert progress([1.0, 3.0], remaining=[40, 50]) == pytest.approx(50 / 40)
    assert progress([1.0, 3.0], remaining=[10, 50]) == pytest.approx(3.0)
    assert progress([2.0, 2.0], remaining=[30, 30]) == pytest.approx(2.0)


def test_a_draining_batch_does_not_draft_past_its_slowest_request():
    """Four requests that accept every draft and four with nothing to draft: rows are verified at
    one width, so with remainders unknown (or a queue to refill finished rows) the mean gain of 3
    tokens pays for a forward of 1.6; in a batch that only drains toward equal known lengths the
    four without drafts end it, so the wider forward only slows them; when they are far ahead,
    the others end it and drafting for them pays again. Trees follow the same rule."""
    cost = ForwardCost([1.0, 1.3, 1.4, 1.5, 1.6])
    good, idle = steady(16, 4, 4), AcceptanceEstimate()
    rows, offered = [good] * 4 + [idle] * 4, [4] * 4 + [0] * 4
    assert cost.best_length(rows, offered) == 4
    assert cost.best_length(rows, offered, remaining=[100] * 8) == 0
    assert cost.best_length(rows, offered, remaining=[100] * 4 + [10] * 4) == 4
    assert cost.best_length(rows, offered, tree=True) > 0
    assert cost.best_length(rows, offered, tree=True, remaining=[100] * 8) == 0


class PerfectFor:
    """A drafter that drafts the target's own greedy continuation for one prompt, nothing for others."""

    def __init__(self, prompt: list[int], continuation: list[int]) -> None:
        self.prompt, self.continuation = prompt, continuation

    def prepare_draft_tokens(self, requests, resource_manager):
        drafts = []
        for r in requests:
            done = len(r.token_ids) - len(self.prompt)
            mine = r.token_ids[: len(self.prompt)] == self.prompt
            drafts.append(self.continuation[done : done + r.max_draft_len] if mine else [])
        return drafts


@pytest.mark.parametrize("ignore_eos", [True, False])
def test_engine_drafts_in_a_draining_batch_only_for_its_end(tiny, ignore_eos):
    """Two requests decoded together, drafts (always right) for one of them only, a verify of 5
    tokens at 1.3 times one. Generating exactly 48 tokens each, nothing waiting for a row, the
    batch ends with the request that has no drafts: drafting for the other would only slow it, so
    the engine does not. When the end of each request is unknown (EOS may end it), each token
    counts, and it drafts. Outputs equal plain decoding either way."""
    prompts = [tiny.encode("hello world, hello"), tiny.encode("the cat sat on")]
    params = SamplingParams(max_tokens=48, ignore_eos=ignore_eos)
    plain = LLM(tiny.model, None, tokenizer=tiny.tokenizer).generate([{"prompt_token_ids": p} for p in prompts], params)
    drafter = PerfectFor(prompts[0], plain[0].token_ids)
    with LLM(tiny.model, UserProvidedDecodingConfig(drafter=drafter, max_draft_len=4), tokenizer=tiny.tokenizer) as llm:
        llm.engine.policy.forward_costs[2] = everywhere(ForwardCost([1.0, 1.3, 1.3, 1.3, 1.3]))
        llm.engine.policy.forward_costs[1] = everywhere(ForwardCost([1.0, 1.3, 1.3, 1.3, 1.3]))
        got = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    assert [g.token_ids for g in got] == [p.token_ids for p in plain]
    assert got[1].metrics.num_drafts == 0
    if ignore_eos:
        assert got[0].metrics.num_drafts == 0
    else:
        assert got[0].metrics.num_drafts > 5


def everywhere(cost: ForwardCost) -> ContextCost:
    """The same relative costs at every context (a one-second unit, so drafting time is ~free)."""
    cost = ForwardCost(cost.relative, base_seconds=1.0)
    return ContextCost((128, 1024), (cost, cost))


def test_break_even_drafting_is_not_chosen():
    """The tolerance keeps a longer draft over a slightly better shorter one, but drafting must
    beat plain decoding outright: a draft expected to lose 3% is not taken."""
    est = estimate(*[(4, 1), (4, 0), (4, 0), (4, 0)] * 4)
    gain = est.expected_tokens(4)[4]
    cost = ForwardCost([1.0, 2.0, 2.0, 2.0, gain * 1.03])
    assert gain / cost.relative[4] >= 0.95  # within the tolerance of plain decoding's rate
    assert cost.best_length([est], [4]) == 0


def test_costs_follow_the_context():
    """Measured at 128 and 1024 cached tokens, costs in between are interpolated in seconds (so
    the relative cost of a wide forward grows with the context) and extrapolated beyond."""
    short = ForwardCost([1.0, 1.1, 1.2], base_seconds=0.010)
    long = ForwardCost([1.0, 2.0, 3.0], base_seconds=0.020)
    costs = ContextCost((128, 1024), (short, long))
    assert costs.at(0).relative == pytest.approx(short.relative)
    assert costs.at(1024).relative == pytest.approx(long.relative)
    middle = costs.at(576)
    assert middle.base_seconds == pytest.approx(0.015)
    assert middle.relative[2] == pytest.approx((0.012 + 0.060) / 2 / 0.015)
    assert costs.at(1920).relative[2] > long.relative[2]


def test_costs_between_measured_batch_sizes_are_interpolated():
    """A batch of 3 between measured batches of 2 and 4 takes, at every context and width, the
    seconds halfway between theirs."""
    two = ContextCost((128, 1024), (ForwardCost([1.0, 2.0], 0.010), ForwardCost([1.0, 3.0], 0.020)))
    four = ContextCost((128, 1024), (ForwardCost([1.0, 1.5], 0.030), ForwardCost([1.0, 2.0], 0.040)))
    three = ContextCost.between((2, two), (4, four), 3)
    assert three.contexts == (128, 1024)
    assert three.costs[0].seconds == pytest.approx([0.020, 0.0325])
    assert three.costs[1].seconds == pytest.approx([0.030, 0.070])


@pytest.mark.parametrize("execution", ["auto", "static"])
def test_engine_measures_powers_of_two_and_interpolates_the_batch_sizes_between(tiny, execution):
    """An engine of up to 6 requests measures batch sizes 1, 2, 4 and 6 only: a batch of 3 needs
    2 and 4 (and borrows 1's costs until they are measured), a batch of 5 then 6. A batch of 3
    costs what 2 and 4 cost, interpolated; on the static path (CUDA's default), which pads it to
    4 rows, what 4 costs."""
    with LLM(tiny.model, {"method": "ngram", "num_speculative_tokens": 2}, tokenizer=tiny.tokenizer,
             max_batch_size=6, execution=execution) as llm:
        policy = llm.engine.policy
        assert policy.batch_sizes == [1, 2, 4, 6]
        params = SamplingParams(max_tokens=4)
        prompts = [{"prompt_token_ids": tiny.encode(f"hello {i}")} for i in range(5)]
        llm.generate(prompts[:3], params)
        assert policy.pending_measurements() == [2, 4]
        while llm.engine.idle_work():
            pass
        assert sorted(policy.forward_costs) == [1, 2, 4]
        costs = policy.forward_costs
        three = policy._costs(3)
        for c in range(2):
            padded, pair = costs[4].costs[c].seconds, zip(costs[2].costs[c].seconds, costs[4].costs[c].seconds)
            assert three.costs[c].seconds == (padded if llm.runner.static else pytest.approx([(a + b) / 2 for a, b in pair]))
        llm.generate(prompts[:5], params)
        assert policy.pending_measurements() == [6]
        llm.warmup(6)
        assert sorted(policy.forward_costs) == [1, 2, 4, 6] and not policy.pending_measurements()


def test_a_static_measurement_refills_its_rows_after_the_engine_decoded(tiny, monkeypatch):
    """On the static path the engine's batch and a measurement share the one static cache: a
    measurement interrupted by a request fills its rows again before timing its next width,
    while an eager one keeps its own cache."""
    for execution, refills in (("static", 2), ("eager", 1)):
        with LLM(tiny.model, {"method": "ngram", "num_speculative_tokens": 2}, tokenizer=tiny.tokenizer,
                 max_batch_size=2, execution=execution) as llm:
            runner, policy = llm.runner, llm.engine.policy
            prefills = []
            forward_rows = runner.forward_rows

            def counted(cache, rows, *args, **kwargs):
                if rows and len(rows[0]) >= 64:  # a measurement's context, not a width or a prompt
                    prefills.append(len(rows))
                return forward_rows(cache, rows, *args, **kwargs)

            monkeypatch.setattr(runner, "forward_rows", counted)
            policy.want(2)
            assert llm.engine.idle_work() and prefills == [2]
            llm.generate({"prompt_token_ids": tiny.encode("hello")}, SamplingParams(max_tokens=4))
            assert llm.engine.idle_work() and len(prefills) == refills
            while llm.engine.idle_work():
                pass
            assert 2 in policy.forward_costs
            monkeypatch.undo()


def test_engine_cuts_drafts_losslessly(tiny):
    """With a cost model under which drafting never pays, the engine decodes plainly (no drafts);
    with expensive short widths it verifies only long drafts; the output never changes."""
    prompt = tiny.encode("hello world, hello world, hello")
    params = SamplingParams(max_tokens=40)
    plain = LLM(tiny.model, None, tokenizer=tiny.tokenizer).generate({"prompt_token_ids": prompt}, params)[0]
    with LLM(tiny.model, {"method": "ngram", "num_speculative_tokens": 4, "adaptive_window": 64}, tokenizer=tiny.tokenizer) as llm:
        llm.engine.policy.forward_costs[1] = everywhere(ForwardCost([1.0, 50.0, 50.0, 50.0, 50.0]))
        never = llm.generate({"prompt_token_ids": prompt}, params)[0]
        assert never.token_ids == plain.token_ids and never.metrics.num_drafts == 0
        llm.engine.policy.forward_costs[1] = everywhere(ForwardCost([1.0, 3.0, 3.0, 1.0, 1.0]))
        long_only = llm.generate({"prompt_token_ids": prompt}, params)[0]
        assert long_only.token_ids == plain.token_ids and long_only.metrics.num_drafts > 0
        # Only 3- and 4-token drafts were verified: no draft ever ended at position 1 or 2.
        per_pos = long_only.metrics.num_accepted_tokens_per_pos
        assert long_only.metrics.num_draft_tokens >= 3 * long_only.metrics.num_drafts and len(per_pos) >= 3


def test_drafting_cost_counts_before_drafting():
    """A drafter costing as much per token as a target forward cannot pay for itself at 50%
    acceptance on a flat verify cost; a free one can."""
    cost = ForwardCost([1.0] * 5, base_seconds=0.01)
    half = estimate(*[(4, 4), (4, 0)] * 8)
    assert cost.best_length([half], [4], draft_cost=0.0) == 4
    assert cost.best_length([half], [4], draft_cost=1.0) == 0


def test_drafting_that_costs_per_step_keeps_longer_drafts():
    """Weighed per drafted token, a drafter costing 0.2 forwards a token drafts 2 tokens at this
    acceptance; one that drafts any length for 0.2 forwards a step (parallel drafting, whose
    policy charges its measured step cost once, as a resume's setup is charged) drafts all 4."""
    cost = ForwardCost([1.0, 1.0, 1.05, 1.1, 1.15], base_seconds=0.01)
    est = estimate(*[(4, 1), (4, 2), (4, 0), (4, 1)] * 4)
    assert cost.best_length([est], [4], draft_cost=0.2) == 2
    assert cost.best_length([est], [4], setup_cost=0.2) == 4


def test_paused_steps_fade_drafting_time_to_the_fastest_measured_not_to_zero():
    """Before a second measurement, paused steps fade the estimate toward zero (the first may have
    paid one-time setup); after it, toward the fastest measured step and never below it."""
    first_only = DraftTime(0.5)
    for _ in range(200):
        first_only.fade(16)
    assert first_only.seconds < 0.001
    measured = DraftTime(0.5)
    measured.record(0.010)
    measured.record(0.012)
    assert measured.seconds > 0.2
    for _ in range(200):
        measured.fade(16)
    assert measured.seconds == pytest.approx(0.010, rel=1e-3)
    # A first measurement faded toward zero does not drag the estimate below the fastest step.
    for _ in range(200):
        first_only.fade(16)
    first_only.record(0.012)
    assert first_only.seconds == pytest.approx(0.012)


def test_engine_pauses_a_drafter_too_slow_to_pay(tiny):
    """A drafter that sleeps 100 ms per drafted token, against a tiny target whose forwards take
    about a millisecond (a few on a machine busy with other work), is measured twice and then
    never drafts again: its fastest step stays tens of forwards, however long drafting is paused
    (fading to zero, as the engine once did, re-probed it every 60 steps or so). The output is
    unchanged."""
    class Slow:
        def prepare_draft_tokens(self, requests, resource_manager):
            time.sleep(0.1 * max(r.max_draft_len for r in requests))
            return [[r.token_ids[-1]] * r.max_draft_len for r in requests]

    prompt = {"prompt_token_ids": tiny.encode("hello world, hello")}
    params = SamplingParams(max_tokens=300, ignore_eos=True)
    plain = LLM(tiny.model, None, tokenizer=tiny.tokenizer).generate(prompt, params)[0]
    with LLM(tiny.model, UserProvidedDecodingConfig(drafter=Slow(), max_draft_len=4), tokenizer=tiny.tokenizer) as llm:
        got = llm.generate(prompt, params)[0]
    assert got.token_ids == plain.token_ids
    assert got.metrics.num_drafts == 2


def test_a_resume_counts_its_setup_over_the_runs_resumes_start():
    """Resuming after a pause counts the mean setup of recent resumes at that batch size over the
    mean length of the runs they started (the horizon counting as one run); within a run, and
    before any resume at that batch size was measured, nothing is counted."""
    resumes = ResumeCost(horizon=16)
    assert resumes.seconds_per_step(8) == 0.0
    resumes.drafted(8, 0.4)  # a resume: the rows caught up for 0.4 s
    assert resumes.seconds_per_step(8) == 0.0  # the run is under way: its setup is spent
    resumes.drafted(8, 0.0)
    resumes.paused()  # a run of 2 steps
    assert resumes.seconds_per_step(8) == pytest.approx(0.4 / ((16 + 2) / 2))
    assert resumes.seconds_per_step(4) == 0.0  # never measured at this batch size
    for _ in range(10):  # probes that end after one step each
        resumes.drafted(8, 0.2)
        resumes.paused()
    # The last 8 resumes (0.2 s each) over the last 8 runs (1 step each) and the horizon.
    assert resumes.seconds_per_step(8) == pytest.approx(0.2 / ((16 + 8) / 9))
    # At that charge (1.25 plain steps of a batch of 8 taking 0.06 s), a drafter whose first
    # draft is always right no longer resumes; without setup it drafts.
    cost = ForwardCost([1.0, 1.05, 1.1, 1.15, 1.2], base_seconds=0.06)
    good = [steady(16, 4, 1)] * 8
    assert cost.best_length(good, [4] * 8, draft_cost=0.1) > 0
    assert cost.best_length(good, [4] * 8, draft_cost=0.1, setup_cost=resumes.seconds_per_step(8) / 0.06) == 0
    assert cost.best_length(good, [4] * 8, 0.1, tree=True) > 0 and cost.best_length(good, [4] * 8, 0.1, True, 2.0) == 0


def plain_step_seconds(plain) -> float:
    """Seconds per plain decoding step of a finished request: the unit timing tests price
    delays in, so a busy machine scales them with the work they stand against."""
    return plain.metrics.time_decode / plain.metrics.num_steps


def test_engine_stops_probing_when_resumes_cost_more_than_they_return(tiny):
    """A drafter that must spend 40 plain steps' time catching up whenever drafting resumes after
    a pause (as a draft model's cache does), costs a quarter step per drafted token, and always
    drafts wrong tokens. Each probe the engine makes once its acceptance window has aged back to
    optimism pays that setup for nothing. The engine once probed 3-6 times over 300 tokens and
    drafted on 20-210 steps (it also kept lengths expected to lose to plain decoding when a
    shorter one barely won); counting a resume's setup over the short runs resumes have started,
    it resumes at most twice more after its first run. The output is unchanged.

    Costs are in units of the plain step this machine measures (verify widths included), so load
    does not change what the test asks: with a fixed 100 ms setup, a busy machine's slow plain steps made probing
    nearly free, and both engines passed or failed by chance."""

    class CatchUp(ResourceManager):
        def __init__(self):
            super().__init__()
            self.seconds = 0.0
            self.fed: dict[int, int] = {}

        def setup_seconds(self):
            return self.seconds

    prompt = {"prompt_token_ids": tiny.encode("hello world, hello")}
    params = SamplingParams(max_tokens=300, ignore_eos=True)
    plain = LLM(tiny.model, None, tokenizer=tiny.tokenizer).generate(prompt, params)[0]
    step = plain_step_seconds(plain)

    class Wrong:
        resumes = 0

        def prepare_draft_tokens(self, requests, manager):
            for r in requests:
                if manager.fed.get(r.request_id, 0) < len(r.token_ids) - 5:  # behind: a resume
                    start = time.perf_counter()
                    time.sleep(40 * step)
                    manager.seconds += time.perf_counter() - start
                    self.resumes += 1
                manager.fed[r.request_id] = len(r.token_ids)
            time.sleep(step / 4 * max(r.max_draft_len for r in requests))
            return [[(r.token_ids[-1] + 1) % tiny.model.config.vocab_size] * r.max_draft_len for r in requests]

    drafter = Wrong()
    config = UserProvidedDecodingConfig(drafter=drafter, resource_manager=CatchUp(), max_draft_len=4)
    with LLM(tiny.model, config, tokenizer=tiny.tokenizer) as llm:
        # Verify widths priced in the same unit, not measured: a loaded machine's noisy warm-up
        # once made a 5-token verify look too dear to draft at all, and nothing was probed.
        verify = ForwardCost([1.0, 1.1, 1.2, 1.3, 1.4], base_seconds=step)
        llm.engine.policy.forward_costs[1] = ContextCost((128, 1024), (verify, verify))
        got = llm.generate(prompt, params)[0]
    assert got.token_ids == plain.token_ids
    assert 1 <= drafter.resumes <= 3 and got.metrics.num_drafts <= 15


def test_step_times_correct_the_warmup_costs_by_draft_count():
    """Steps that take longer than the warm-up said scale that width's cost by the median of its
    recent ratios, a count starting from two of the ratio the counts run so far give it (1, the
    warm-up's, at first): one disturbed step changes nothing, two agreeing ones do, and each draft
    count's first step (one-time setup) is left out. A draft
    count not yet run is interpolated between measured ones (plain steps' overhead reaches every
    width), so measured wide steps make every draft length dearer."""
    warmup = ForwardCost([1.0, 1.0, 1.0, 1.0, 1.1], base_seconds=0.010)
    times = StepTime()
    assert times.correct(warmup).seconds == pytest.approx(warmup.seconds)
    times.record(0, 1.0, 0.010)  # the first plain step: setup, left out
    assert times.correct(warmup).seconds == pytest.approx(warmup.seconds)
    times.record(0, 0.012, 0.010)  # plain steps cost 20% more than bare forwards
    assert times.ratio(0) == 1.0
    times.record(0, 0.012, 0.010)
    assert times.ratio(0) == pytest.approx(1.1)  # median of 1, 1, 1.2, 1.2
    times.record(0, 0.012, 0.010)
    assert times.correct(warmup).relative == pytest.approx(warmup.relative)
    assert times.correct(warmup).base_seconds == pytest.approx(0.012)
    for _ in range(3):
        times.record(4, 0.036, 0.011)  # a 4-draft step really costs 3x the warm-up's figure
    assert times.ratio(4) == pytest.approx((1.2 + 36 / 11) / 2)  # started from plain steps' 1.2
    for _ in range(10):
        times.record(4, 0.036, 0.011)
    assert times.ratio(4) == pytest.approx(36 / 11)  # the warm-up has left the window
    assert times.ratio(2) == pytest.approx((1.2 + 36 / 11) / 2)  # between plain and 4 drafts
    corrected = times.correct(warmup)
    assert corrected.relative[4] == pytest.approx(0.036 / 0.012)
    sure = steady(16, 4, 4)
    assert warmup.best_length([sure], [4]) == 4
    # Near-full acceptance: 4 drafts give about 4.6 tokens for 3 units, 3 give 3.75 for 2.3.
    assert corrected.relative[3] == pytest.approx(0.010 * (1.2 + 3 * (36 / 11 - 1.2) / 4) / 0.012)
    assert corrected.best_length([sure], [4]) == 3


def test_stale_plain_ratios_do_not_make_drafting_look_cheap():
    """The machine slows down by a quarter while the engine runs plain steps, then speeds up again
    while it drafts 2 tokens a step for many steps. Weighing the drafting steps' fresh ratios
    against the plain steps' old, slow ones would make a 2-draft step look cheaper than it is, and the
    policy would go on drafting without ever renewing them. Once plain steps have not run for
    STEP_TIME_STALE steps, they cost what the warm-up measured again."""
    warmup = ForwardCost([1.0, 1.2, 1.6], base_seconds=0.010)
    times = StepTime()
    times.record(0, 1.0, 0.010)  # setup, left out
    for _ in range(9):
        times.record(0, 0.0125, 0.010)  # a slow moment: plain steps take 1.25 times the warm-up's
    times.record(2, 1.0, 0.014)  # setup, left out
    for _ in range(STEP_TIME_STALE - 1):
        times.record(2, 0.016, 0.016)  # fast again: 2-draft steps take what the warm-up said
    assert times.correct(warmup).relative[2] == pytest.approx(0.016 / 0.0125)  # drafting looks cheap
    times.record(2, 0.016, 0.016)
    assert times.correct(warmup).relative == pytest.approx(warmup.relative)


class DriftingRunner:
    """A stand-in runner whose ``width``-token forward takes ``(1 + width / 10)`` units on a fake
    clock, a unit ``slowdown`` times longer after every forward: a machine drifting while the
    widths are timed one after another."""

    max_length, static = 4096, False

    def __init__(self, slowdown: float) -> None:
        self.now, self.unit, self.slowdown = 0.0, 0.010, slowdown

    def clock(self) -> float:
        return self.now

    def new_batch_cache(self, rows: int) -> object:
        return object()

    def forward(self, cache: object, tokens: list[int]) -> None:
        self.now += self.unit * (0.9 + len(tokens) / 10)
        self.unit *= self.slowdown

    def forward_rows(self, cache: object, rows: list[list[int]]) -> None:
        self.forward(cache, rows[0])

    def rollback(self, cache: object, width: int) -> None:
        pass


def test_measured_costs_hold_while_the_machine_drifts(monkeypatch):
    """Each width is timed against one-token forwards beside it: on a machine slowing down by 3%
    a forward (a third slower by the time the short context's widths are done), the measured
    curve is the true one within the drift of one forward, and the base is the fastest one-token
    forward. Timing each width alone made every width dearer than the one-token forward timed
    first by all the drift since (a 2-token forward 1.3 times a one-token one, not 1.1)."""
    runner = DriftingRunner(slowdown=1.03)
    monkeypatch.setattr(time, "perf_counter", runner.clock)
    measurement = CostMeasurement(runner, max_width=8)
    while measurement.step():
        pass
    short = measurement.result().costs[0]
    truth = [(0.9 + w / 10) for w in range(1, 9)]
    assert short.relative == pytest.approx([t / truth[0] for t in truth], rel=0.035)
    assert short.base_seconds == pytest.approx(0.010 * 1.03**2)  # the first timed: after the prefill and a setup forward


def test_stale_cheap_drafting_ratios_do_not_undercut_fresh_plain_ones():
    """The mirror case: 10-draft steps ran while the machine was fast, then the engine ran plain
    steps for long while it slowed down by 70% (Medusa on translation). The 10-draft steps' old
    ratios would make them look no dearer than a plain step now, and the policy would verify 10
    drafts for a few hundredths of a token. Once stale, they count at least plain steps' fresh
    ratio; a stale dear ratio stays as it is (so a count known to lose is not probed again while
    the engine drafts at all; see the next test)."""
    warmup = ForwardCost([1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9, 1.45], base_seconds=0.040)
    times = StepTime()
    times.record(10, 1.0, 0.058)  # setup, left out
    for _ in range(5):
        times.record(10, 0.058, 0.058)  # fast: what the warm-up said
    times.record(3, 1.0, 0.052)  # setup, left out
    for _ in range(5):
        times.record(3, 0.13, 0.052)  # dear: 2.5 times what the warm-up said
    times.record(0, 1.0, 0.040)  # setup, left out
    for _ in range(STEP_TIME_STALE - 7):  # 18 steps since the last 10-draft one
        times.record(0, 0.068, 0.040)  # slow now: plain steps take 1.7 times the warm-up's
    assert times.correct(warmup).relative[10] == pytest.approx(1.0)  # still fresh: no dearer than plain
    times.record(0, 0.068, 0.040)
    corrected = times.correct(warmup)
    assert corrected.relative[10] == pytest.approx(1.45)
    assert corrected.relative[3] == pytest.approx(1.3 * 2.5 / 1.7)


def test_dear_ratios_are_forgotten_once_nothing_has_drafted_for_long():
    """4-draft steps measured at three times the warm-up's figure (a busy moment) pause drafting.
    They keep it paused for ``STEP_TIME_FORGET`` plain steps, then are forgotten: the next
    4-draft step costs what plain steps do until it has shown otherwise, within three steps."""
    warmup = ForwardCost([1.0, 1.0, 1.0, 1.0, 1.1], base_seconds=0.010)
    times = StepTime()
    times.record(4, 1.0, 0.011)  # setup, left out
    for _ in range(5):
        times.record(4, 0.033, 0.011)
    for _ in range(STEP_TIME_FORGET):
        times.record(0, 0.010, 0.010)
    assert times.correct(warmup).relative[4] == pytest.approx(3.3)  # still dear
    times.record(0, 0.010, 0.010)
    assert times.correct(warmup).relative[4] == pytest.approx(1.1)  # forgotten: what the warm-up said
    times.record(4, 0.033, 0.011)  # the probe finds it dear again
    times.record(4, 0.033, 0.011)
    assert times.ratio(4) == pytest.approx(2.0)
    times.record(4, 0.033, 0.011)
    assert times.ratio(4) == pytest.approx(3.0)


def _oracle_on_a_busy_machine(tiny, max_tokens, busy):
    """Plain greedy output, and a run of an always-right drafter (4 drafts) whose verify forwards
    (wider than one token, not the prompt's prefill) take 20 plain steps more where
    ``busy(token_ids)`` says the machine is busy."""
    prompt = {"prompt_token_ids": tiny.encode("hello world, hello")}
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    plain = LLM(tiny.model, None, tokenizer=tiny.tokenizer).generate(prompt, params)[0]
    prompt_len = len(prompt["prompt_token_ids"])
    step = plain_step_seconds(plain)

    class Oracle:
        def prepare_draft_tokens(self, requests, resource_manager):
            return [plain.token_ids[len(r.token_ids) - prompt_len :][: r.max_draft_len] for r in requests]

    with LLM(tiny.model, UserProvidedDecodingConfig(drafter=Oracle(), max_draft_len=4), tokenizer=tiny.tokenizer) as llm:
        llm.warmup()
        runner = llm.engine.runner
        forward = runner.forward

        def slow_when_busy(cache, token_ids, *args, **kwargs):
            if busy(token_ids):
                time.sleep(20 * step)
            return forward(cache, token_ids, *args, **kwargs)

        runner.forward = slow_when_busy
        return plain, llm.generate(prompt, params)[0]


def test_engine_drafts_again_once_a_busy_moment_has_passed(tiny):
    """The target's verify forwards take 20 plain steps more while the machine is busy, which it
    is until the engine stops drafting (within a few steps, as it should). The engine drafts again
    once ``STEP_TIME_FORGET`` steps have passed without drafting, instead of decoding plainly to
    the end; the output is unchanged."""
    state = {"busy": True, "verified": 0}

    def busy(token_ids):
        verify = 1 < len(token_ids) < 16  # not the prompt's prefill
        if verify and state["busy"]:
            state["verified"] += 1
        elif len(token_ids) == 1 and state["verified"]:  # a plain step: drafting has paused
            state["busy"] = False
        return verify and state["busy"]

    plain, got = _oracle_on_a_busy_machine(tiny, 400, busy)
    assert got.token_ids == plain.token_ids
    assert not state["busy"] and state["verified"] <= 5
    # The busy drafting steps emit at most 25 tokens and the pause about STEP_TIME_FORGET more:
    # the rest, over 200 tokens, comes from drafting steps again (the oracle is always right).
    assert got.metrics.num_steps < 400 - 200 + 200 / 5 + 10


def test_engine_learns_that_wide_steps_cost_more_than_warmup_said(tiny):
    """A drafter that always drafts the right tokens, against a target whose forwards wider than
    one token take 20 plain steps more once warm-up is done (a machine that got busy, or a
    verify path the warm-up never ran): the warm-up's flat costs say every step should draft 4,
    so an engine going by them alone drafts on every step to the end. Learning each step's real
    time, it stops within a few steps, and the output is unchanged. (The delay is in plain steps
    measured on this machine: a fixed 40 ms made drafting really pay once load had slowed the
    tiny target's plain step to 10 ms, and the test flaked.)"""
    plain, got = _oracle_on_a_busy_machine(tiny, 200, lambda token_ids: 1 < len(token_ids) < 16)
    assert got.token_ids == plain.token_ids
    assert 1 <= got.metrics.num_drafts <= 8


def test_a_new_request_starts_from_the_methods_recent_acceptance():
    """A request without evidence of its own takes the engine-wide estimate as its prior: after
    many rejections across requests, a newcomer does not start optimistic; its own evidence
    then moves it."""
    engine_wide = estimate(*[(4, 0)] * 40, window=64)
    newcomer = AcceptanceEstimate(16, prior=engine_wide)
    assert newcomer.alpha(0) == pytest.approx(engine_wide.alpha(0)) and newcomer.alpha(0) < 0.1
    for _ in range(4):
        newcomer.update(4, 4)
    assert newcomer.alpha(0) > 0.6


def test_a_sampled_drafts_own_length_never_decides_its_cut(tiny):
    """A draft model that stops after a token it was unsure of offers a length that depends on
    what it sampled. Cutting by that length (here: a 1-token draft is not worth its forward, a
    4-token one is) would verify a first draft only when it was a confident one, which rejection
    sampling does not correct for. So a sampled proposal is cut as if it offered its budget,
    while a deterministic one (n-gram) or a greedy request's is still cut by its real length."""
    with LLM(tiny.model, {"method": "ngram", "num_speculative_tokens": 4}, tokenizer=tiny.tokenizer) as llm:
        policy, vocab = llm.engine.policy, llm.engine.runner.vocab_size
        cost = ForwardCost([1.0, 1.9, 2.2, 1.2, 1.3], base_seconds=1.0)
        half = estimate(*[(4, 4), (4, 0)] * 8)
        assert cost.best_length([half], [1]) == 0 < cost.best_length([half], [4])

        def cut(params: SamplingParams, probs: torch.Tensor | None) -> int:
            request = llm.engine.new_request([1, 2, 3], params)
            request.acceptance, request.max_draft_len = half, 4
            plan = StepBudget([4], rows=1, cost=cost)
            (kept,) = policy.drafted(plan, [request], [DraftProposal([5], probs)], 0.0, 0.0)
            return len(kept)

        q = torch.full((1, vocab), 1.0 / vocab)
        assert cut(SamplingParams(temperature=1.0), q) == 1
        assert cut(SamplingParams(temperature=1.0), None) == 0
        assert cut(SamplingParams(temperature=0.0), q) == 0


def test_trees_are_cut_by_what_the_batch_really_offered(tiny):
    """Trees are budgeted before drafting, as if every row will offer its budget. A suffix tree
    or a lookahead pool often offers less, or nothing: here one row of four offers a 2-node tree
    the others have no drafts for, and the wider forward every row pays for (1.4 plain forwards
    for 3 tokens a row) is not worth its expected gain, so the trees are dropped; when all four
    offer theirs, they are verified. A batch mixing trees and chains keeps what it was offered."""
    with LLM(tiny.model, {"method": "ngram", "num_speculative_tokens": 4}, tokenizer=tiny.tokenizer) as llm:
        policy = llm.engine.policy
        cost = ForwardCost([1.0, 1.2, 1.4, 1.5, 1.6], base_seconds=1.0)
        half = trees(*[(2, {0, 1}), (2, set())] * 8)
        requests = []
        for _ in range(4):
            request = llm.engine.new_request([1, 2, 3], SamplingParams(temperature=0.0))
            request.acceptance, request.max_draft_len = half, 4
            requests.append(request)
        plan = StepBudget([4] * 4, rows=4, cost=cost)
        tree = DraftProposal([5, 6], parents=[-1, 0])

        def kept(proposals: list[DraftProposal]) -> list[int]:
            return [len(p) for p in policy.drafted(plan, requests, proposals, 0.0, 0.0)]

        assert kept([tree, DraftProposal(), DraftProposal(), DraftProposal()]) == [0, 0, 0, 0]
        assert kept([tree] * 4) == [2] * 4
        assert kept([tree, DraftProposal([5, 6]), DraftProposal(), DraftProposal()]) == [2, 2, 0, 0]


def test_forward_costs_time_every_narrow_width_and_a_geometric_few_beyond() -> None:
    """Widths up to 8 are all timed, then each at least a quarter wider than the last, then the
    widest; the widths between are linear between their measured neighbours."""
    assert measured_widths(3) == [1, 2, 3]
    assert measured_widths(25) == [1, 2, 3, 4, 5, 6, 7, 8, 10, 13, 17, 22, 25]
    assert measured_widths(9) == [*range(1, 10)]
    seconds = _interpolated({1: 1.0, 2: 2.0, 5: 5.0, 8: 2.0}, 8)
    assert seconds == pytest.approx([1.0, 2.0, 3.0, 4.0, 5.0, 4.0, 3.0, 2.0])


def test_suffix_drafts_are_cut_by_their_own_acceptance_not_the_methods(tiny):
    """With ``use_sa_spec``, a suffix draft may run past the method's ``max_draft_len`` and is cut
    by the acceptance suffix drafts have had: a request whose method drafts badly still verifies
    a 10-token copy that has been paying, and one whose copies have failed hands the step back
    to its method (``None``). What a suffix step teaches goes to the suffix estimate alone."""
    config = {"method": "ngram", "num_speculative_tokens": 2, "use_sa_spec": True}
    with LLM(tiny.model, config, tokenizer=tiny.tokenizer) as llm:
        policy = llm.engine.policy
        cost = ForwardCost([1.0] + [1.3] * 24, base_seconds=1.0)
        request = llm.engine.new_request([1, 2, 3], SamplingParams(temperature=0.0))
        request.acceptance = steady(16, 2, 0)
        copy = DraftProposal(list(range(5, 15)))

        def cut(suffix_estimate: AcceptanceEstimate) -> tuple[DraftProposal | None, set[int]]:
            request.suffix_acceptance = suffix_estimate
            plan = StepBudget([2], rows=1, cost=cost, suffix_budgets=[24])
            (kept,) = policy.suffix_drafted(plan, [request], [copy])
            return kept, plan.suffix_rows

        kept, rows = cut(steady(16, 10, 10))
        assert len(kept) == 10 and rows == {request.request_id}
        assert cut(steady(16, 10, 0)) == (None, set())

        plan = StepBudget([0], rows=1, suffix_budgets=[24], suffix_rows={request.request_id})
        before = request.acceptance.alpha(0)
        policy.observe(plan, [request], [copy], [VerifyResult(num_accepted=0, next_token=1)], 0.01)
        assert request.acceptance.alpha(0) == before
        assert request.suffix_acceptance.alpha(0) < 0.1


@pytest.mark.parametrize("tree_spec", [True, False])
def test_a_suffix_tree_budget_counts_nodes(tiny, tree_spec):
    """Suffix decoding's tree may be as deep as it is wide (``max_draft_tokens == max_draft_len``),
    yet its budget is a node count: the policy prices it by each node's acceptance, as it does
    other trees, and a chain (``suffix_decoding_tree_spec: false``) by each position's. Here the
    two estimates give different budgets."""
    config = {"method": "suffix", "suffix_decoding_tree_spec": tree_spec}
    with LLM(tiny.model, config, tokenizer=tiny.tokenizer) as llm:
        policy = llm.engine.policy
        cost = ForwardCost([1.0 + 0.03 * width for width in range(25)], base_seconds=1.0)
        policy._costs = lambda rows: SimpleNamespace(at=lambda context: cost)  # the same costs at every context
        request = llm.engine.new_request([1, 2, 3], SamplingParams(temperature=0.0))
        request.acceptance = AcceptanceEstimate(16)
        for step in range(16):
            if step % 8:  # a branching tree: node 0 accepted, nodes 1-4 its siblings or theirs
                request.acceptance.update(2, 1, (5, frozenset({0})))
            else:  # a copy: a chain of 12, all accepted
                request.acceptance.update(12, 12, (12, frozenset(range(12))))
        as_chain, as_tree = (cost.best_length([request.acceptance], [24], tree=tree) for tree in (False, True))
        assert as_chain < as_tree
        assert policy.plan([request], 10, [100]).budgets == [as_tree if tree_spec else as_chain]


@pytest.mark.parametrize(("method_lands", "suffix_lands", "taken"), [
    (2, 10, True),   # a copy that lands in full beats a method that lands its 2 tokens
    (2, 1, False),   # a copy that lands 1 token a step gives way to that method
    (0, 1, True),    # ... but not to a method that never lands (paused: plain decoding)
])
def test_a_suffix_draft_replaces_the_methods_only_when_expected_to_gain_more(tiny, method_lands, suffix_lands, taken):
    """A suffix draft that pays against plain decoding still gives way to its request's method
    when the method's draft at its planned budget is expected to progress faster per unit of
    cost: the choice is between the two drafts, not between a copy and nothing."""
    config = {"method": "ngram", "num_speculative_tokens": 2, "use_sa_spec": True}
    with LLM(tiny.model, config, tokenizer=tiny.tokenizer) as llm:
        policy = llm.engine.policy
        cost = ForwardCost([1.0] + [1.3] * 24, base_seconds=1.0)
        policy._costs = lambda rows: SimpleNamespace(at=lambda context: cost)  # the same costs at every context
        request = llm.engine.new_request([1, 2, 3], SamplingParams(temperature=0.0))
        request.acceptance = steady(16, 2, method_lands)
        request.suffix_acceptance = steady(16, 10, suffix_lands)
        plan = policy.plan([request], 10, [100])
        assert plan.budgets == ([2] if method_lands else [0])
        (kept,) = policy.suffix_drafted(plan, [request], [DraftProposal(list(range(5, 15)))])
        assert (kept is not None) == taken and (plan.suffix_rows == {request.request_id}) == taken


def test_over_a_tree_method_a_suffix_draft_need_only_beat_plain_decoding(tiny):
    """A tree's verify costs more than the chain forwards the policy's costs were measured on, so
    a tree method's expected rate is not set against a suffix chain's: over lookahead (a tree
    method) a suffix draft that pays against plain decoding is taken, whatever the method's
    own acceptance."""
    config = {"method": "lookahead", "use_sa_spec": True}
    with LLM(tiny.model, config, tokenizer=tiny.tokenizer) as llm:
        policy = llm.engine.policy
        cost = ForwardCost([1.0] + [1.3] * 40, base_seconds=1.0)
        policy._costs = lambda rows: SimpleNamespace(at=lambda context: cost)  # the same costs at every context
        request = llm.engine.new_request([1, 2, 3], SamplingParams(temperature=0.0))
        request.acceptance = steady(16, 2, 2)
        request.suffix_acceptance = steady(16, 10, 1)
        plan = policy.plan([request], 10, [100])
        assert plan.method_rates == {} and any(plan.budgets)
        (kept,) = policy.suffix_drafted(plan, [request], [DraftProposal(list(range(5, 15)))])
        assert kept is not None and plan.suffix_rows == {request.request_id}


@pytest.mark.parametrize("adaptive", [False, True])
def test_suffix_drafts_run_past_the_methods_length_losslessly(tiny, adaptive):
    """Over a method drafting 2 tokens that are never right, suffix drafts of the tiny target's
    repetitive output are verified and accepted beyond position 2 (up to ``sa_spec_max_draft_len``),
    and the output is plain greedy decoding's, with the adaptive length fixed or on."""
    prompt = {"prompt_token_ids": tiny.encode("hello world, hello world, hello")}
    params = SamplingParams(max_tokens=80, ignore_eos=True)
    plain = LLM(tiny.model, None, tokenizer=tiny.tokenizer).generate(prompt, params)[0]
    config = UserProvidedDecodingConfig(drafter=PadDrafter(), max_draft_len=2, use_sa_spec=True, sa_spec_threshold=2,
                                        sa_spec_max_draft_len=12, adaptive_draft_len=adaptive)
    with LLM(tiny.model, config, tokenizer=tiny.tokenizer) as llm:
        got = llm.generate(prompt, params)[0]
        taken = llm.engine.suffix_drafts.taken
    assert got.token_ids == plain.token_ids
    per_pos = got.metrics.num_accepted_tokens_per_pos
    assert taken > 0 and len(per_pos) > 2 and per_pos[2] > 0, per_pos
    assert len(per_pos) <= 12
