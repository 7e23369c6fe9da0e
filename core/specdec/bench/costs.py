"""Where a speculative step's time goes, against plain decoding's step, from the bench's own runs.

A speculative step drafts, runs one target forward over the last token and the drafts, then
verifies and keeps its books (rollback, the method's accept hook, the policy). Its speedup is
the tokens a step yields over what the step costs in plain steps, so a method that accepts well
can still lose: its drafts cost too much, or its verify forward is too wide for the machine.
This breaks the measured decode time into those parts:

- **target forward by width:** what a forward of ``w`` tokens per request costs relative to a
  one-token forward, at a short and a long context (the adaptive policy's own measurement when
  it made one, else measured here);
- **per step:** drafting, the target forward and verify plus bookkeeping, in milliseconds, for
  plain and speculative decoding; drafting per drafted token, also in one-token target forwards;
- **what-if speedups:** the decode speedup as measured; with drafting free (the measured
  acceptance and widths, the draft time removed); and with drafting and bookkeeping both free
  (only target forwards count). The gap between them says what to make cheaper.

Decode time excludes the prefill, which both modes pay alike, so these speedups differ slightly
from the bench's wall-clock one.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

from specdec.bench.runner import PLAIN, SPEC, TurnResult
from specdec.draft_policy import ContextCost
from specdec.llm import LLM
from specdec.metrics import aggregate


def forward_costs(spec: LLM, rows: int) -> dict[str, Any]:
    """The target's forward cost by width (1 .. the widest verify) for a batch of ``rows``, at a
    short and a long context: seconds of the one-token forward and each width relative to it."""
    policy = spec.engine.policy
    cost = policy.forward_costs.get(rows)
    if cost is None:
        widest = spec.speculative_config.max_verify_drafts + 1
        cost = ContextCost.measure(spec.runner, widest, rows=rows, sync=policy.sync)
    return {
        "batch_size": rows,
        "contexts": list(cost.contexts),
        "one_token_seconds": [c.base_seconds for c in cost.costs],
        "relative": [list(c.relative) for c in cost.costs],
    }


def step_breakdown(results: list[TurnResult]) -> dict[str, Any]:
    """Per-step times of plain and speculative decoding over ``results``, and what-if speedups."""
    spec = aggregate(r.runs[SPEC].metrics for r in results)
    plain = aggregate(r.runs[PLAIN].metrics for r in results)
    if not spec.num_steps or not plain.num_steps:
        return {}
    tokens = spec.num_steps + spec.num_accepted_tokens  # tokens the decode steps emitted
    plain_token = plain.time_decode / plain.num_steps  # one token per plain step
    plain_forward = plain.time_forward / plain.num_steps

    def speedup(seconds: float) -> float | None:
        return plain_token / (seconds / tokens) if seconds > 0 else None

    return {
        "steps": spec.num_steps,
        "tokens_per_step": tokens / spec.num_steps,
        "drafting_steps": spec.num_drafts,
        "plain_ms_per_step": {
            # Everything but the forward: a plain step drafts nothing, but still plans and keeps books.
            "forward": 1e3 * plain_forward,
            "bookkeeping": 1e3 * (plain.time_decode - plain.time_forward - plain.time_logits_processing) / plain.num_steps,
            "logits_processing": 1e3 * plain.time_logits_processing / plain.num_steps,
        },
        "spec_ms_per_step": {
            "draft": 1e3 * spec.time_draft / spec.num_steps,
            "forward": 1e3 * spec.time_forward / spec.num_steps,
            "bookkeeping": 1e3 * max(spec.time_overhead - spec.time_logits_processing, 0.0) / spec.num_steps,
            # Grammar masks, penalties, ... (cutting forbidden drafts included).
            "logits_processing": 1e3 * spec.time_logits_processing / spec.num_steps,
        },
        # Verify forwards against one-token forwards: the mean width's relative cost.
        "forward_vs_plain": (spec.time_forward / spec.num_steps) / plain_forward if plain_forward else None,
        "draft_ms_per_drafted_token": 1e3 * spec.time_draft / spec.num_draft_tokens if spec.num_draft_tokens else None,
        "draft_forwards_per_drafted_token": (
            spec.time_draft / spec.num_draft_tokens / plain_forward if spec.num_draft_tokens and plain_forward else None
        ),
        "decode_speedup": speedup(spec.time_decode),
        "speedup_at_zero_draft_cost": speedup(spec.time_decode - spec.time_draft),
        "speedup_forwards_only": speedup(spec.time_forward),
    }


def cost_breakdown(spec: LLM, results: list[TurnResult], rows: int) -> dict[str, Any]:
    """Forward costs by width and each category's step breakdown (and ``overall``)."""
    categories = sorted({r.category for r in results})
    steps = {c: step_breakdown([r for r in results if r.category == c]) for c in categories}
    steps["overall"] = step_breakdown(results)
    costs = {"forward_cost": forward_costs(spec, rows), "steps": {c: s for c, s in steps.items() if s}}
    if spec.engine.policy.adaptive:
        costs["policy"] = spec.engine.policy.state(rows)
    return costs


def policy_summary(costs: dict[str, Any]) -> str | None:
    """One line on what the adaptive policy had learnt by the end of the run (``None`` without
    one): why it drafted as much, or as little, as it did."""
    state = costs.get("policy")
    if not state:
        return None
    forward = costs["forward_cost"]["one_token_seconds"][0]
    draft = state["draft_seconds_per_token"]
    if draft is None:
        parts = ["no drafting step measured"]
    else:
        fastest = "" if draft["fastest"] is None else f", fastest {1e3 * draft['fastest']:.2f} ms"
        parts = [(f"drafting {1e3 * draft['average']:.2f} ms per drafted token "
                  f"({draft['average'] / forward:.2f} one-token forwards{fastest})")]
    ratios = state["step_time_ratio_by_drafts"]
    if ratios:
        parts.append("step time over the warm-up's by drafts " + ", ".join(f"{n}: {r:.2f}" for n, r in sorted(ratios.items())))
    if state["resume_setup_seconds"]:
        setups = state["resume_setup_seconds"]
        parts.append(f"resume setup {1e3 * sum(setups) / len(setups):.2f} ms (last {len(setups)})")
    parts.append("acceptance by position " + " ".join(f"{a:.2f}" for a in state["acceptance_by_position"]))
    return f"policy at the end (batch {state['batch_size']}): " + "; ".join(parts)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def forward_cost_table(costs: dict[str, Any], title: str) -> Table:
    """Relative cost of each verify width, one column per measured context."""
    forward = costs["forward_cost"]
    table = Table(title=f"{title}: target forward cost by width (batch {forward['batch_size']})")
    table.add_column("width", justify="right")
    for context, base in zip(forward["contexts"], forward["one_token_seconds"]):
        table.add_column(f"context {context} (x {1e3 * base:.1f} ms)", justify="right")
    widths = len(forward["relative"][0])
    shown = sorted({*range(1, min(widths, 9) + 1), widths})  # every narrow width, then the widest
    for width in shown:
        table.add_row(str(width), *(f"{relative[width - 1]:.2f}" for relative in forward["relative"]))
    return table


def step_table(costs: dict[str, Any], title: str) -> Table:
    """Per category: ms per step of each part, drafting per drafted token, and what-if speedups."""
    table = Table(title=f"{title}: where a step's time goes")
    for col in ["category", "tokens/step", "plain ms/step", "draft ms", "forward ms", "verify+books ms",
                "logits proc. ms (plain)", "draft/token", "speedup", "free drafts", "forwards only"]:
        table.add_column(col, justify="left" if col == "category" else "right")
    for category, s in costs["steps"].items():
        plain, spec = s["plain_ms_per_step"], s["spec_ms_per_step"]
        per_token = s["draft_forwards_per_drafted_token"]
        table.add_row(
            category, f"{s['tokens_per_step']:.2f}", f"{sum(plain.values()):.1f}",
            f"{spec['draft']:.1f}", f"{spec['forward']:.1f} ({_fmt(s['forward_vs_plain'], '.2f')}x)",
            f"{spec['bookkeeping']:.1f}", f"{spec['logits_processing']:.2f} ({plain['logits_processing']:.2f})",
            "-" if per_token is None else f"{s['draft_ms_per_drafted_token']:.1f} ms ({per_token:.2f} fwd)",
            _fmt(s["decode_speedup"], ".2f") + "x", _fmt(s["speedup_at_zero_draft_cost"], ".2f") + "x",
            _fmt(s["speedup_forwards_only"], ".2f") + "x",
            style="bold" if category == "overall" else None,
        )
    return table


def plot_costs(costs: dict[str, Any], path: Any, title: str) -> None:
    """Two panels: forward cost by width; ms per output token of each part, plain against speculative."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    forward, steps = costs["forward_cost"], costs["steps"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [1, 1.6]})
    for context, relative in zip(forward["contexts"], forward["relative"]):
        left.plot(range(1, len(relative) + 1), relative, marker=".", label=f"context {context}")
    left.set_xlabel("tokens per request in the forward (verify width)")
    left.set_ylabel("cost, in one-token forwards")
    left.set_title(f"target forward by width (batch {forward['batch_size']})")
    left.legend(frameon=False)
    left.grid(alpha=0.3)

    cats = list(steps)
    parts = [("draft", "tab:orange"), ("forward", "tab:blue"), ("bookkeeping", "tab:green"),
             ("logits_processing", "tab:purple")]
    for offset, mode in ((-0.2, "plain"), (0.2, "spec")):
        bottom = [0.0] * len(cats)
        for part, colour in parts:
            per_token = []
            for c in cats:
                ms = steps[c][f"{mode}_ms_per_step"].get(part, 0.0)
                per_token.append(ms / (1.0 if mode == "plain" else steps[c]["tokens_per_step"]))
            right.bar([x + offset for x in range(len(cats))], per_token, 0.38, bottom=bottom, color=colour,
                      alpha=0.45 if mode == "plain" else 1.0, label=f"{mode}: {part}" if part != "draft" or mode == "spec" else None)
            bottom = [b + p for b, p in zip(bottom, per_token)]
    right.set_xticks(range(len(cats)), cats, rotation=30, ha="right")
    right.set_ylabel("ms per output token (left bar plain, right speculative)")
    right.set_title("decode time per token by part")
    right.legend(loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
