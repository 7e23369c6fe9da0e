"""``specdec generate``: speculative generation, optionally timed against plain decoding."""

from __future__ import annotations

import json
import time

import click
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from specdec.cli.common import build_config, method_options, model_options, quiet_transformers, sampling_options, sampling_params
from specdec.llm import LLM, RequestOutput
from specdec.metrics import format_rates_per_pos
from specdec.sampling import SamplingParams


def _timed(llm: LLM, prompt: str, params: SamplingParams, chat: bool) -> tuple[RequestOutput, float]:
    start = time.perf_counter()
    out = llm.generate(prompt, params, chat=chat)[0]
    return out, time.perf_counter() - start


@click.command()
@model_options
@method_options
@sampling_options
@click.option("--max-tokens", type=int, default=128, show_default=True)
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--chat/--no-chat", default=True, show_default=True, help="Apply the model's chat template.")
@click.option("--compare", is_flag=True, help="Also decode plainly (after a warm-up) and report the speedup.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per prompt, one per line.")
@click.argument("prompts", nargs=-1, required=True)
def generate(model, dtype, device, runtime, config_file, method, max_draft_len, speculative_model, settings, temperature, top_p, top_k, min_p, seed,
             max_tokens, stop, chat, compare, as_json, prompts) -> None:
    """Generate text for each PROMPT."""
    config = build_config(config_file, method, max_draft_len, settings, speculative_model)
    params = sampling_params(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, seed=seed, max_tokens=max_tokens, stop=list(stop))
    quiet_transformers()
    console = Console(stderr=as_json)
    with console.status("loading model"):
        llm = LLM(model, config, dtype=dtype, device=device, **runtime)
        plain = LLM(llm.model, None, tokenizer=llm.tokenizer, **runtime) if compare else None
    with console.status("warming up"):
        llm.warmup()
        if plain is not None:
            for engine in (plain, llm):
                engine.generate(prompts[0], params.model_copy(update={"max_tokens": 8}), chat=chat)
    try:
        _generate_all(llm, plain, prompts, params, chat, as_json, console)
    finally:
        llm.close()


def _generate_all(llm: LLM, plain: LLM | None, prompts: tuple[str, ...], params: SamplingParams, chat: bool,
                  as_json: bool, console: Console) -> None:
    for prompt in prompts:
        out, seconds = _timed(llm, prompt, params, chat)
        base = _timed(plain, prompt, params, chat) if plain is not None else None
        m = out.metrics
        record = {"prompt": prompt, "text": out.text, "token_ids": out.token_ids, "finish_reason": out.finish_reason,
                  "method": llm.method, "seconds": seconds, "metrics": m.to_dict()}
        if base is not None:
            record["plain_seconds"] = base[1]
            record["speedup"] = (len(out.token_ids) / seconds) / (len(base[0].token_ids) / base[1])
            record["matches_plain"] = out.token_ids == base[0].token_ids if params.greedy else None
        if as_json:
            click.echo(json.dumps(record))
            continue
        console.print(Panel(out.text, title=f"[bold]{prompt}[/]", title_align="left", subtitle=f"{llm.method}, {out.finish_reason}"))
        table = Table(show_header=False, box=None)
        table.add_row("tokens", f"{len(out.token_ids)} in {seconds:.2f} s ({m.tokens_per_second:.1f} tok/s)")
        if base is not None:
            table.add_row("plain decoding", f"{len(base[0].token_ids)} in {base[1]:.2f} s")
            table.add_row("speedup", f"[bold]{record['speedup']:.2f}x[/] over plain decoding, same run")
            if record["matches_plain"] is not None:
                table.add_row("same tokens as plain", "yes" if record["matches_plain"] else f"no ({llm.runner.dtype}; see docs on bf16)")
        table.add_row("drafts / draft tokens / accepted", f"{m.num_drafts} / {m.num_draft_tokens} / {m.num_accepted_tokens}")
        if m.num_lossy_accepted_tokens:
            table.add_row("lossy-accepted (not lossless)", str(m.num_lossy_accepted_tokens))
        table.add_row("acceptance rate", f"{m.acceptance_rate:.1%}")
        table.add_row("mean acceptance length", f"{m.mean_acceptance_length:.2f}")
        table.add_row("per-position acceptance", format_rates_per_pos(m.acceptance_rate_per_pos))
        console.print(table)
