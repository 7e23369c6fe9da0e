"""``specdec synthesize``: the target answers training prompts (data for training drafters)."""

from __future__ import annotations

import random

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from specdec.chat_template import load_chat_template
from specdec.cli.common import model_options, quiet_transformers
from specdec.errors import ConfigError
from specdec.models import load_model
from specdec.progress import Progress
from specdec.training.synthesize import (SynthesisOptions, done_ids, read_conversations, read_openers,
                                         self_prompt_records, synthesize as run_synthesis)


@click.command()
@model_options
@click.option("--input", "input_path", default=None, type=click.Path(dir_okay=False),
              help="Conversations jsonl (conversation_id, conversations: [{role, content}]).")
@click.option("--self-prompts", type=int, default=0, show_default=True,
              help="Also this many conversations whose opening request the target writes itself (Magpie).")
@click.option("--follow-ups", type=int, default=0, show_default=True,
              help="User turns the target writes itself after each conversation's given ones are answered.")
@click.option("--user-temperature", type=float, default=1.0, show_default=True, help="Sampling of the user turns the target writes.")
@click.option("--user-top-p", type=float, default=0.95, show_default=True)
@click.option("--user-max-tokens", type=int, default=128, show_default=True, help="A longer user turn ends its conversation.")
@click.option("--openers", "openers_path", default=None, type=click.Path(dir_okay=False),
              help="Text file of openers, one per line: each opening request the target writes starts with one.")
@click.option("--follow-up-openers", "follow_up_openers_path", default=None, type=click.Path(dir_okay=False),
              help="Text file of openers for the follow-up requests the target writes.")
@click.option("--output", "output_path", required=True, type=click.Path(dir_okay=False),
              help="Conversations jsonl to append the answered conversations to (resumes if it exists).")
@click.option("--limit", type=int, default=None, help="Answer a seeded random sample of this many conversations (default: all, in a seeded random order).")
@click.option("--max-new-tokens", type=int, default=256, show_default=True)
@click.option("--max-prompt-tokens", type=int, default=512, show_default=True, help="A conversation ends before a longer prompt (skipped if its first one is).")
@click.option("--batch-size", type=int, default=32, show_default=True, help="Requests decoded together (continuous batching).")
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy.")
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--system-prompt", default=None, help="System turn for every conversation (replaces the input's).")
def synthesize(model, dtype, device, runtime, input_path, output_path, self_prompts, follow_ups, user_temperature, user_top_p,
               user_max_tokens, openers_path, follow_up_openers_path, limit, max_new_tokens, max_prompt_tokens,
               batch_size, temperature, top_p, seed, system_prompt) -> None:
    """Generate the target's own answers to every user turn in --input (and to requests it writes
    itself, with --self-prompts or --follow-ups), as training data."""
    if limit is not None and limit < 1:
        raise ConfigError("--limit must be at least 1")
    if temperature < 0 or not 0 < top_p <= 1:
        raise ConfigError("--temperature must be >= 0 and --top-p in (0, 1]")
    if self_prompts < 0:
        raise ConfigError("--self-prompts must be at least 0")
    if input_path is None and not self_prompts:
        raise ConfigError("give --input (prompts to answer), --self-prompts N (requests the target writes), or both")
    records = read_conversations(input_path) if input_path is not None else []
    records += self_prompt_records(self_prompts, seed)
    # A seeded shuffle: a run stopped early has answered a sample of every source in the file.
    records = random.Random(seed).sample(records, min(limit or len(records), len(records)))
    pending = len(records) - len({str(r["conversation_id"]) for r in records} & done_ids(output_path))
    options = SynthesisOptions(max_new_tokens=max_new_tokens, batch_size=batch_size, max_prompt_tokens=max_prompt_tokens,
                               temperature=temperature, top_p=top_p, seed=seed, system_prompt=system_prompt,
                               follow_ups=follow_ups, user_temperature=user_temperature, user_top_p=user_top_p,
                               user_max_tokens=user_max_tokens,
                               openers=read_openers(openers_path, "--openers") if openers_path else (),
                               follow_up_openers=(read_openers(follow_up_openers_path, "--follow-up-openers")
                                                  if follow_up_openers_path else ()))
    quiet_transformers()
    console = Console(stderr=True)
    runtime = dict(runtime)
    template = load_chat_template(runtime.pop("chat_template")) if "chat_template" in runtime else None
    with console.status("loading model"):
        target, tokenizer = load_model(model, dtype, device)
    if template is not None:  # the conversations are built with this tokenizer as well as decoded
        tokenizer.chat_template = template
    columns = (TextColumn("[bold]synthesizing"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[tokens]} tokens"),
               TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("synthesize", total=pending, tokens=0)
        counted = {"tokens": 0}

        def on_batch(conversations: int, tokens: int) -> None:
            counted["tokens"] += tokens
            progress.update(task, advance=conversations, tokens=counted["tokens"])

        written = run_synthesis(target, tokenizer, records, output_path, options, on_batch, runtime)
    console.print(f"wrote {written} conversations ({counted['tokens']} generated tokens) to {output_path}; "
                  f"{pending - written} skipped: their first prompt is longer than {max_prompt_tokens} tokens, "
                  f"or the target's own request was cut off at {user_max_tokens} tokens or empty")
