"""Train MTP layers on a frozen target, resumably, on one process or many (torch.distributed).

Each step runs the target once over a batch of conversations (no gradient) for its final normed
states and trains every depth on them (:func:`~specdec_mtp.training.objective.mtp_loss`). The
batches of an epoch depend only on the seed and the epoch
(:class:`~specdec.training.batching.LengthGroupedBatches`), so a saved state (layers, optimizer,
schedule, step and the position in the epoch) is all a resumed run needs to take exactly the
steps an uninterrupted run would have taken.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specdec.errors import ConfigError
from specdec.training.batching import LengthGroupedBatches, collate, conversation_lengths
from specdec.training.distributed import World, average_gradients, broadcast_parameters, sum_across
from specdec.training.schedule import warmup_cosine
from specdec.training.state import Position, TrainingOptions, restore_state
from specdec.training.state import save_state as save_training_state
from specdec_mtp.training.model import trainable_state
from specdec_mtp.training.objective import DepthScores, mtp_loss


@dataclass
class FitOptions(TrainingOptions):
    lr: float = 3e-4
    #: Depth ``k``'s loss weight is ``decay ** (k - 1)`` (DeepSeek's equal weights: 1).
    decay: float = 1.0


@dataclass
class Evaluation:
    losses: list[float]
    accuracies: list[float]


@dataclass
class StepReport:
    step: int
    epoch: int
    #: The step's objective and per depth its loss and top-1 accuracy.
    loss: float
    losses: list[float]
    accuracies: list[float]
    #: Conversation tokens in the step's batches (every rank's, padding left out).
    tokens: int = 0
    heldout: Evaluation | None = None


class FrozenTarget:
    """What the layers read from the frozen target: its final normed states for a batch (a forward
    of its decoder), its input embedding and its rotary embedding."""

    def __init__(self, model: Any) -> None:
        self.model = model.eval().requires_grad_(False)
        self.device = next(model.parameters()).device
        self.embed = model.get_input_embeddings()
        self.rotary = model.get_decoder().rotary_emb

    @torch.no_grad()
    def __call__(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        ids = batch["input_ids"].to(self.device)
        attention = (torch.arange(ids.shape[1])[None] < batch["length"][:, None]).long().to(self.device)
        # The decoder alone: the target's own vocabulary projection over every position is not needed.
        return self.model.get_decoder()(input_ids=ids, attention_mask=attention, use_cache=False).last_hidden_state

    def loss(self, layers: nn.ModuleList, batch: dict[str, torch.Tensor], options: FitOptions,
             backward: bool = False) -> DepthScores:
        """:func:`mtp_loss` of ``layers`` over ``batch``."""
        ids, mask = batch["input_ids"].to(self.device), batch["loss_mask"].to(self.device)
        return mtp_loss(layers, self.embed, self.rotary, self(batch), ids, mask, options.decay, options.chunk,
                        backward=backward, bf16=options.bf16)


def fit(layers: nn.ModuleList, target: FrozenTarget, dataset: torch.utils.data.Dataset, options: FitOptions, world: World,
        state_dir: str | Path | None = None, resume: dict[str, Any] | None = None,
        on_step: Callable[[StepReport], None] | None = None, on_save: Callable[[Position], None] | None = None,
        heldout: torch.utils.data.Dataset | None = None) -> Position:
    """Train ``layers`` in place until ``options.steps`` optimizer steps; returns where it stopped.

    ``on_step`` gets every step's report (rank 0), with the held-out measurement on the steps that
    take one. At every save point rank 0 calls ``on_save`` (which exports the layers), then, with
    ``state_dir``, saves the training state there. ``resume``: a state read by :func:`read_state`.
    """
    params = list(trainable_state(layers).values())
    optimizer = torch.optim.AdamW(params, lr=options.lr, weight_decay=options.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(options.steps, options.warmup, floor=0.0))
    sampler = LengthGroupedBatches(conversation_lengths(dataset), options.batch_size, world, options.seed,
                                   group=50 if options.group_by_length else 1)
    if len(sampler) == 0:
        raise ConfigError(f"the training data holds {len(dataset)} conversations: too few for a batch of "
                          f"{options.batch_size} on each of {world.size} processes")
    at = Position() if resume is None else load_state(resume, layers, optimizer, scheduler)
    broadcast_parameters(layers, world)
    layers.train()
    while at.step < options.steps:
        sampler.set_epoch(at.epoch)
        batches = list(sampler)
        batch = collate([dataset[i] for i in batches[at.batch]])
        optimizer.zero_grad(set_to_none=True)
        scores = target.loss(layers, batch, options, backward=True)
        average_gradients(params, world)
        torch.nn.utils.clip_grad_norm_(params, options.max_grad_norm)
        optimizer.step()
        scheduler.step()
        at = Position(at.step + 1, at.epoch, at.batch + 1)
        if at.batch == len(batches):
            at = Position(at.step, at.epoch + 1, 0)
        scores, tokens = scores.summed(int(batch["length"].sum()), world)
        report = StepReport(at.step, at.epoch, scores.weighted_loss(options.decay), scores.losses(), scores.accuracies(),
                            tokens)
        boundary = at.batch == 0 or at.step == options.steps
        if heldout is not None and (boundary or (options.eval_every and at.step % options.eval_every == 0)):
            report.heldout = evaluate(layers, target, heldout, options, world)
        if on_step is not None and world.is_main:
            on_step(report)
        if world.is_main and (boundary or (options.save_every and at.step % options.save_every == 0)):
            if on_save is not None:
                on_save(at)
            if state_dir is not None:
                save_state(Path(state_dir), layers, optimizer, scheduler, at, options)
    return at


@torch.no_grad()
def evaluate(layers: nn.ModuleList, target: FrozenTarget, dataset: torch.utils.data.Dataset, options: FitOptions,
             world: World) -> Evaluation:
    """Per depth mean loss and top-1 accuracy over ``dataset`` (each rank a share, float32)."""
    was_training = layers.training
    layers.eval()
    lengths = conversation_lengths(dataset)
    items = sorted(range(world.rank, len(dataset), world.size), key=lambda i: lengths[i])
    n = len(layers)
    totals = [0.0] * (3 * n)
    plain = FitOptions(**{**asdict(options), "bf16": False})
    for start in range(0, len(items), options.batch_size):
        scores = target.loss(layers, collate([dataset[i] for i in items[start : start + options.batch_size]]), plain)
        totals = [t + v for t, v in zip(totals, [*scores.loss_sums, *scores.correct, *scores.counts])]
    totals = sum_across(totals, world)
    layers.train(was_training)
    scores = DepthScores(totals[:n], totals[n : 2 * n], totals[2 * n :])
    return Evaluation(scores.losses(), scores.accuracies())


def save_state(directory: Path, layers: nn.ModuleList, optimizer: torch.optim.Optimizer,
               scheduler: torch.optim.lr_scheduler.LRScheduler, at: Position, options: FitOptions) -> None:
    """Save what a resumed run needs (:func:`specdec.training.state.save_state`)."""
    save_training_state(directory, trainable_state(layers), optimizer, scheduler, at, options, {"num_layers": len(layers)})


def check_shape(state: dict[str, Any], num_layers: int) -> None:
    """A one-line error unless the saved state holds ``num_layers`` layers."""
    if state["shape"] != {"num_layers": num_layers}:
        raise ConfigError(f"--resume: the saved state holds {state['shape']['num_layers']} MTP layer(s), "
                          f"this run asks for {num_layers}")


def load_state(state: dict[str, Any], layers: nn.ModuleList, optimizer: torch.optim.Optimizer,
               scheduler: torch.optim.lr_scheduler.LRScheduler) -> Position:
    """Restore a saved state into ``layers``, ``optimizer`` and ``scheduler``; where it stood."""
    check_shape(state, len(layers))
    return restore_state(state, trainable_state(layers), optimizer, scheduler)
