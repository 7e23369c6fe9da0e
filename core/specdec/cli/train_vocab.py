"""``specdec train draft-vocab``: rank the target's tokens by how often its replies use them.

The ranking is what a method's ``draft_vocab_size`` keeps the top of (:mod:`specdec.draft_vocab`).
It is counted over conversations the target answered itself (``specdec synthesize`` output),
the same data a draft is trained on; never an evaluation set.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click
import torch
from rich.table import Table

from specdec.errors import ConfigError
from specdec.models import load_model
from specdec.progress import log_console
from specdec.training.conversations import tokenize_all
from specdec.training.synthesize import read_conversations
from specdec.training.token_frequency import coverage, frequency_ranking, token_counts
from specdec.draft_vocab import SHIPPED_RANKING, save_ranking

#: Draft vocabulary sizes whose coverage the command reports.
REPORTED_SIZES = (1024, 2048, 4096, 8192, 16384, 32768)


@click.command("draft-vocab")
@click.option("--data", "data_paths", multiple=True, required=True, type=click.Path(dir_okay=False),
              help="Conversations jsonl with the target's replies (from `specdec synthesize`); repeatable.")
@click.option("--output", default=str(SHIPPED_RANKING), show_default=True, type=click.Path(dir_okay=False),
              help="Where to write the ranking (safetensors).")
@click.option("--model", default=None, help="Target (its tokenizer): HF id or local dir (default: embedded SmolLM2-135M-Instruct).")
@click.option("--max-length", type=int, default=2048, show_default=True, help="Truncate conversations to this many tokens.")
def train_draft_vocab(data_paths, output, model, max_length) -> None:
    """Rank the target's tokens by use in its replies, for a drafter's draft_vocab_size."""
    console = log_console()
    with console.status("counting reply tokens"):
        target, tokenizer = load_model(model, torch.float32, "cpu")
        # The target's output rows, which a draft vocabulary indexes (padded past the tokenizer in some models).
        vocab_size = int(target.get_output_embeddings().weight.shape[0])
        del target
        records = [r for path in data_paths for r in read_conversations(path)]
        examples = tokenize_all(records, tokenizer, max_length)
        replies, every = token_counts(((e.input_ids, e.loss_mask) for e in examples), vocab_size)
    if int(replies.sum()) == 0:
        raise ConfigError("--data: no assistant reply tokens to count")
    ranking = frequency_ranking(replies, every)
    save_ranking(Path(output), ranking, replies, {
        "vocab_size": str(vocab_size),
        "num_conversations": str(len(examples)),
        "num_reply_tokens": str(int(replies.sum())),
        "command": shlex.join(["specdec", *sys.argv[1:]]),
    })
    table = Table(title=f"{int(replies.sum()):,} reply tokens in {len(examples):,} conversations; "
                        f"{int((replies > 0).sum()):,} distinct")
    table.add_column("draft_vocab_size", justify="right")
    table.add_column("reply tokens covered", justify="right")
    for size in (s for s in REPORTED_SIZES if s < vocab_size):
        table.add_row(str(size), f"{coverage(replies, ranking[:size]):.2%}")
    console.print(table)
    console.print(f"wrote {output}")
