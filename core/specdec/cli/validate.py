"""``specdec validate``: mean acceptance length of a method on a prompt set (ModelOpt's ``ar_validate``).

Greedy generation, through the model's chat template, over Spec-Bench-format questions (a bundled set or a jsonl file, every turn of a
multi-turn question asked in order with the model's own earlier answers) or over a conversations
jsonl (each answered once, after its last user turn). Reports, per category and overall, the
metrics with vLLM's definitions: drafts, draft tokens, accepted tokens, acceptance rate and mean
acceptance length (1 + accepted / drafts). Measures acceptance only, never speed: use
``specdec bench`` for that.
"""

from __future__ import annotations

import json
from pathlib import Path
from collections.abc import Callable
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from specdec.bench.dataset import load_questions
from specdec.cli.common import build_config, method_options, model_options, quiet_transformers
from specdec.errors import ConfigError
from specdec.llm import LLM
from specdec.metrics import RequestMetrics, aggregate
from specdec.progress import Progress, log_console
from specdec.sampling import SamplingParams
from specdec.training.synthesize import UNREADABLE, open_text, prompt_turns, read_conversations

Conversation = list[dict[str, str]]


def _is_conversations_file(dataset: str) -> bool:
    """A jsonl, plain or compressed, whose first row has ``conversations`` (rather than
    Spec-Bench's ``turns``)."""
    if not Path(dataset).is_file():
        return False
    try:
        with open_text(dataset) as source:
            first = next((line for line in source if line.strip()), "")
        return isinstance(row := json.loads(first), dict) and "conversations" in row
    except (OSError, ValueError, *UNREADABLE):
        return False


def load_prompt_set(dataset: str, categories: list[str] | None, per_category: int | None,
                    max_turns: int) -> list[tuple[str, list[str] | Conversation]]:
    """``(category, turns)`` per prompt: Spec-Bench user turns (strings), or one conversation prefix."""
    if _is_conversations_file(dataset):
        rows: list[tuple[str, Any]] = []
        counts: dict[str, int] = {}
        for record in read_conversations(dataset):
            category = str(record.get("category", "conversations"))
            if categories and category not in categories:
                continue
            counts[category] = counts.get(category, 0) + 1
            if per_category is None or counts[category] <= per_category:
                rows.append((category, prompt_turns(record)))
        if not rows:
            raise ConfigError(f"--dataset: no prompts selected from {dataset}")
        return rows
    return [(q.category, q.turns[:max_turns]) for q in load_questions(dataset, categories, per_category)]


def run_validation(llm: LLM, prompts: list[tuple[str, list[str] | Conversation]], max_tokens: int,
                   on_turns: Callable[[int], None] | None = None) -> dict[str, list[RequestMetrics]]:
    """Generate greedily for every prompt (turn by turn, all prompts' turn ``i`` as one batch);
    each answered turn's metrics, by category. ``on_turns(n)`` reports progress."""
    params = SamplingParams(max_tokens=max_tokens)
    per_category: dict[str, list[RequestMetrics]] = {}
    histories: list[Conversation] = [[] for _ in prompts]
    depth = max(len(turns) if isinstance(turns[0], str) else 1 for _, turns in prompts)
    for turn in range(depth):
        active = []
        for n, (_, turns) in enumerate(prompts):
            if isinstance(turns[0], dict):
                if turn == 0:
                    histories[n] = list(turns)
                    active.append(n)
            elif turn < len(turns):
                histories[n].append({"role": "user", "content": turns[turn]})
                active.append(n)
        outputs = llm.generate([histories[n] for n in active], params, chat=True)
        for n, out in zip(active, outputs):
            histories[n].append({"role": "assistant", "content": out.text})
            per_category.setdefault(prompts[n][0], []).append(out.metrics)
        if on_turns is not None:
            on_turns(len(active))
    return per_category


def _row(m: RequestMetrics) -> dict[str, Any]:
    return {"num_drafts": m.num_drafts, "num_draft_tokens": m.num_draft_tokens, "num_accepted_tokens": m.num_accepted_tokens,
            "num_output_tokens": m.num_output_tokens, "acceptance_rate": m.acceptance_rate,
            "mean_acceptance_length": m.mean_acceptance_length, "acceptance_rate_per_pos": m.acceptance_rate_per_pos}


@click.command()
@method_options
@model_options
@click.option("--dataset", default="spec_bench", show_default=True,
              help="spec_bench, humaneval, code_edits, a Spec-Bench-format jsonl or a conversations jsonl.")
@click.option("--categories", default=None, help="Comma-separated categories (default: all).")
@click.option("--num-prompts", type=click.IntRange(min=1), default=None, help="Prompts per category (default: all).")
@click.option("--max-turns", type=click.IntRange(min=1), default=1, show_default=True, help="Turns per Spec-Bench question.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=8, show_default=True, help="Requests decoded together.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None, help="Also write the results here.")
def validate(config_file, method, max_draft_len, speculative_model, settings, model, dtype, device, runtime, dataset, categories,
             num_prompts, max_turns, max_tokens, batch_size, json_out) -> None:
    """Mean acceptance length of a method on a prompt set, per category (greedy)."""
    config = build_config(config_file, method, max_draft_len, settings, speculative_model)
    if config is None:
        raise ConfigError("validate needs --config or --method")
    # Acceptance of the drafter itself: every proposal verified at full length, unless asked.
    config.setdefault("adaptive_draft_len", False)
    prompts = load_prompt_set(dataset, categories.split(",") if categories else None, num_prompts, max_turns)
    quiet_transformers()
    console = log_console()
    with console.status("loading model"):
        llm = LLM(model, config, dtype=dtype, device=device, max_batch_size=batch_size, **runtime)
    total = sum(len(turns) if isinstance(turns[0], str) else 1 for _, turns in prompts)
    try:
        with Progress(TextColumn("[bold]validating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console) as progress:
            task = progress.add_task("validate", total=total)
            answered = run_validation(llm, prompts, max_tokens, lambda n: progress.update(task, advance=n))
    finally:
        llm.close()
    results = {category: aggregate(metrics) for category, metrics in sorted(answered.items())}
    overall = aggregate(results.values())
    table = Table(title=f"{llm.method} on {Path(str(llm.model.name_or_path)).name}, {dataset}, greedy")
    table.add_column("category", no_wrap=True)
    for column in ("turns", "drafts", "draft tokens", "accepted", "accept rate", "mean accept len"):
        table.add_column(column, justify="right")
    for name, m, turns in [*((c, m, len(answered[c])) for c, m in results.items()), ("overall", overall, total)]:
        table.add_row(name, str(turns), str(m.num_drafts), str(m.num_draft_tokens), str(m.num_accepted_tokens),
                      f"{m.acceptance_rate:.1%}", f"[bold]{m.mean_acceptance_length:.2f}[/]")
    console.print(table)
    if json_out:
        payload = {"method": llm.method, "config": llm.speculative_config.model_dump(mode="json"),
                   "model": str(llm.model.name_or_path), "dataset": dataset, "max_tokens": max_tokens,
                   "categories": {c: {"turns": len(answered[c]), **_row(m)} for c, m in results.items()},
                   "overall": {"turns": total, **_row(overall)}}
        try:
            Path(json_out).write_text(json.dumps(payload, indent=2) + "\n")
        except OSError as exc:
            raise ConfigError(f"--json: cannot write {json_out!r} ({exc.strerror})") from None
        console.print(f"wrote {json_out}")
