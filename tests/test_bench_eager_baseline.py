"""`specdec bench --baseline eager`: plain decoding on eager forwards beside the captured modes,
timed in the same interleaved run, so the table shows what capture alone gains.

On the CPU the captured modes are stood in for by the static path (``execution="static"``), which
runs the same bucketed forwards without recording them.
"""

from __future__ import annotations

from specdec import LLM, SamplingParams
from specdec.bench.dataset import Question
from specdec.bench.report import summarize, summary_table
from specdec.bench.runner import EAGER, PLAIN, run_batched_benchmark, run_benchmark

QUESTIONS = [Question("1", "a", ["hello world, hello"]), Question("2", "b", ["abc abc ab"])]


def _llms(tiny, batch_size: int) -> tuple[LLM, LLM, LLM]:
    plain = LLM(tiny.model, None, tokenizer=tiny.tokenizer, execution="static", max_batch_size=batch_size)
    spec = LLM(tiny.model, {"decoding_type": "NGram", "max_draft_len": 3}, tokenizer=tiny.tokenizer, execution="static",
               max_batch_size=batch_size)
    eager = LLM(tiny.model, None, tokenizer=tiny.tokenizer, execution="eager", max_batch_size=batch_size)
    return plain, spec, eager


def test_eager_baseline_runs_beside_plain_and_spec(tiny):
    plain, spec, eager = _llms(tiny, 1)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    results = run_benchmark(plain, spec, None, QUESTIONS, params, 1, eager=eager)
    # The eager forwards decode the very tokens the static ones do.
    assert all(r.runs[EAGER].tokens == r.runs[PLAIN].tokens for r in results)
    overall = summarize(results, greedy=True)["overall"]
    assert overall["eager_tokens_per_second"] > 0 and overall["eager_speedup"] > 0
    assert overall["speedup_vs_eager"] == overall["tokens_per_second"] / overall["eager_tokens_per_second"]
    assert "vs eager plain" in [c.header for c in summary_table(summarize(results, True), "t").columns]


def test_eager_baseline_in_batches(tiny):
    plain, spec, eager = _llms(tiny, 2)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    results = run_batched_benchmark(plain, spec, QUESTIONS, params, 1, 2, eager=eager)
    assert all(r.runs[EAGER].tokens == r.runs[PLAIN].tokens for r in results)
    assert summarize(results, greedy=True)["overall"]["speedup_vs_eager"] > 0
