"""What the core's training loop needs to train a recurrent drafter (:class:`specdec.training.Trainee`).

Each step runs the target once over a batch of conversations (no gradient) for its final normed
states, or reads them from the state cache, and trains every draft position on them, teacher
forced as Apple's trainer does: position ``k`` at sequence position ``t`` reads the target's state
at ``t`` and the drafter's state after tokens ``t + 1 .. t + k + 1`` (embedded with the target's
own table), and learns token ``t + k + 2``. The data is the target's own replies, so the drafter
learns what the target writes (the paper's distillation). The core's
:func:`~specdec.training.chained_loss` computes the loss, chunk by chunk over the output layer.
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
    chained_loss,
    check_compact_vocabulary,
    evaluate_chain,
    shifted,
)
from specdec_redrafter.drafter_model import RecurrentDrafter


@dataclass
class FitOptions(TrainingOptions):
    #: Draft positions trained (Apple's ``drafter_predict_n_tokens``).
    positions: int = 5
    #: Position ``k``'s loss weight is ``decay ** k`` (Apple: 1, an unweighted sum).
    decay: float = 1.0


def redrafter_loss(drafter: RecurrentDrafter, embed: torch.nn.Module, hidden: torch.Tensor, input_ids: torch.Tensor,
                   loss_mask: torch.Tensor, options: FitOptions, backward: bool = False, keep_hits: bool = False,
                   vocabulary: TrainingVocabulary | None = None) -> Scores:
    """Every draft position's loss and top-1 hits over a right-padded batch (``hidden``
    ``[B, T, H]``: the target's final normed states, no gradient). A compact drafter
    (``token_ids``) is scored over its own tokens, which must be ``vocabulary``'s
    (:class:`ReDrafterTrainee` checks it once); a full one without a ``vocabulary``."""
    hidden = hidden.float()
    flat = hidden.reshape(-1, hidden.shape[-1])
    with torch.no_grad():
        embedded = [embed(shifted(input_ids, k + 1)).float() for k in range(options.positions)]
    return chained_loss(
        lambda k, state: drafter.advance(state, embedded[k]),
        lambda k, states, rows: drafter.logits(flat[rows], states),
        torch.zeros_like(hidden), input_ids, loss_mask, options.positions, options.decay, options.chunk, backward,
        options.bf16 and backward, keep_hits, vocabulary)


class ReDrafterTrainee:
    """A recurrent drafter as the core loop trains it: with a ``vocabulary``, a compact drafter over
    exactly its tokens (:meth:`RecurrentDrafter.narrowed`), measured over them too (a held-out
    token outside them counts as a miss)."""

    def __init__(self, drafter: RecurrentDrafter, embed: torch.nn.Module,
                 target: Callable[[dict[str, torch.Tensor]], torch.Tensor], options: FitOptions,
                 vocabulary: TrainingVocabulary | None = None) -> None:
        check_compact_vocabulary(drafter.token_ids, vocabulary, "a drafter")
        self.module, self.embed, self.target, self.options = drafter, embed, target, options
        self.device = next(drafter.parameters()).device
        self.vocabulary = vocabulary.to(self.device) if vocabulary is not None else None

    def parameters(self) -> dict[str, torch.Tensor]:
        return dict(self.module.named_parameters())

    def shape(self) -> dict[str, Any]:
        return drafter_shape(self.module)

    def loss(self, batch: dict[str, torch.Tensor]) -> Scores:
        return redrafter_loss(self.module, self.embed, self.target(batch), batch["input_ids"].to(self.device),
                              batch["loss_mask"].to(self.device), self.options, backward=True, vocabulary=self.vocabulary)

    def evaluate(self, dataset: torch.utils.data.Dataset, world: World) -> ChainEvaluation:
        return evaluate(self.module, self.embed, self.target, dataset, self.options, world, self.vocabulary)


def drafter_shape(drafter: RecurrentDrafter) -> dict[str, Any]:
    """What a resumed run must match: the MLP's width and depth, the kind of state and the output rows."""
    spec = drafter.spec
    return {"exit_dim": spec.exit_dim, "num_draft_layers": spec.num_draft_layers, "rnn": spec.rnn,
            "output_rows": drafter.output.out_features}


def describe_shape(shape: dict[str, Any]) -> str:
    return f"a drafter {shape}"


def evaluate(drafter: RecurrentDrafter, embed: torch.nn.Module, target: Callable[[dict[str, torch.Tensor]], torch.Tensor],
             dataset: torch.utils.data.Dataset, options: FitOptions, world: World,
             vocabulary: TrainingVocabulary | None = None) -> ChainEvaluation:
    """Per position mean loss and top-1 accuracy over ``dataset`` (each rank a share, float32), and
    the estimated acceptance length of greedy chain drafting (the best beam's) over its replies; a
    compact drafter over its ``vocabulary`` (the losses and accuracies leave out the tokens outside
    it, the chain walk counts them as misses)."""
    device = next(drafter.parameters()).device

    def score(batch: dict[str, torch.Tensor], mask: torch.Tensor) -> Scores:
        return redrafter_loss(drafter, embed, target(batch), batch["input_ids"].to(device), mask, options, keep_hits=True,
                              vocabulary=vocabulary)

    return evaluate_chain(score, options.positions, dataset, options.batch_size, world, device)
