"""What every drafter trainer's command shares (``specdec train medusa``, ``specdec train mtp``):
its common options and their checks, the resume rules, loading the target and the conversations,
and running the core loop behind a progress bar that writes ``training.json`` at each save."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from specdec.cli.common import quiet_transformers
from specdec.draft_vocab import load_ranking
from specdec.errors import ConfigError
from specdec.models import DEFAULT_MODEL, load_model, resolve_device, resolve_dtype
from specdec.progress import Progress
from specdec.training.distributed import World, every_rank, join, leave
from specdec.training.examples import ExampleDataset, load_examples
from specdec.training.loop import StepReport, Trainee, check_shape, fit
from specdec.training.reporting import TrainingProgress, heldout_note, split_heldout, write_record
from specdec.training.state import STATE_FILE, Position, TrainingOptions, read_state
from specdec.training.state_cache import CachedStates, open_cache, write_cache
from specdec.training.target import FrozenTarget
from specdec.training.vocabulary import TrainingVocabulary, training_vocabulary

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: The embedded default target's hub id, as exported checkpoints record their base model.
DEFAULT_BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"


def trainer_options(output_help: str, unit: str, lr: float, lr_help: str, decay: float, decay_help: str) -> Callable:
    """The options every trainer takes, for a trainer of ``unit`` s (``head``, ``depth``)."""
    options = [
        click.option("--data", multiple=True, required=True, type=click.Path(dir_okay=False),
                     help="Conversations jsonl(.xz) the target answered itself (`specdec synthesize`, training-data/); "
                          "repeatable."),
        click.option("--output", required=True, type=click.Path(file_okay=False), help=output_help),
        click.option("--model", default=None, help="Target: HF id or local dir (default: embedded SmolLM2-135M-Instruct)."),
        click.option("--dtype", type=click.Choice(["auto", *DTYPES]), default="auto", show_default=True, help="Target dtype."),
        click.option("--device", default=None, help="cuda or cpu (default: CUDA when present)."),
        click.option("--epochs", type=int, default=1, show_default=True, help="Passes over the data."),
        click.option("--max-steps", type=int, default=None, help="Optimizer steps in all (instead of --epochs)."),
        click.option("--batch-size", type=int, default=8, show_default=True, help="Conversations per step and process."),
        click.option("--max-length", type=int, default=2048, show_default=True,
                     help="Truncate conversations to this many tokens."),
        click.option("--limit", type=int, default=None, help="Train on the first this many conversations only."),
        click.option("--lr", type=float, default=lr, show_default=True, help=lr_help),
        click.option("--warmup", type=click.IntRange(min=0), default=20, show_default=True,
                     help="Linear warm-up steps, then cosine decay to 0."),
        click.option("--loss-decay", type=click.FloatRange(0, 1, min_open=True), default=decay, show_default=True,
                     help=decay_help),
        click.option("--precision", type=click.Choice(["auto", "bfloat16", "float32"]), default="auto", show_default=True,
                     help="The trained matrix products: bfloat16 (mixed; weights and losses stay float32) or float32. "
                          "auto: bfloat16 where the device computes it natively (CUDA, CPUs with AMX or AVX512-BF16)."),
        click.option("--chunk-size", type=int, default=1024, show_default=True,
                     help=f"Positions per {unit} whose vocabulary logits are computed at once (memory: chunk x vocab floats)."),
        click.option("--train-vocab", type=click.IntRange(min=0), default=0, show_default=True,
                     help="Train the softmax over the this many most frequent reply tokens of --data only "
                          "(0: the whole vocabulary): the projection is the costliest part; the exported weights "
                          "still draft over every token."),
        click.option("--draft-vocab", type=click.Path(dir_okay=False), default=None,
                     help="Take --train-vocab's tokens from this ranking (`specdec train draft-vocab`) instead of "
                          "counting --data's replies: the tokens the drafter will draft over with that ranking "
                          "(the shipped drafters use the ranking shipped for the default target)."),
        click.option("--cache-states", type=click.Path(file_okay=False), default=None,
                     help="Keep the target's final states of the training conversations in this directory (made on "
                          "the first run, about 1.2 kB a token for SmolLM2 in bfloat16; the Medusa and MTP trainers "
                          "share the format): later epochs and resumed runs skip the target."),
        click.option("--group-by-length/--no-group-by-length", default=True, show_default=True,
                     help="Batch conversations of similar length together (less padding) rather than at random."),
        click.option("--eval-fraction", type=float, default=0.0, show_default=True,
                     help="Share of the conversations held out (seeded) to measure loss and accuracy on."),
        click.option("--eval-data", multiple=True, type=click.Path(dir_okay=False),
                     help="Measure on these conversations instead of --eval-fraction; repeatable."),
        click.option("--eval-every", type=click.IntRange(min=0), default=0, show_default=True,
                     help="Also measure the held-out set every this many steps (always: each epoch's end)."),
        click.option("--save-every", type=click.IntRange(min=0), default=0, show_default=True,
                     help="Also export and save the training state every this many steps (always: each epoch's end)."),
        click.option("--resume", is_flag=True,
                     help=f"Continue from --output's {STATE_FILE} (the same shape; the data and seed must match)."),
        click.option("--export-dtype", type=click.Choice(list(DTYPES)), default="bfloat16", show_default=True),
        click.option("--seed", type=int, default=0, show_default=True),
    ]

    def decorate(command: Callable) -> Callable:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def check_options(counts: dict[str, int], epochs: int, max_steps: int | None, batch_size: int, lr: float,
                  eval_fraction: float, data: tuple[str, ...], eval_data: tuple[str, ...], max_length: int,
                  chunk_size: int, train_vocab: int = 0, draft_vocab: str | None = None, **_: Any) -> None:
    """One-line errors for options click's types do not already bound; ``counts``: the trainer's
    own ``{option name: value}`` that must be at least 1."""
    for name, value in (*counts.items(), ("epochs", epochs), ("batch-size", batch_size), ("max-length", max_length),
                        ("chunk-size", chunk_size)):
        if value < 1:
            raise ConfigError(f"--{name}: must be at least 1, got {value}")
    if max_steps is not None and max_steps < 1:
        raise ConfigError(f"--max-steps: must be at least 1, got {max_steps}")
    if lr <= 0:
        raise ConfigError(f"--lr: must be positive, got {lr}")
    if not 0 <= eval_fraction < 1:
        raise ConfigError(f"--eval-fraction: must be in [0, 1), got {eval_fraction}")
    if eval_fraction and eval_data:
        raise ConfigError("--eval-fraction and --eval-data are alternatives; give one")
    if draft_vocab and not train_vocab:
        raise ConfigError("--draft-vocab: needs --train-vocab, the number of its tokens to train over")
    for path in (*data, *eval_data):
        if not Path(path).is_file():
            raise ConfigError(f"--data: no file {path!r}" if path in data else f"--eval-data: no file {path!r}")


def saved_state(output: str, resume: bool, shape: dict[str, Any], describe: Callable[[dict[str, Any]], str]) -> dict | None:
    """The state to resume from (checked against ``shape``), or ``None`` for a new run, which
    refuses an ``output`` already holding a state."""
    if resume:
        saved = read_state(output)
        check_shape(saved, shape, describe)
        return saved
    if (Path(output) / STATE_FILE).exists():
        raise ConfigError(f"--output: {output!r} holds a training state; pass --resume to continue it or choose another directory")
    return None


@dataclass
class TrainingRun:
    """What :func:`run_training` reads: the process group, the console, the training and
    held-out conversations."""

    world: World
    console: Console
    dataset: torch.utils.data.Dataset
    heldout: torch.utils.data.Dataset | None


@dataclass
class TrainingInputs(TrainingRun):
    """The loaded target and conversations of a trainer's run."""

    target: Any
    tokenizer: Any
    #: Every conversation read from ``--data`` (the vocabulary and counts are taken over them).
    examples: list
    #: Whether the trained products run in bfloat16 (every rank agrees).
    bf16: bool
    #: The training softmax's tokens (``--train-vocab``; ``None``: all) and their reply share.
    vocabulary: TrainingVocabulary | None = None
    covered: float = 1.0
    #: Where the vocabulary's tokens came from, for the run's first line.
    vocabulary_source: str = "most frequent reply tokens"

    def summary(self, options: TrainingOptions) -> str:
        """What the run trains on and how, for the line it starts with."""
        line = (f"{len(self.examples)} conversations read ({reply_tokens(self.examples)} reply tokens), "
                f"{len(self.dataset)} trained on{heldout_note(self.heldout)}, {options.steps} steps x "
                f"{options.batch_size} x {self.world.size} process(es), "
                f"{'bfloat16 mixed' if self.bf16 else 'float32'} precision")
        if self.vocabulary is not None:
            line += f", softmax over the {len(self.vocabulary.ids)} {self.vocabulary_source} ({self.covered:.1%} of the replies)"
        return line


@contextmanager
def training_inputs(device: str | None, model: str | None, dtype: str, data: tuple[str, ...],
                    eval_data: tuple[str, ...], max_length: int, limit: int | None, precision: str,
                    batch_size: int, cache_states: str | None = None, train_vocab: int = 0,
                    draft_vocab: str | None = None, eval_fraction: float = 0.0, seed: int = 0,
                    **_: Any) -> Iterator[TrainingInputs]:
    """Join the process group (none for one process), load the target and the conversations,
    read their target states from ``cache_states`` (made first if need be), hold
    ``eval_fraction`` of them out and choose the training vocabulary; leave the group on the
    way out."""
    quiet_transformers()
    console = Console(stderr=True)
    world = join(resolve_device(device))
    try:
        with console.status("loading the target and the data"):
            target, tokenizer = load_model(model, dtype, world.device)
            examples = load_examples(data, tokenizer, max_length, limit)
            heldout = ExampleDataset(load_examples(eval_data, tokenizer, max_length, None, "--eval-data", "measure on")) \
                if eval_data else None
        dataset: torch.utils.data.Dataset = ExampleDataset(examples)
        if cache_states:
            identity = {"model": model or DEFAULT_MODEL, "hidden_size": int(target.config.hidden_size),
                        "dtype": str(next(target.parameters()).dtype).removeprefix("torch."), "max_length": max_length}
            dataset = _cached(cache_states, dataset, identity, FrozenTarget(target), batch_size, world, console)
        if eval_fraction:
            dataset, heldout = split_heldout(dataset, eval_fraction, seed)
        bf16 = every_rank(resolve_dtype(precision, world.device) == torch.bfloat16, world)
        vocab_size = int(target.get_output_embeddings().weight.shape[0])
        ranking = load_ranking(Path(draft_vocab), vocab_size) if draft_vocab else None
        vocabulary, covered = training_vocabulary(examples, train_vocab, vocab_size, ranking)
        yield TrainingInputs(world, console, dataset, heldout, target=target, tokenizer=tokenizer, examples=examples, bf16=bf16,
                             vocabulary=vocabulary, covered=covered,
                             **({"vocabulary_source": f"first tokens of {draft_vocab}"} if ranking is not None else {}))
    finally:
        leave(world)


def _cached(directory: str, dataset: ExampleDataset, identity: dict[str, Any], target: FrozenTarget, batch_size: int,
            world: World, console: Console) -> CachedStates:
    """``dataset`` with the target's states from the cache in ``directory``, made first if need be."""
    cached = open_cache(directory, dataset, identity)
    if cached is not None:
        return cached
    if world.distributed:
        raise ConfigError(f"--cache-states: {directory!r} holds no complete cache, and a multi-process run does not write "
                          "one; make it with one process first (the same command, --max-steps 1, no torchrun)")
    with Progress(TextColumn("[bold]caching target states"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=console) as progress:
        task = progress.add_task("cache", total=len(dataset))
        return write_cache(directory, dataset, target, identity, batch_size, lambda n: progress.update(task, advance=n))


def fit_options(options_class: type[TrainingOptions], inputs: TrainingInputs, max_steps: int | None, epochs: int,
                batch_size: int, lr: float, warmup: int, loss_decay: float, chunk_size: int, group_by_length: bool,
                seed: int, save_every: int, eval_every: int, train_vocab: int, **_: Any) -> TrainingOptions:
    """The loop's options from the common command-line options; ``--max-steps``, else ``--epochs``
    whole passes over the training conversations."""
    steps = max_steps or max(1, len(inputs.dataset) // (batch_size * inputs.world.size)) * epochs
    return options_class(steps=steps, batch_size=batch_size, lr=lr, warmup=warmup, decay=loss_decay, chunk=chunk_size,
                         bf16=inputs.bf16, group_by_length=group_by_length, seed=seed, save_every=save_every,
                         eval_every=eval_every, train_vocab=train_vocab)


def reply_tokens(examples: list) -> int:
    """The assistant tokens (the ones trained on) in ``examples``."""
    return sum(int(e.loss_mask.sum()) for e in examples)


def run_training(trainee: Trainee, inputs: TrainingRun, options: TrainingOptions, output: str, saved: dict | None,
                 export: Callable[[], None], unit: str, heldout_fields: Callable[[Any], dict[str, Any]],
                 heldout_line: Callable[[int, Any], str], record: dict[str, Any], data: tuple[str, ...],
                 eval_data: tuple[str, ...]) -> Position:
    """Train behind a progress bar; at each save point call ``export`` and write ``training.json``
    (``record``'s fields, the latest training figures per ``unit`` and ``heldout_fields`` of the
    latest held-out measurement); print each held-out measurement (``heldout_line``) and the
    run's speed at the end. Where it stopped."""
    world, last = inputs.world, dict(record)

    def save(at: Position) -> None:
        export()
        write_record(output, at, options, data, eval_data, inputs.heldout, **last)

    with TrainingProgress(inputs.console, options.steps, saved) as progress:

        def on_step(report: StepReport) -> None:
            last.update({"step": report.step, f"train_loss_per_{unit}": report.losses,
                         f"train_accuracy_per_{unit}": report.accuracies})
            progress.step(report.step, report.epoch, report.loss, report.accuracies, report.tokens)
            if report.heldout is not None:
                last.update(heldout_step=report.step, **heldout_fields(report.heldout))
                progress.print(heldout_line(report.step, report.heldout))

        at = fit(trainee, inputs.dataset, options, world, output, saved, on_step, save, inputs.heldout)
    if at.step == progress.start.step and world.is_main:
        save(at)  # nothing left to train: still leave the export of the saved state
    if (speed := progress.speed_line(at)) is not None:
        inputs.console.print(speed)
    return at
