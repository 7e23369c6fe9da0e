"""``specdec train medusa``: Medusa-1 heads on a frozen target, from its own replies, in FasterDecoding's layout."""

from __future__ import annotations

from pathlib import Path

import click
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from specdec.cli.common import quiet_transformers
from specdec.errors import ConfigError
from specdec.models import DEFAULT_MODEL, load_model, resolve_device, resolve_dtype
from specdec.progress import Progress
from specdec.training.conversations import Example
from specdec.training.distributed import World, every_rank, join, leave
from specdec.training.examples import ExampleDataset, load_examples
from specdec.training.reporting import TrainingProgress, heldout_note, per_output, split_heldout, write_record
from specdec.training.token_frequency import coverage, frequency_ranking, token_counts
from specdec.training.state import STATE_FILE, Position, read_state
from specdec_medusa.training.cache import CachedStates, open_cache, write_cache
from specdec_medusa.training.loop import Evaluation, FitOptions, StepReport, TargetStates, check_shape, fit
from specdec_medusa.training.model import export, new_heads
from specdec_medusa.training.objective import TrainingVocabulary

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _check(num_heads: int, num_layers: int, epochs: int, max_steps: int | None, batch_size: int, lr: float,
           eval_fraction: float, eval_data: tuple[str, ...], max_length: int, chunk_size: int) -> None:
    """One-line errors for options click's types do not already bound."""
    for name, value in (("num-heads", num_heads), ("num-layers", num_layers), ("epochs", epochs), ("batch-size", batch_size),
                        ("max-length", max_length), ("chunk-size", chunk_size)):
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


@click.command("medusa")
@click.option("--data", multiple=True, required=True, type=click.Path(dir_okay=False),
              help="Conversations jsonl(.xz) the target answered itself (`specdec synthesize`, training-data/); repeatable.")
@click.option("--output", required=True, type=click.Path(file_okay=False),
              help=f"Directory for the heads (FasterDecoding layout), training.json and {STATE_FILE}.")
@click.option("--model", default=None, help="Target: HF id or local dir (default: embedded SmolLM2-135M-Instruct).")
@click.option("--dtype", type=click.Choice(["auto", *DTYPES]), default="auto", show_default=True, help="Target dtype.")
@click.option("--device", default=None, help="cuda or cpu (default: CUDA when present).")
@click.option("--num-heads", type=int, default=4, show_default=True, help="Heads: head k drafts the token k + 2 ahead of the state.")
@click.option("--num-layers", type=int, default=1, show_default=True, help="Residual blocks per head.")
@click.option("--share-lm-head/--own-lm-head", default=True, show_default=True,
              help="Heads project through the target's frozen lm_head (residual blocks only: 0.3M parameters a head "
                   "for SmolLM2) or each through its own copy, trained (Medusa's original: +28M parameters a head).")
@click.option("--epochs", type=int, default=1, show_default=True, help="Passes over the data.")
@click.option("--max-steps", type=int, default=None, help="Optimizer steps in all (instead of --epochs).")
@click.option("--batch-size", type=int, default=8, show_default=True, help="Conversations per step and process.")
@click.option("--max-length", type=int, default=2048, show_default=True, help="Truncate conversations to this many tokens.")
@click.option("--limit", type=int, default=None, help="Train on the first this many conversations only.")
@click.option("--lr", type=float, default=1e-3, show_default=True, help="Peak learning rate (AdamW), as Medusa's.")
@click.option("--warmup", type=click.IntRange(min=0), default=20, show_default=True,
              help="Linear warm-up steps, then cosine decay to 0.")
@click.option("--loss-decay", type=click.FloatRange(0, 1, min_open=True), default=0.8, show_default=True,
              help="Head k's loss weight: decay ** k (Medusa's 0.8).")
@click.option("--precision", type=click.Choice(["auto", "bfloat16", "float32"]), default="auto", show_default=True,
              help="The heads' matrix products: bfloat16 (mixed; weights and losses stay float32) or float32. "
                   "auto: bfloat16 where the device computes it natively (CUDA, CPUs with AMX or AVX512-BF16).")
@click.option("--chunk-size", type=int, default=1024, show_default=True,
              help="Positions per head whose vocabulary logits are computed at once (memory: chunk x vocab floats).")
@click.option("--train-vocab", type=click.IntRange(min=0), default=0, show_default=True,
              help="Train each head's softmax over the this many most frequent reply tokens of --data only "
                   "(0: the whole vocabulary): the projection is the costliest part; the heads still draft over "
                   "every token.")
@click.option("--group-by-length/--no-group-by-length", default=True, show_default=True,
              help="Batch conversations of similar length together (less padding) rather than at random.")
@click.option("--eval-fraction", type=float, default=0.0, show_default=True,
              help="Share of the conversations held out (seeded) to measure loss and accuracy on.")
@click.option("--eval-data", multiple=True, type=click.Path(dir_okay=False),
              help="Measure on these conversations instead of --eval-fraction; repeatable.")
@click.option("--eval-every", type=click.IntRange(min=0), default=0, show_default=True,
              help="Also measure the held-out set every this many steps (always: each epoch's end).")
@click.option("--save-every", type=click.IntRange(min=0), default=0, show_default=True,
              help="Also export and save the training state every this many steps (always: each epoch's end).")
@click.option("--cache-states", type=click.Path(file_okay=False), default=None,
              help="Keep the target's final states of the training conversations in this directory (made on the first "
                   "run, about 1.2 kB a token for SmolLM2 in bfloat16): later epochs and resumed runs skip the target.")
@click.option("--resume", is_flag=True, help=f"Continue from --output's {STATE_FILE} (same heads; the data and seed must match).")
@click.option("--export-dtype", type=click.Choice(list(DTYPES)), default="bfloat16", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def medusa(data, output, model, dtype, device, num_heads, num_layers, share_lm_head, epochs, max_steps, batch_size,
           max_length, limit, lr, warmup, loss_decay, precision, chunk_size, train_vocab, group_by_length, eval_fraction,
           eval_data,
           eval_every, save_every, cache_states, resume, export_dtype, seed) -> None:
    """Train Medusa heads (Medusa-1: the target frozen) on conversations the target answered."""
    _check(num_heads, num_layers, epochs, max_steps, batch_size, lr, eval_fraction, eval_data, max_length, chunk_size)
    for path in (*data, *eval_data):
        if not Path(path).is_file():
            raise ConfigError(f"--data: no file {path!r}" if path in data else f"--eval-data: no file {path!r}")
    saved = None
    if resume:
        saved = read_state(output)
        check_shape(saved, num_heads, num_layers, share_lm_head)
    elif (Path(output) / STATE_FILE).exists():
        raise ConfigError(f"--output: {output!r} holds a training state; pass --resume to continue it or choose another directory")
    quiet_transformers()
    console = Console(stderr=True)
    world = join(resolve_device(device))
    try:
        with console.status("loading the target and the data"):
            target, tokenizer = load_model(model, dtype, world.device)
            examples = load_examples(data, tokenizer, max_length, limit)
            heldout = ExampleDataset(load_examples(eval_data, tokenizer, max_length, None, "--eval-data", "measure on")) \
                if eval_data else None
        dataset = ExampleDataset(examples)
        states = TargetStates(target)
        if cache_states:
            dataset = _cached(cache_states, dataset, states, model, target, max_length, batch_size, world, console)
        if eval_fraction:
            dataset, heldout = split_heldout(dataset, eval_fraction, seed)
        bf16 = every_rank(resolve_dtype(precision, world.device) == torch.bfloat16, world)
        heads = new_heads(num_heads, num_layers, target.get_output_embeddings().weight, share_lm_head).to(world.device)
        per_epoch = max(1, len(dataset) // (batch_size * world.size))
        options = FitOptions(steps=max_steps or per_epoch * epochs, batch_size=batch_size, lr=lr, warmup=warmup,
                             decay=loss_decay, chunk=chunk_size, bf16=bf16, group_by_length=group_by_length, seed=seed,
                             save_every=save_every, eval_every=eval_every, train_vocab=train_vocab)
        vocabulary, covered = _training_vocabulary(examples, train_vocab, heads.lm_heads[0].out_features)
        assistant = sum(int(e.loss_mask.sum()) for e in examples)
        console.print(f"training {num_heads} Medusa heads x {num_layers} block(s), "
                      f"{'sharing the target lm_head' if share_lm_head else 'each with its own lm_head'}: "
                      f"{len(examples)} conversations read ({assistant} reply tokens), {len(dataset)} trained on"
                      f"{heldout_note(heldout)}, "
                      f"{options.steps} steps x {batch_size} x {world.size} process(es), "
                      f"{'bfloat16 mixed' if bf16 else 'float32'} precision"
                      + (f", softmax over the {train_vocab} most frequent reply tokens ({covered:.1%} of them)" if vocabulary else ""))
        base = model or "HuggingFaceTB/SmolLM2-135M-Instruct"  # the embedded default's hub id, as FasterDecoding records it
        last: dict[str, object] = {}

        def save(at: Position) -> None:
            export(heads, output, DTYPES[export_dtype], base)
            write_record(output, at, options, data, eval_data, heldout, share_lm_head=share_lm_head, **last)

        with TrainingProgress(console, options.steps, saved) as progress:

            def on_step(report: StepReport) -> None:
                last.update(step=report.step, train_loss_per_head=report.losses, train_accuracy_per_head=report.accuracies)
                progress.step(report.step, report.epoch, report.loss, report.accuracies, report.tokens)
                if report.heldout is not None:
                    _record(last, report.heldout, report.step)
                    progress.print(_held_line(report.step, report.heldout))

            at = fit(heads, states, dataset, options, world, output, saved, on_step, save, heldout, vocabulary)
        if at.step == progress.start.step and world.is_main:
            save(at)  # nothing left to train: still leave the heads of the saved state
        if (speed := progress.speed_line(at)) is not None:
            console.print(speed)
        console.print(f"wrote {num_heads} heads ({'shared' if share_lm_head else 'own'} lm_head, {export_dtype}) to {output}")
    finally:
        leave(world)


def _cached(directory: str, dataset: ExampleDataset, states: TargetStates, model: str | None, target: torch.nn.Module,
            max_length: int, batch_size: int, world: World, console: Console) -> CachedStates:
    """``dataset`` with the target's states from the cache in ``directory``, made first if need be."""
    identity = {"model": model or DEFAULT_MODEL, "hidden_size": int(target.config.hidden_size),
                "dtype": str(next(target.parameters()).dtype).removeprefix("torch."), "max_length": max_length}
    cached = open_cache(directory, dataset, identity)
    if cached is not None:
        return cached
    if world.distributed:
        raise ConfigError(f"--cache-states: {directory!r} holds no complete cache, and a multi-process run does not write "
                          "one; make it with one process first (the same command, --max-steps 1, no torchrun)")
    with Progress(TextColumn("[bold]caching target states"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=console) as progress:
        task = progress.add_task("cache", total=len(dataset))
        return write_cache(directory, dataset, states, identity, batch_size, lambda n: progress.update(task, advance=n))


def _held_line(step: int, evaluation: Evaluation) -> str:
    return (f"step {step}: held-out loss per head {per_output(evaluation.losses)}, top-1 {per_output(evaluation.accuracies)}, "
            f"estimated chain acceptance length {evaluation.acceptance_length:.2f}")


def _record(record: dict[str, object], evaluation: Evaluation, step: int) -> None:
    record.update(heldout_step=step, heldout_loss_per_head=evaluation.losses, heldout_accuracy_per_head=evaluation.accuracies,
                  heldout_chain_acceptance_length=evaluation.acceptance_length)


def _training_vocabulary(examples: list[Example], size: int, vocab_size: int) -> tuple[TrainingVocabulary | None, float]:
    """The ``size`` most frequent reply tokens of the training conversations, and the share of
    reply tokens they cover; ``None`` for the whole vocabulary (``size`` 0 or not smaller)."""
    if not size or size >= vocab_size:
        return None, 1.0
    assistant, every = token_counts(((e.input_ids, e.loss_mask) for e in examples), vocab_size)
    kept = frequency_ranking(assistant, every)[:size]
    return TrainingVocabulary(kept, vocab_size), coverage(assistant, kept)

