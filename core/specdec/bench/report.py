"""Summaries of a benchmark: per category and overall, as a table, JSON and a PNG plot."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rich.table import Table

from specdec.bench.interval import TimedPair, speedup_interval
from specdec.bench.runner import EAGER, HF, HF_STATIC, PLAIN, SPEC, TurnResult

#: Optional baselines, each timed beside plain and speculative decoding, and its table heading.
BASELINE_MODES = {HF: "hf", HF_STATIC: "hf static", EAGER: "eager plain"}
from specdec.metrics import aggregate, format_rates_per_pos


def _throughput(results: list[TurnResult], mode: str) -> float:
    tokens = sum(len(r.runs[mode].tokens) for r in results)
    seconds = sum(r.runs[mode].seconds for r in results)
    return tokens / seconds if seconds else 0.0


def _timed_pairs(results: list[TurnResult], mode: str) -> list[TimedPair]:
    """One pair per timed run (a turn, or a batch, in one round) of ``mode`` against plain decoding."""
    runs: dict[tuple, list[TurnResult]] = {}
    for r in results:
        runs.setdefault(r.timing, []).append(r)
    return [
        TimedPair(
            sum(len(r.runs[mode].tokens) for r in group), sum(r.runs[mode].seconds for r in group),
            sum(len(r.runs[PLAIN].tokens) for r in group), sum(r.runs[PLAIN].seconds for r in group),
        )
        for group in runs.values()
    ]


def summarize_group(results: list[TurnResult], greedy: bool) -> dict[str, Any]:
    """Spec-Bench's speedup (throughput ratio over the group), its bootstrap interval over the
    group's timed runs, and vLLM's acceptance metrics."""
    plain, spec = _throughput(results, PLAIN), _throughput(results, SPEC)
    m = aggregate(r.runs[SPEC].metrics for r in results)
    pairs = _timed_pairs(results, SPEC)
    interval = speedup_interval(pairs)
    summary: dict[str, Any] = {
        "num_turns": len({(r.question_id, r.turn) for r in results}),
        "num_rounds": len(results),
        "num_timed_runs": len(pairs),
        "speedup": spec / plain if plain else None,
        "speedup_ci95": list(interval) if interval else None,
        "tokens_per_second": spec,
        "plain_tokens_per_second": plain,
        # Spec-Bench: tokens per target forward in decoding (accepted drafts + 1 per step).
        "mean_accepted_tokens": (m.num_steps + m.num_accepted_tokens) / m.num_steps if m.num_steps else 1.0,
        # vLLM: 1 + accepted / drafts, over steps that drafted.
        "mean_acceptance_length": m.mean_acceptance_length,
        "acceptance_rate": m.acceptance_rate,
        # Accepted tokens that a rule which is not lossless kept (0 for a lossless method).
        "num_lossy_accepted_tokens": m.num_lossy_accepted_tokens,
        # vLLM: the share of drafting steps that accepted a token at draft position i (tree: depth i + 1).
        "acceptance_rate_per_pos": m.acceptance_rate_per_pos,
        "overhead_fraction": m.time_overhead / m.time_decode if m.time_decode else 0.0,
        # The method's time to prefill a prompt, and the prompt tokens the prefix cache gave it, per run.
        "prefill_seconds": m.time_prefill / len(results) if results else 0.0,
        "cached_prompt_tokens": m.num_cached_tokens / len(results) if results else 0.0,
        "outputs_match": (
            sum(r.runs[SPEC].tokens == r.runs[PLAIN].tokens for r in results) / len(results) if greedy else None
        ),
    }
    for mode in BASELINE_MODES:
        if results and mode in results[0].runs:
            other = _throughput(results, mode)
            summary[f"{mode}_tokens_per_second"] = other
            summary[f"speedup_vs_{mode}"] = spec / other if other else None
            # The baseline against plain decoding; for eager, what captured forwards alone give plain decoding.
            summary[f"{mode}_speedup"] = other / plain if plain else None
    return summary


def summarize(results: list[TurnResult], greedy: bool) -> dict[str, dict[str, Any]]:
    categories = sorted({r.category for r in results})
    out = {c: summarize_group([r for r in results if r.category == c], greedy) for c in categories}
    out["overall"] = summarize_group(results, greedy)
    return out


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def summary_table(summary: dict[str, dict[str, Any]], title: str) -> Table:
    baselines = [mode for mode in BASELINE_MODES if f"speedup_vs_{mode}" in summary["overall"]]
    has_lossy = summary["overall"]["num_lossy_accepted_tokens"] > 0
    # With prefix caching reusing prompts (repeated rounds, later turns), what it saved shows.
    has_cached = summary["overall"].get("cached_prompt_tokens", 0) > 0
    table = Table(title=title)
    columns = [f"vs {BASELINE_MODES[mode]}" for mode in baselines]
    for col in ["category", "turns", "speedup", "95% interval", *columns,
                "tok/s", "mean acc. tokens", "accept rate", *(["lossy acc."] if has_lossy else []), "by position",
                "outputs match", "overhead", *(["prefill", "cached"] if has_cached else [])]:
        table.add_column(col, justify="left" if col == "category" else "right")
    for cat, s in summary.items():
        interval = s["speedup_ci95"]
        row = [cat, str(s["num_turns"]), _fmt(s["speedup"], ".2f") + "x",
               f"{interval[0]:.2f}-{interval[1]:.2f}x" if interval else "-"]
        for mode in baselines:
            row.append(_fmt(s.get(f"speedup_vs_{mode}"), ".2f") + "x")
        match = s["outputs_match"]
        row += [_fmt(s["tokens_per_second"], ".1f"), _fmt(s["mean_accepted_tokens"], ".2f"),
                _fmt(s["acceptance_rate"], ".1%"), *([str(s["num_lossy_accepted_tokens"])] if has_lossy else []),
                format_rates_per_pos(s["acceptance_rate_per_pos"]),
                "-" if match is None else f"{match:.0%}",
                _fmt(s["overhead_fraction"], ".1%")]
        if has_cached:
            row += [f"{s['prefill_seconds']:.2f} s", f"{s['cached_prompt_tokens']:.0f}"]
        table.add_row(*row, style="bold" if cat == "overall" else None)
    return table


def plot_summary(summary: dict[str, dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cats = list(summary)
    series = {"vs plain decoding": [summary[c]["speedup"] or 0 for c in cats]}
    for mode, heading in BASELINE_MODES.items():
        if f"speedup_vs_{mode}" in summary["overall"]:
            series[f"vs {heading}"] = [summary[c].get(f"speedup_vs_{mode}") or 0 for c in cats]
    # The speedup's 95% bootstrap interval as an error bar (none where it could not be computed).
    errors = []
    for c in cats:
        speedup, interval = summary[c]["speedup"], summary[c]["speedup_ci95"]
        errors.append((speedup - interval[0], interval[1] - speedup) if speedup and interval else (math.nan, math.nan))
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(cats)) + 2.5, 4))
    width = 0.8 / len(series)
    for i, (label, values) in enumerate(series.items()):
        yerr = list(zip(*errors, strict=True)) if i == 0 else None
        ax.bar([x + i * width for x in range(len(cats))], values, width, label=label, yerr=yerr, capsize=3)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks([x + width * (len(series) - 1) / 2 for x in range(len(cats))], cats, rotation=30, ha="right")
    ax.set_ylabel("speedup (x); error bars: 95% interval")
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
