"""What the core's training loop (:func:`specdec.training.loop.fit`) needs to train Medusa heads.

Each step runs the target once over a batch of conversations (no gradient) for its final normed
states, or reads them from the cache (:mod:`~specdec.training.state_cache`), and trains every
head on them (:func:`~specdec_medusa.training.objective.medusa_loss`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from specdec.training import (
    Scores,
    TrainingOptions,
    TrainingVocabulary,
    World,
    chain_acceptance,
    collate,
    conversation_lengths,
    sum_across,
)
from specdec_medusa.heads import MedusaHeads
from specdec_medusa.training.model import trainable_state
from specdec_medusa.training.objective import medusa_loss


@dataclass
class FitOptions(TrainingOptions):
    #: Head ``k``'s loss weight is ``decay ** k`` (Medusa's 0.8).
    decay: float = 0.8


@dataclass
class Evaluation:
    losses: list[float]
    accuracies: list[float]
    #: Estimated mean acceptance length of greedy chain drafting (:func:`specdec.training.chain_acceptance`).
    acceptance_length: float


class MedusaTrainee:
    """Medusa heads as the core loop trains them (:class:`specdec.training.loop.Trainee`):
    ``vocabulary`` narrows the training softmax (held-out measurements take the whole vocabulary)."""

    def __init__(self, heads: MedusaHeads, target: Callable[[dict[str, torch.Tensor]], torch.Tensor], options: FitOptions,
                 vocabulary: TrainingVocabulary | None = None) -> None:
        self.module, self.target, self.options = heads, target, options
        self.device = next(heads.parameters()).device
        self.vocabulary = vocabulary.to(self.device) if vocabulary is not None else None

    def parameters(self) -> dict[str, torch.Tensor]:
        return trainable_state(self.module)

    def shape(self) -> dict[str, Any]:
        return heads_shape(self.module.num_heads, len(self.module.blocks[0]), self.module.uses_target_lm_head)

    def loss(self, batch: dict[str, torch.Tensor]) -> Scores:
        return medusa_loss(self.module, self.target(batch), batch["input_ids"].to(self.device),
                           batch["loss_mask"].to(self.device), self.options.decay, self.options.chunk, backward=True,
                           bf16=self.options.bf16, vocabulary=self.vocabulary)

    def evaluate(self, dataset: torch.utils.data.Dataset, world: World) -> Evaluation:
        return evaluate(self.module, self.target, dataset, self.options, world)


def heads_shape(num_heads: int, num_layers: int, shared_lm_head: bool) -> dict[str, Any]:
    """What a resumed run must match: the heads' count, blocks per head, shared or own ``lm_head``."""
    return {"num_heads": num_heads, "num_layers": num_layers, "shared_lm_head": shared_lm_head}


def describe_shape(shape: dict[str, Any]) -> str:
    return f"heads {shape}"


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
        walk = chain_acceptance(scores.hits, scores.scored, mask)
        totals = [t + v for t, v in zip(totals, [*scores.loss_sums, *scores.correct, *scores.counts, *walk])]
    totals = sum_across(totals, world)
    scores = Scores(totals[:k], totals[k : 2 * k], totals[2 * k : 3 * k])
    steps, accepted = totals[3 * k :]
    return Evaluation(scores.losses(), scores.accuracies(), 1 + accepted / steps if steps else 1.0)
