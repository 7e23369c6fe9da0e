"""``specdec bench``: Spec-Bench-style speedup, acceptance and output match, in one run."""

from __future__ import annotations

import json
import platform
from pathlib import Path

import click
import torch
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

from specdec.bench.costs import cost_breakdown, forward_cost_table, plot_costs, policy_summary, step_table
from specdec.bench.dataset import load_questions
from specdec.bench.report import plot_summary, summarize, summary_table
from specdec.bench.runner import HFPeer, TurnResult, run_batched_benchmark, run_benchmark
from specdec.cli.common import build_config, method_options, model_options, quiet_transformers, sampling_options, sampling_params
from specdec.errors import ConfigError
from specdec.llm import LLM
from specdec.plugins import get_registry
from specdec.progress import Progress, log_console

BASELINES = {"none", "hf", "hf-static", "eager"}


@click.command()
@method_options
@model_options
@sampling_options
@click.option("--dataset", default="spec_bench", show_default=True, help="spec_bench, humaneval, code_edits, json_extraction (answers under a JSON schema), tool_calls (OpenAI tools, "
                   "required or named calls), repeated (MT-Bench first turns, sent again as `repeat` after all were answered) "
                   "or a Spec-Bench-format jsonl file.")
@click.option("--categories", default=None, help="Comma-separated categories (default: all).")
@click.option("--num-prompts", type=click.IntRange(min=1), default=None, help="Prompts per category (default: all).")
@click.option("--max-turns", type=click.IntRange(min=1), default=2, show_default=True, help="Turns per prompt (mt_bench prompts have 2).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--ignore-eos", is_flag=True, help="Generate exactly --max-tokens per turn, as vLLM's benchmarks can: "
              "outputs that differ (bf16) then cannot differ in length.")
@click.option("--baseline", default="none", show_default=True, help="Comma list: none (plain decoding, always run), hf (transformers' peer), hf-static (transformers' plain "
              "decoding with a static cache, compiled on CUDA), eager (plain decoding with no captured forwards).")
@click.option("--batch-size", type=click.IntRange(min=1), default=1, show_default=True,
              help="Requests decoded together; above 1 the bench compares batched throughput with plain batched decoding. "
                   "A batch holds one category's prompts: give --num-prompts at least this.")
@click.option("--repeats", type=click.IntRange(min=1), default=1, show_default=True,
              help="Rounds per turn (or batch), each running every mode once: more rounds average out machine noise.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None, help="Write results here (and a .png plot beside).")
def bench(config_file, method, max_draft_len, speculative_model, settings, model, dtype, device, runtime, temperature, top_p, top_k, min_p, seed, dataset,
          categories, num_prompts, max_turns, max_tokens, ignore_eos, baseline, batch_size, repeats, json_out) -> None:
    """Benchmark a method against plain decoding on the same loaded model."""
    config = build_config(config_file, method, max_draft_len, settings, speculative_model)
    if config is None:
        raise ConfigError("bench needs --config or --method")
    baselines = {b.strip() for b in baseline.split(",") if b.strip()}
    if baselines - BASELINES:
        raise ConfigError(f"--baseline: unknown {', '.join(sorted(baselines - BASELINES))}; use none, hf, hf-static, eager")
    params = sampling_params(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, seed=seed, max_tokens=max_tokens,
                             ignore_eos=ignore_eos)
    questions = load_questions(dataset, categories.split(",") if categories else None, num_prompts)
    if json_out:
        _check_writable(Path(json_out))
    quiet_transformers()
    console = log_console()
    with console.status("loading model"):
        plain = LLM(model, None, dtype=dtype, device=device, max_batch_size=batch_size, **runtime)
        spec = LLM(plain.model, config, tokenizer=plain.tokenizer, max_batch_size=batch_size, **runtime)
    eager = None
    if "eager" in baselines and plain.runner.execution == "eager":
        console.print("[yellow]plain decoding already runs eagerly here; skipping the eager baseline[/]")
    elif "eager" in baselines:
        eager = LLM(plain.model, None, tokenizer=plain.tokenizer, max_batch_size=batch_size, **{**runtime, "execution": "eager"})
    hf = hf_static = None
    if baselines & {"hf", "hf-static"} and batch_size > 1:
        console.print("[yellow]transformers' assisted generation decodes one sequence at a time; skipping the hf baselines at --batch-size above 1[/]")
    elif "hf" in baselines:
        kwargs = get_registry().hook.specdec_hf_generate_kwargs(config=spec.speculative_config, target=spec.engine.target)
        if kwargs is None:
            console.print(f"[yellow]transformers has no equivalent of {spec.method!r}; skipping the hf baseline[/]")
        else:
            hf = HFPeer(plain, kwargs, params)
    if "hf-static" in baselines and batch_size == 1:
        # transformers compiles the forward of a static-cache generate by itself on CUDA.
        hf_static = HFPeer(plain, {"cache_implementation": "static"}, params)
    total = repeats * sum(min(len(q.turns), max_turns) for q in questions)
    title = f"{spec.method} on {Path(str(plain.model.name_or_path)).name}, {plain.runner.dtype}, {dataset}"
    if batch_size > 1:
        title += f", batch {batch_size}"
    with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("benchmarking", total=total)

        def advance(result: TurnResult) -> None:
            progress.update(task, advance=1, description=f"{result.category} #{result.question_id}")

        if batch_size > 1:
            results = run_batched_benchmark(plain, spec, questions, params, max_turns, batch_size, on_turn=advance, repeats=repeats,
                                            eager=eager)
        else:
            results = run_benchmark(plain, spec, hf, questions, params, max_turns, on_turn=advance, repeats=repeats, eager=eager,
                                    hf_static=hf_static)
    summary = summarize(results, params.greedy)
    console.print(summary_table(summary, title))
    with console.status("timing the target's forwards by width"):
        costs = cost_breakdown(spec, results, batch_size)
    console.print(forward_cost_table(costs, spec.method))
    console.print(step_table(costs, spec.method))
    if (learnt := policy_summary(costs)) is not None:
        console.print(learnt)
    if json_out:
        path = Path(json_out)
        payload = {
            "config": spec.speculative_config.model_dump(mode="json"),
            "method": spec.method,
            "model": str(plain.model.name_or_path),
            "dtype": str(plain.runner.dtype),
            "device": str(plain.runner.device),
            "threads": torch.get_num_threads(),
            "prepacked_linears": plain.runner.prepacked_linears,
            "execution": plain.runner.execution,
            "prefix_caching": plain.engine.prefill.prefix_cache is not None,
            "static_memory": spec.runner.static_memory,
            "batch_size": batch_size,
            "repeats": repeats,
            "machine": platform.machine(),
            "sampling": params.model_dump(),
            "hf_kwargs": sorted(hf.kwargs) if hf else None,
            "baselines": sorted(baselines),
            "summary": summary,
            "costs": costs,
            "turns": [
                {"question_id": r.question_id, "category": r.category, "turn": r.turn, "round": r.round, "batch": r.batch,
                 "runs": {m: {"num_tokens": len(run.tokens), "seconds": run.seconds, "metrics": run.metrics.to_dict() if run.metrics else None} for m, run in r.runs.items()}}
                for r in results
            ],
        }
        path.write_text(json.dumps(payload, indent=2, default=str))
        plot_summary(summary, path.with_suffix(".png"), title)
        costs_plot = path.with_name(f"{path.stem}-costs.png")
        plot_costs(costs, costs_plot, title)
        console.print(f"wrote {path}, {path.with_suffix('.png')} and {costs_plot}")
    spec.close()


def _check_writable(path: Path) -> None:
    """Fail before a long run, not after it, when the results cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    except OSError as exc:
        raise ConfigError(f"--json: cannot write {str(path)!r} ({exc.strerror})") from None
