"""``specdec train medusa``: Medusa-1 heads on a frozen target, from its own replies, in FasterDecoding's layout."""

from __future__ import annotations

from functools import partial

import click
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from specdec.cli.training import (DEFAULT_BASE, DTYPES, check_options, reply_tokens, run_training, saved_state,
                                  total_steps, trainer_options, training_inputs)
from specdec.errors import ConfigError
from specdec.models import DEFAULT_MODEL
from specdec.progress import Progress
from specdec.training.conversations import Example
from specdec.training.distributed import World
from specdec.training.examples import ExampleDataset
from specdec.training.reporting import heldout_note, per_output
from specdec.training.state import STATE_FILE
from specdec.training.target import FrozenTarget
from specdec.training.token_frequency import coverage, frequency_ranking, token_counts
from specdec_medusa.training.cache import CachedStates, open_cache, write_cache
from specdec_medusa.training.loop import Evaluation, FitOptions, MedusaTrainee, describe_shape, heads_shape
from specdec_medusa.training.model import export, new_heads
from specdec_medusa.training.objective import TrainingVocabulary


@click.command("medusa")
@trainer_options(output_help=f"Directory for the heads (FasterDecoding layout), training.json and {STATE_FILE}.",
                 unit="head", lr=1e-3, lr_help="Peak learning rate (AdamW), as Medusa's.", decay=0.8,
                 decay_help="Head k's loss weight: decay ** k (Medusa's 0.8).")
@click.option("--num-heads", type=int, default=4, show_default=True, help="Heads: head k drafts the token k + 2 ahead of the state.")
@click.option("--num-layers", type=int, default=1, show_default=True, help="Residual blocks per head.")
@click.option("--share-lm-head/--own-lm-head", default=True, show_default=True,
              help="Heads project through the target's frozen lm_head (residual blocks only: 0.3M parameters a head "
                   "for SmolLM2) or each through its own copy, trained (Medusa's original: +28M parameters a head).")
@click.option("--train-vocab", type=click.IntRange(min=0), default=0, show_default=True,
              help="Train each head's softmax over the this many most frequent reply tokens of --data only "
                   "(0: the whole vocabulary): the projection is the costliest part; the heads still draft over "
                   "every token.")
@click.option("--cache-states", type=click.Path(file_okay=False), default=None,
              help="Keep the target's final states of the training conversations in this directory (made on the first "
                   "run, about 1.2 kB a token for SmolLM2 in bfloat16): later epochs and resumed runs skip the target.")
def medusa(num_heads: int, num_layers: int, share_lm_head: bool, train_vocab: int, cache_states: str | None,
           **common) -> None:
    """Train Medusa heads (Medusa-1: the target frozen) on conversations the target answered."""
    check_options({"num-heads": num_heads, "num-layers": num_layers}, **common)
    output, batch_size = common["output"], common["batch_size"]
    saved = saved_state(output, common["resume"], heads_shape(num_heads, num_layers, share_lm_head), describe_shape)
    wrap = partial(_cached, cache_states, common["model"], common["max_length"], batch_size) if cache_states else None
    with training_inputs(wrap=wrap, **common) as inputs:
        target, dataset, world = inputs.target, inputs.dataset, inputs.world
        heads = new_heads(num_heads, num_layers, target.get_output_embeddings().weight, share_lm_head).to(world.device)
        options = FitOptions(steps=total_steps(common["max_steps"], common["epochs"], dataset, batch_size, world),
                             batch_size=batch_size, lr=common["lr"], warmup=common["warmup"], decay=common["loss_decay"],
                             chunk=common["chunk_size"], bf16=inputs.bf16, group_by_length=common["group_by_length"],
                             seed=common["seed"], save_every=common["save_every"], eval_every=common["eval_every"],
                             train_vocab=train_vocab)
        vocabulary, covered = _training_vocabulary(inputs.examples, train_vocab, heads.lm_heads[0].out_features)
        inputs.console.print(
            f"training {num_heads} Medusa heads x {num_layers} block(s), "
            f"{'sharing the target lm_head' if share_lm_head else 'each with its own lm_head'}: "
            f"{len(inputs.examples)} conversations read ({reply_tokens(inputs.examples)} reply tokens), "
            f"{len(dataset)} trained on{heldout_note(inputs.heldout)}, "
            f"{options.steps} steps x {batch_size} x {world.size} process(es), "
            f"{'bfloat16 mixed' if inputs.bf16 else 'float32'} precision"
            + (f", softmax over the {train_vocab} most frequent reply tokens ({covered:.1%} of them)" if vocabulary else ""))
        export_dtype, base = common["export_dtype"], common["model"] or DEFAULT_BASE
        run_training(MedusaTrainee(heads, FrozenTarget(target), options, vocabulary), inputs, options, output, saved,
                     lambda: export(heads, output, DTYPES[export_dtype], base), "head", _heldout_fields, _held_line,
                     {"share_lm_head": share_lm_head}, common["data"], common["eval_data"])
        inputs.console.print(f"wrote {num_heads} heads ({'shared' if share_lm_head else 'own'} lm_head, {export_dtype}) "
                             f"to {output}")


def _cached(directory: str, model: str | None, max_length: int, batch_size: int, dataset: ExampleDataset,
            target: torch.nn.Module, world: World, console: Console) -> CachedStates:
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
        return write_cache(directory, dataset, FrozenTarget(target), identity, batch_size, lambda n: progress.update(task, advance=n))


def _held_line(step: int, evaluation: Evaluation) -> str:
    return (f"step {step}: held-out loss per head {per_output(evaluation.losses)}, top-1 {per_output(evaluation.accuracies)}, "
            f"estimated chain acceptance length {evaluation.acceptance_length:.2f}")


def _heldout_fields(evaluation: Evaluation) -> dict[str, object]:
    return {"heldout_loss_per_head": evaluation.losses, "heldout_accuracy_per_head": evaluation.accuracies,
            "heldout_chain_acceptance_length": evaluation.acceptance_length}


def _training_vocabulary(examples: list[Example], size: int, vocab_size: int) -> tuple[TrainingVocabulary | None, float]:
    """The ``size`` most frequent reply tokens of the training conversations, and the share of
    reply tokens they cover; ``None`` for the whole vocabulary (``size`` 0 or not smaller)."""
    if not size or size >= vocab_size:
        return None, 1.0
    assistant, every = token_counts(((e.input_ids, e.loss_mask) for e in examples), vocab_size)
    kept = frequency_ranking(assistant, every)[:size]
    return TrainingVocabulary(kept, vocab_size), coverage(assistant, kept)

