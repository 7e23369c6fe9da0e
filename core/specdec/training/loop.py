"""The drafter trainers' optimization loop: resumable, on one process or many (torch.distributed).

A trainer (Medusa heads, MTP layers, EAGLE-3 heads) hands :func:`fit` a :class:`Trainee`: its trainable
parameters, the shape a resumed run must match, a loss that runs the forward and backward of one
batch, and a held-out measurement. The loop owns everything else: AdamW with warm-up and cosine
decay, gradient averaging across processes and clipping, the position in the epoch, held-out
measurements and save points. The batches of an epoch depend only on the seed and the epoch
(:class:`~specdec.training.batching.LengthGroupedBatches`), so a saved state (parameters,
optimizer, schedule, position) is all a resumed run needs to take exactly the steps an
uninterrupted run would have taken.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from specdec.errors import ConfigError
from specdec.training.batching import LengthGroupedBatches, collate, conversation_lengths
from specdec.training.distributed import World, average_gradients, broadcast_parameters
from specdec.training.schedule import warmup_cosine
from specdec.training.state import Position, Scores, TrainingOptions, restore_state, save_state


class Trainee(Protocol):
    """What :func:`fit` trains."""

    #: The module whose parameters rank 0 broadcasts to the others before the first step.
    module: torch.nn.Module

    def parameters(self) -> dict[str, torch.Tensor]:
        """The trainable parameters by name: what the optimizer steps and the state saves."""

    def shape(self) -> dict[str, Any]:
        """What a resumed run must match (head or layer counts and kinds), saved with the state."""

    def loss(self, batch: dict[str, torch.Tensor]) -> Scores:
        """Forward and backward of one collated batch (gradients accumulate in the parameters);
        this rank's scores."""

    def evaluate(self, dataset: torch.utils.data.Dataset, world: World) -> Any:
        """The held-out measurement over ``dataset``, each rank a share, summed across ranks."""


@dataclass
class StepReport:
    step: int
    epoch: int
    #: The step's objective (:meth:`Scores.weighted_loss`), and per output its loss and top-1 accuracy.
    loss: float
    losses: list[float]
    accuracies: list[float]
    #: Conversation tokens in the step's batches (every rank's, padding left out).
    tokens: int = 0
    #: The trainee's held-out measurement, on the steps that take one.
    heldout: Any = None


def check_shape(state: dict[str, Any], shape: dict[str, Any], describe: Callable[[dict[str, Any]], str] = str) -> None:
    """A one-line error unless a saved state was made for a trainee of ``shape``; ``describe``
    words a shape for the message."""
    if state["shape"] != shape:
        raise ConfigError(f"--resume: the saved state holds {describe(state['shape'])}, this run asks for {describe(shape)}")


def fit(trainee: Trainee, dataset: torch.utils.data.Dataset, options: TrainingOptions, world: World,
        state_dir: str | Path | None = None, resume: dict[str, Any] | None = None,
        on_step: Callable[[StepReport], None] | None = None, on_save: Callable[[Position], None] | None = None,
        heldout: torch.utils.data.Dataset | None = None) -> Position:
    """Train ``trainee`` in place until ``options.steps`` optimizer steps; returns where it stopped.

    ``on_step`` gets every step's report (rank 0), with the held-out measurement on the steps that
    take one (each epoch's end, the last step, every ``options.eval_every``). At every save point
    (the same, with ``options.save_every``) rank 0 calls ``on_save`` (which exports), then, with
    ``state_dir``, saves the training state there. ``resume``: a state read by
    :func:`~specdec.training.state.read_state` to continue from.
    """
    parameters = trainee.parameters()
    params = list(parameters.values())
    optimizer = torch.optim.AdamW(params, lr=options.lr, betas=options.betas, weight_decay=options.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(options.steps, options.warmup, floor=0.0))
    sampler = LengthGroupedBatches(conversation_lengths(dataset), options.batch_size, world, options.seed,
                                   group=50 if options.group_by_length else 1)
    if len(sampler) == 0:
        raise ConfigError(f"the training data holds {len(dataset)} conversations: too few for a batch of "
                          f"{options.batch_size} on each of {world.size} processes")
    at = Position()
    if resume is not None:
        check_shape(resume, trainee.shape())
        at = restore_state(resume, parameters, optimizer, scheduler)
    broadcast_parameters(trainee.module, world)
    trainee.module.train()
    while at.step < options.steps:
        sampler.set_epoch(at.epoch)
        batches = list(sampler)
        for indices in batches[at.batch :]:
            batch = collate([dataset[i] for i in indices])
            optimizer.zero_grad(set_to_none=True)
            scores = trainee.loss(batch)
            average_gradients(params, world)
            torch.nn.utils.clip_grad_norm_(params, options.max_grad_norm)
            optimizer.step()
            scheduler.step()
            at = Position(at.step + 1, at.epoch, at.batch + 1)
            if at.batch == len(batches):
                at = Position(at.step, at.epoch + 1, 0)
            scores, tokens = scores.summed(int(batch["length"].sum()), world)
            report = StepReport(at.step, at.epoch, scores.weighted_loss(options.decay), scores.losses(),
                                scores.accuracies(), tokens)
            boundary = at.batch == 0 or at.step == options.steps
            if heldout is not None and (boundary or (options.eval_every and at.step % options.eval_every == 0)):
                report.heldout = trainee.evaluate(heldout, world)
            if on_step is not None and world.is_main:
                on_step(report)
            if world.is_main and (boundary or (options.save_every and at.step % options.save_every == 0)):
                if on_save is not None:
                    on_save(at)
                if state_dir is not None:
                    save_state(Path(state_dir), parameters, optimizer, scheduler, at, options, trainee.shape())
            if at.step == options.steps:
                break
    return at
