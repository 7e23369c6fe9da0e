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
    ChainEvaluation,
    Scores,
    TrainingOptions,
    TrainingVocabulary,
    World,
    check_compact_vocabulary,
    evaluate_chain,
)
from specdec_mlp_speculator.speculator import MLPSpeculator, SpeculatorSpec
from specdec_mlp_speculator.training.objective import mlp_loss


@dataclass
class FitOptions(TrainingOptions):
    #: Stage ``k``'s loss weight is ``decay ** k``.
    decay: float = 1.0


class MLPSpeculatorTrainee:
    """An MLP speculator as the core loop trains it: with a ``vocabulary``, a
    :class:`~specdec_mlp_speculator.speculator.CompactSpeculator` over it, measured over it too
    (a held-out token outside it counts as a miss)."""

    def __init__(self, speculator: MLPSpeculator, target: Callable[[dict[str, torch.Tensor]], torch.Tensor],
                 options: FitOptions, vocabulary: TrainingVocabulary | None = None) -> None:
        check_compact_vocabulary(speculator.token_map, vocabulary, "a speculator")
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

    def evaluate(self, dataset: torch.utils.data.Dataset, world: World) -> ChainEvaluation:
        return evaluate(self.module, self.target, dataset, self.options, world, self.vocabulary)


def speculator_shape(spec: SpeculatorSpec) -> dict[str, Any]:
    """What a resumed run must match: the stages, their width, tying, input scaling and embedding rows."""
    return {"n_predict": spec.n_predict, "inner_dim": spec.inner_dim, "tie_weights": spec.tie_weights,
            "scale_input": spec.scale_input, "embedding_rows": spec.vocab_size}


def describe_shape(shape: dict[str, Any]) -> str:
    return f"a speculator {shape}"


def evaluate(speculator: MLPSpeculator, target: Callable[[dict[str, torch.Tensor]], torch.Tensor],
             dataset: torch.utils.data.Dataset, options: FitOptions, world: World,
             vocabulary: TrainingVocabulary | None = None) -> ChainEvaluation:
    """Per stage mean loss and top-1 accuracy over ``dataset`` (each rank a share, float32), and the
    estimated acceptance length of greedy chain drafting over its replies; a speculator over a draft
    ``vocabulary`` is measured over it (the losses and accuracies leave out the tokens outside it,
    the chain walk counts them as misses)."""
    device = next(speculator.parameters()).device

    def score(batch: dict[str, torch.Tensor], mask: torch.Tensor) -> Scores:
        return mlp_loss(speculator, target(batch), batch["input_ids"].to(device), mask, options.decay, options.chunk,
                        keep_hits=True, vocabulary=vocabulary)

    return evaluate_chain(score, speculator.spec.n_predict, dataset, options.batch_size, world, device)
