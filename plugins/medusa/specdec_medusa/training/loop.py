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

from specdec.training import ChainEvaluation, Scores, TrainingOptions, TrainingVocabulary, World, evaluate_chain
from specdec_medusa.heads import MedusaHeads
from specdec_medusa.training.model import trainable_state
from specdec_medusa.training.objective import medusa_loss


@dataclass
class FitOptions(TrainingOptions):
    #: Head ``k``'s loss weight is ``decay ** k`` (Medusa's 0.8).
    decay: float = 0.8


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

    def evaluate(self, dataset: torch.utils.data.Dataset, world: World) -> ChainEvaluation:
        return evaluate(self.module, self.target, dataset, self.options, world)


def heads_shape(num_heads: int, num_layers: int, shared_lm_head: bool) -> dict[str, Any]:
    """What a resumed run must match: the heads' count, blocks per head, shared or own ``lm_head``."""
    return {"num_heads": num_heads, "num_layers": num_layers, "shared_lm_head": shared_lm_head}


def describe_shape(shape: dict[str, Any]) -> str:
    return f"heads {shape}"


def evaluate(heads: MedusaHeads, target: Callable[[dict[str, torch.Tensor]], torch.Tensor], dataset: torch.utils.data.Dataset,
             options: FitOptions, world: World) -> ChainEvaluation:
    """Per head mean loss and top-1 accuracy over ``dataset`` (each rank a share, float32), and the
    estimated acceptance length of greedy chain drafting over its replies."""
    device = next(heads.parameters()).device

    def score(batch: dict[str, torch.Tensor], mask: torch.Tensor) -> Scores:
        return medusa_loss(heads, target(batch), batch["input_ids"].to(device), mask, options.decay, options.chunk,
                           keep_hits=True)

    return evaluate_chain(score, heads.num_heads, dataset, options.batch_size, world, device)
