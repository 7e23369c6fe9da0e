"""`specdec bench`'s cost breakdown: where a speculative step's time goes against a plain step.

The parts must add up to the measured decode time, the what-if speedups must be ordered (free
drafting can only help, free bookkeeping too), and the forward costs must cover every verify width.
"""

from __future__ import annotations

import math

import pytest

from specdec import LLM, SamplingParams
from specdec.bench.costs import cost_breakdown, forward_cost_table, plot_costs, policy_summary, step_table
from specdec.bench.dataset import Question
from specdec.bench.runner import PLAIN, SPEC, run_benchmark
from specdec.metrics import aggregate

QUESTIONS = [Question("1", "a", ["hello world, hello"]), Question("2", "b", ["abc abc ab abc abc ab"])]


@pytest.fixture(scope="module")
def breakdown(request):
    tiny = request.getfixturevalue("tiny")
    plain = LLM(tiny.model, None, tokenizer=tiny.tokenizer)
    # A fixed draft length: the adaptive one may stop drafting on a busy machine.
    spec = LLM(tiny.model, {"decoding_type": "NGram", "max_draft_len": 3, "adaptive_draft_len": False},
               tokenizer=tiny.tokenizer)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    results = run_benchmark(plain, spec, None, QUESTIONS, params, 1)
    return spec, results, cost_breakdown(spec, results, 1)


def test_parts_add_up_to_the_measured_decode_time(breakdown):
    _, results, costs = breakdown
    overall = costs["steps"]["overall"]
    spec = aggregate(r.runs[SPEC].metrics for r in results)
    plain = aggregate(r.runs[PLAIN].metrics for r in results)
    parts = overall["spec_ms_per_step"]
    assert math.isclose(sum(parts.values()) * spec.num_steps, 1e3 * spec.time_decode, rel_tol=1e-9)
    assert math.isclose(sum(overall["plain_ms_per_step"].values()) * plain.num_steps, 1e3 * plain.time_decode, rel_tol=1e-9)
    assert overall["tokens_per_step"] == (spec.num_steps + spec.num_accepted_tokens) / spec.num_steps
    # Drafting per drafted token, in milliseconds and in plain one-token forwards.
    assert math.isclose(overall["draft_ms_per_drafted_token"], 1e3 * spec.time_draft / spec.num_draft_tokens)
    assert math.isclose(overall["draft_forwards_per_drafted_token"],
                        spec.time_draft / spec.num_draft_tokens / (plain.time_forward / plain.num_steps))
    assert set(costs["steps"]) == {"a", "b", "overall"}


def test_what_if_speedups_only_grow_as_parts_become_free(breakdown):
    _, _, costs = breakdown
    for s in costs["steps"].values():
        assert 0 < s["decode_speedup"] <= s["speedup_at_zero_draft_cost"] <= s["speedup_forwards_only"]


def test_forward_costs_cover_every_verify_width(breakdown, tmp_path):
    spec, _, costs = breakdown
    forward = costs["forward_cost"]
    widest = spec.speculative_config.max_draft_tokens + 1
    assert len(forward["contexts"]) == 2 and forward["contexts"][0] < forward["contexts"][1]
    for relative in forward["relative"]:
        assert len(relative) == widest and relative[0] == 1.0 and min(relative) >= 1.0
    assert all(seconds > 0 for seconds in forward["one_token_seconds"])
    # Tables and the plot render from the same dict the JSON holds.
    assert len(forward_cost_table(costs, "ngram").rows) == widest
    assert len(step_table(costs, "ngram").rows) == 3
    plot_costs(costs, tmp_path / "costs.png", "ngram")
    assert (tmp_path / "costs.png").stat().st_size > 0


@pytest.mark.parametrize("batch_size", [1, 2])
def test_a_repeated_turn_is_not_drafted_from_its_own_earlier_answer(tiny, monkeypatch, batch_size):
    """With ``--repeats``, the speculative engine forgets its finished requests before each repeat
    (suffix decoding would otherwise copy the answer it gave the same prompt a moment ago), and
    only then: the first round drafts from the outputs of earlier turns as a user's requests would."""
    from specdec.bench.runner import run_batched_benchmark

    plain = LLM(tiny.model, None, tokenizer=tiny.tokenizer, max_batch_size=batch_size)
    spec = LLM(tiny.model, {"method": "suffix"}, tokenizer=tiny.tokenizer, max_batch_size=batch_size)
    cached_before = []
    forget = spec.engine.forget_finished

    def recording() -> None:
        cached_before.append(spec.engine.resource_manager.cache.num_cached_requests)
        forget()
        assert spec.engine.resource_manager.cache.num_cached_requests == 0

    monkeypatch.setattr(spec.engine, "forget_finished", recording)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    if batch_size == 1:
        run_benchmark(plain, spec, None, QUESTIONS, params, 1, repeats=3)
    else:
        run_batched_benchmark(plain, spec, QUESTIONS, params, 1, batch_size, repeats=3)
    # Each question has a category of its own, so each runs alone in batches too: two repeats each.
    assert len(cached_before) == 2 * len(QUESTIONS) and all(n > 0 for n in cached_before)


def test_the_adaptive_policy_says_what_it_learnt(tiny):
    """With the adaptive length on, the breakdown carries what the policy learnt by the end (its
    drafter's time per drafted token, step-time ratios, acceptance by position) and the bench
    prints it in one line; with a fixed length there is nothing to say."""
    plain = LLM(tiny.model, None, tokenizer=tiny.tokenizer)
    spec = LLM(tiny.model, {"decoding_type": "NGram", "max_draft_len": 3}, tokenizer=tiny.tokenizer)
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    results = run_benchmark(plain, spec, None, QUESTIONS, params, 1)
    costs = cost_breakdown(spec, results, 1)
    state = costs["policy"]
    policy = spec.engine.policy
    assert state["batch_size"] == 1 and len(state["acceptance_by_position"]) == 3
    assert state["acceptance_by_position"] == [policy.acceptance.alpha(i) for i in range(3)]
    drafted = aggregate(r.runs[SPEC].metrics for r in results).num_drafts
    line = policy_summary(costs)
    assert line.startswith("policy at the end (batch 1): ") and "acceptance by position" in line
    if drafted:
        assert state["draft_seconds_per_token"]["average"] == policy.draft_time[1].seconds
        assert "ms per drafted token" in line
    else:
        assert state["draft_seconds_per_token"] is None and "no drafting step measured" in line
    assert state["step_time_ratio_by_drafts"] == policy.step_times[1].medians()


def test_a_fixed_draft_length_has_no_policy_to_report(breakdown):
    _, _, costs = breakdown
    assert "policy" not in costs and policy_summary(costs) is None
