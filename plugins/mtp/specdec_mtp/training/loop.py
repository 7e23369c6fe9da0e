"""What the core's training loop (:func:`specdec.training.loop.fit`) needs to train MTP layers.

Each step runs the target once over a batch of conversations (no gradient) for its final normed
states and trains every depth on them (:func:`~specdec_mtp.training.objective.mtp_loss`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from specdec.training import (
    FrozenTarget,
    TrainingOptions,
    TrainingVocabulary,
    World,
    collate,
    conversation_lengths,
    sum_across,
)
from specdec_mtp.training.model import trainable_state
from specdec_mtp.training.objective import DepthScores, mtp_loss


@dataclass
class FitOptions(TrainingOptions):
    lr: float = 3e-4
    #: Depth ``k``'s loss weight is ``decay ** (k - 1)`` (DeepSeek's equal weights: 1).
    decay: float = 1.0
    #: Depths trained, at least the layers (``None``: one per layer); the last layer serves those past it.
    depths: int | None = None


@dataclass
class Evaluation:
    losses: list[float]
    accuracies: list[float]


class MTPTarget(FrozenTarget):
    """What the layers read from the frozen target: its final normed states, its input embedding
    and its rotary embedding."""

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        self.embed = model.get_input_embeddings()
        self.rotary = model.get_decoder().rotary_emb

    def loss(self, layers: nn.ModuleList, batch: dict[str, torch.Tensor], options: FitOptions,
             backward: bool = False, vocabulary: TrainingVocabulary | None = None) -> DepthScores:
        """:func:`mtp_loss` of ``layers`` over ``batch``."""
        ids, mask = batch["input_ids"].to(self.device), batch["loss_mask"].to(self.device)
        return mtp_loss(layers, self.embed, self.rotary, self(batch), ids, mask, options.decay, options.chunk,
                        backward=backward, bf16=options.bf16, vocabulary=vocabulary, depths=options.depths)


class MTPTrainee:
    """MTP layers as the core loop trains them (:class:`specdec.training.loop.Trainee`):
    ``vocabulary`` narrows the training softmax (held-out measurements take the whole vocabulary)."""

    def __init__(self, layers: nn.ModuleList, target: MTPTarget, options: FitOptions,
                 vocabulary: TrainingVocabulary | None = None) -> None:
        self.module, self.target, self.options = layers, target, options
        self.vocabulary = vocabulary.to(target.device) if vocabulary is not None else None

    def parameters(self) -> dict[str, torch.Tensor]:
        return trainable_state(self.module)

    def shape(self) -> dict[str, Any]:
        return layers_shape(len(self.module), self.options.depths)

    def loss(self, batch: dict[str, torch.Tensor]) -> DepthScores:
        return self.target.loss(self.module, batch, self.options, backward=True, vocabulary=self.vocabulary)

    def evaluate(self, dataset: torch.utils.data.Dataset, world: World) -> Evaluation:
        return evaluate(self.module, self.target, dataset, self.options, world)


def layers_shape(num_layers: int, depths: int | None = None) -> dict[str, Any]:
    """What a resumed run must match: the number of layers, and of depths where it differs."""
    return {"num_layers": num_layers} if depths in (None, num_layers) else {"num_layers": num_layers, "num_depths": depths}


def describe_shape(shape: dict[str, Any]) -> str:
    depths = shape.get("num_depths")
    return f"{shape['num_layers']} MTP layer(s)" + (f" trained over {depths} depths" if depths else "")


@torch.no_grad()
def evaluate(layers: nn.ModuleList, target: MTPTarget, dataset: torch.utils.data.Dataset, options: FitOptions,
             world: World) -> Evaluation:
    """Per depth mean loss and top-1 accuracy over ``dataset`` (each rank a share, float32)."""
    was_training = layers.training
    layers.eval()
    lengths = conversation_lengths(dataset)
    items = sorted(range(world.rank, len(dataset), world.size), key=lambda i: lengths[i])
    n = options.depths or len(layers)
    totals = [0.0] * (3 * n)
    plain = FitOptions(**{**asdict(options), "bf16": False})
    for start in range(0, len(items), options.batch_size):
        scores = target.loss(layers, collate([dataset[i] for i in items[start : start + options.batch_size]]), plain)
        totals = [t + v for t, v in zip(totals, [*scores.loss_sums, *scores.correct, *scores.counts])]
    totals = sum_across(totals, world)
    layers.train(was_training)
    scores = DepthScores(totals[:n], totals[n : 2 * n], totals[2 * n :])
    return Evaluation(scores.losses(), scores.accuracies())
