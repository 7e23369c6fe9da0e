"""Train Medusa heads on a frozen target, resumably, on one process or many (torch.distributed).

Each step runs the target once over a batch of conversations (no gradient) for its final normed
states and trains every head on them (:func:`~specdec_medusa.training.objective.medusa_loss`).
The batches of an epoch depend only on the seed and the epoch
(:class:`~specdec.training.batching.LengthGroupedBatches`), so a saved state (heads, optimizer,
schedule, step and the position in the epoch) is all a resumed run needs to take exactly the
steps an uninterrupted run would have taken.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specdec.errors import ConfigError
from specdec.training.batching import LengthGroupedBatches, collate, conversation_lengths
from specdec.training.distributed import World, average_gradients, broadcast_parameters, sum_across
from specdec.training.schedule import warmup_cosine
from specdec.training.state import Position, TrainingOptions, restore_state
from specdec.training.state import save_state as save_training_state
from specdec_medusa.heads import MedusaHeads
from specdec_medusa.training.model import trainable_state
from specdec_medusa.training.objective import HeadScores, TrainingVocabulary, chain_acceptance, medusa_loss


@dataclass
class FitOptions(TrainingOptions):
    #: Head ``k``'s loss weight is ``decay ** k`` (Medusa's 0.8).
    decay: float = 0.8
    #: Train the softmax over the this many most frequent reply tokens (0: the whole vocabulary).
    train_vocab: int = 0


@dataclass
class Evaluation:
    losses: list[float]
    accuracies: list[float]
    #: Estimated mean acceptance length of greedy chain drafting (:func:`chain_acceptance`).
    acceptance_length: float


@dataclass
class StepReport:
    step: int
    epoch: int
    #: The step's objective (``sum_k decay ** k * loss_k``), and per head its loss and top-1 accuracy.
    loss: float
    losses: list[float]
    accuracies: list[float]
    #: Conversation tokens in the step's batches (every rank's, padding left out).
    tokens: int = 0
    heldout: Evaluation | None = None


class TargetStates:
    """The frozen target's final normed states (what its ``lm_head`` reads) for a batch: the
    batch's own ``hidden`` when it carries them (:mod:`~specdec_medusa.training.cache`), else a
    forward of the target."""

    def __init__(self, model: Any) -> None:
        self.model = model.eval().requires_grad_(False)
        self.device = next(model.parameters()).device

    @torch.no_grad()
    def __call__(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if "hidden" in batch:
            return batch["hidden"].to(self.device)
        ids = batch["input_ids"].to(self.device)
        attention = (torch.arange(ids.shape[1])[None] < batch["length"][:, None]).long().to(self.device)
        # The decoder alone: the target's own vocabulary projection over every position is not needed.
        return self.model.get_decoder()(input_ids=ids, attention_mask=attention, use_cache=False).last_hidden_state


def fit(heads: MedusaHeads, target: Callable[[dict[str, torch.Tensor]], torch.Tensor], dataset: torch.utils.data.Dataset,
        options: FitOptions, world: World, state_dir: str | Path | None = None, resume: dict[str, Any] | None = None,
        on_step: Callable[[StepReport], None] | None = None, on_save: Callable[[Position], None] | None = None,
        heldout: torch.utils.data.Dataset | None = None, vocabulary: TrainingVocabulary | None = None) -> Position:
    """Train ``heads`` in place until ``options.steps`` optimizer steps; returns where it stopped.

    ``on_step`` gets every step's report (rank 0), with the held-out measurement on the steps that
    take one. At every save point rank 0 calls ``on_save`` (which exports the heads), then, with
    ``state_dir``, saves the training state there. ``resume``: a state read by :func:`read_state`
    to continue from. ``vocabulary`` narrows the training softmax (held-out measurements take
    the whole vocabulary).
    """
    params = list(trainable_state(heads).values())
    optimizer = torch.optim.AdamW(params, lr=options.lr, weight_decay=options.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(options.steps, options.warmup, floor=0.0))
    sampler = LengthGroupedBatches(conversation_lengths(dataset), options.batch_size, world, options.seed,
                                   group=50 if options.group_by_length else 1)
    if len(sampler) == 0:
        raise ConfigError(f"the training data holds {len(dataset)} conversations: too few for a batch of "
                          f"{options.batch_size} on each of {world.size} processes")
    at = Position() if resume is None else load_state(resume, heads, optimizer, scheduler)
    broadcast_parameters(heads, world)
    device = next(iter(params)).device
    vocabulary = vocabulary.to(device) if vocabulary is not None else None
    while at.step < options.steps:
        sampler.set_epoch(at.epoch)
        batches = list(sampler)
        indices = batches[at.batch]
        batch = collate([dataset[i] for i in indices])
        hidden = target(batch)
        optimizer.zero_grad(set_to_none=True)
        scores = medusa_loss(heads, hidden, batch["input_ids"].to(device), batch["loss_mask"].to(device),
                             options.decay, options.chunk, backward=True, bf16=options.bf16,
                             vocabulary=vocabulary)
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
            report.heldout = evaluate(heads, target, heldout, options, world)
        if on_step is not None and world.is_main:
            on_step(report)
        if world.is_main and (boundary or (options.save_every and at.step % options.save_every == 0)):
            if on_save is not None:
                on_save(at)
            if state_dir is not None:
                save_state(Path(state_dir), heads, optimizer, scheduler, at, options)
    return at


@torch.no_grad()
def evaluate(heads: MedusaHeads, target: Callable[[dict[str, torch.Tensor]], torch.Tensor], dataset: torch.utils.data.Dataset,
             options: FitOptions, world: World) -> Evaluation:
    """Per head mean loss and top-1 accuracy over ``dataset`` (each rank a share, float32), and the
    estimated acceptance length of greedy chain drafting over its replies."""
    lengths = conversation_lengths(dataset)
    items = sorted(range(world.rank, len(dataset), world.size), key=lambda i: lengths[i])
    k = heads.num_heads
    totals = [0.0] * (3 * k + 2)
    device = next(heads.parameters()).device
    for start in range(0, len(items), options.batch_size):
        batch = collate([dataset[i] for i in items[start : start + options.batch_size]])
        mask = batch["loss_mask"].to(device)
        scores = medusa_loss(heads, target(batch), batch["input_ids"].to(device), mask, options.decay, options.chunk,
                             keep_hits=True)
        walk = chain_acceptance(scores, mask)
        totals = [t + v for t, v in zip(totals, [*scores.loss_sums, *scores.correct, *scores.counts, *walk])]
    totals = sum_across(totals, world)
    scores = HeadScores(totals[:k], totals[k : 2 * k], totals[2 * k : 3 * k])
    steps, accepted = totals[3 * k :]
    return Evaluation(scores.losses(), scores.accuracies(), 1 + accepted / steps if steps else 1.0)


def save_state(directory: Path, heads: MedusaHeads, optimizer: torch.optim.Optimizer,
               scheduler: torch.optim.lr_scheduler.LRScheduler, at: Position, options: FitOptions) -> None:
    """Save what a resumed run needs (:func:`specdec.training.state.save_state`)."""
    save_training_state(directory, trainable_state(heads), optimizer, scheduler, at, options, _shape(heads))


def check_shape(state: dict[str, Any], num_heads: int, num_layers: int, shared_lm_head: bool) -> None:
    """A one-line error unless the saved state holds heads of this shape."""
    shape = {"num_heads": num_heads, "num_layers": num_layers, "shared_lm_head": shared_lm_head}
    if state["shape"] != shape:
        raise ConfigError(f"--resume: the saved state holds heads {state['shape']}, this run asks for {shape}")


def load_state(state: dict[str, Any], heads: MedusaHeads, optimizer: torch.optim.Optimizer,
               scheduler: torch.optim.lr_scheduler.LRScheduler) -> Position:
    """Restore a saved state into ``heads``, ``optimizer`` and ``scheduler``; where it stood."""
    check_shape(state, **_shape(heads))
    return restore_state(state, trainable_state(heads), optimizer, scheduler)


def _shape(heads: MedusaHeads) -> dict[str, Any]:
    return {"num_heads": heads.num_heads, "num_layers": len(heads.blocks[0]), "shared_lm_head": heads.uses_target_lm_head}
