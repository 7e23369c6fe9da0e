"""What the core's training loop needs to train an MLP speculator (:class:`specdec.training.Trainee`).

Each step runs the target once over a batch of conversations (no gradient) for its final normed
states, or reads them from the state cache, and trains every stage on them
(:func:`~specdec_mlp_speculator.training.objective.mlp_loss`).
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
from specdec_mlp_speculator.speculator import MLPSpeculator, SpeculatorSpec
from specdec_mlp_speculator.training.objective import mlp_loss


@dataclass
class FitOptions(TrainingOptions):
    #: Stage ``k``'s loss weight is ``decay ** k``.
    decay: float = 1.0


@dataclass
class Evaluation:
    losses: list[float]
    accuracies: list[float]
    #: Estimated mean acceptance length of greedy chain drafting (:func:`specdec.training.chain_acceptance`).
    acceptance_length: float


class MLPSpeculatorTrainee:
    """An MLP speculator as the core loop trains it: ``vocabulary`` narrows the training softmax
    (held-out measurements take the whole vocabulary)."""

    def __init__(self, speculator: MLPSpeculator, target: Callable[[dict[str, torch.Tensor]], torch.Tensor],
                 options: FitOptions, vocabulary: TrainingVocabulary | None = None) -> None:
        self.module, self.target, self.options = speculator, target, options
        self.device = next(speculator.parameters()).device
        self.vocabulary = vocabulary.to(self.device) if vocabulary is not None else None

    def parameters(self) -> dict[str, torch.Tensor]:
        return dict(self.module.named_parameters())  # tied stages' weights once each

    def shape(self) -> dict[str, Any]:
        return speculator_shape(self.module.spec)

    def loss(self, batch: dict[str, torch.Tensor]) -> Scores:
        return mlp_loss(self.module, self.target(batch), batch["input_ids"].to(self.device),
                        batch["loss_mask"].to(self.device), self.options.decay, self.options.chunk, backward=True,
                        bf16=self.options.bf16, vocabulary=self.vocabulary)

    def evaluate(self, dataset: torch.utils.data.Dataset, world: World) -> Evaluation:
        return evaluate(self.module, self.target, dataset, self.options, world)


def speculator_shape(spec: SpeculatorSpec) -> dict[str, Any]:
    """What a resumed run must match: the stages, their width, tying and input scaling."""
    return {"n_predict": spec.n_predict, "inner_dim": spec.inner_dim, "tie_weights": spec.tie_weights,
            "scale_input": spec.scale_input}


def describe_shape(shape: dict[str, Any]) -> str:
    return f"a speculator {shape}"


@torch.no_grad()
def evaluate(speculator: MLPSpeculator, target: Callable[[dict[str, torch.Tensor]], torch.Tensor],
             dataset: torch.utils.data.Dataset, options: FitOptions, world: World) -> Evaluation:
    """Per stage mean loss and top-1 accuracy over ``dataset`` (each rank a share, float32), and the
    estimated acceptance length of greedy chain drafting over its replies."""
    lengths = conversation_lengths(dataset)
    items = sorted(range(world.rank, len(dataset), world.size), key=lambda i: lengths[i])
    n = speculator.spec.n_predict
    totals = [0.0] * (3 * n + 2)
    device = next(speculator.parameters()).device
    for start in range(0, len(items), options.batch_size):
        batch = collate([dataset[i] for i in items[start : start + options.batch_size]])
        mask = batch["loss_mask"].to(device)
        scores = mlp_loss(speculator, target(batch), batch["input_ids"].to(device), mask, options.decay, options.chunk,
                          keep_hits=True)
        walk = chain_acceptance(scores.hits, scores.scored, mask)
        totals = [t + v for t, v in zip(totals, [*scores.loss_sums, *scores.correct, *scores.counts, *walk])]
    totals = sum_across(totals, world)
    scores = Scores(totals[:n], totals[n : 2 * n], totals[2 * n : 3 * n])
    steps, accepted = totals[3 * n :]
    return Evaluation(scores.losses(), scores.accuracies(), 1 + accepted / steps if steps else 1.0)
