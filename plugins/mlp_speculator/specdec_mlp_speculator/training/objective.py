"""The MLP speculator's objective on a batch of the target's final states (IBM's first stage).

Stage ``k`` (0-based) at position ``t`` reads stage ``k - 1``'s state (stage 0: the target's final
normed state at ``t``) and, teacher-forced, token ``t + k + 1``, and learns token ``t + k + 2``:
the draft at depth ``k + 1``, as :mod:`specdec_mlp_speculator.drafter` uses it. The tokens are the
target's own replies, so that is what the target would write. The core's
:func:`~specdec.training.chained_loss` computes it, chunk by chunk over the output layer.
"""

from __future__ import annotations

import torch

from specdec.training import Scores, TrainingVocabulary, chained_loss, shifted
from specdec_mlp_speculator.speculator import MLPSpeculator


def mlp_loss(speculator: MLPSpeculator, hidden: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor,
             decay: float = 1.0, chunk: int = 1024, backward: bool = False, bf16: bool = False,
             keep_hits: bool = False, vocabulary: TrainingVocabulary | None = None) -> Scores:
    """Every stage's loss and top-1 hits over a right-padded batch (``hidden`` ``[B, T, hidden]``:
    the target's final normed states, no gradient; the rest as :func:`~specdec.training.chained_loss`).
    With a ``vocabulary`` the speculator is a
    :class:`~specdec_mlp_speculator.speculator.CompactSpeculator` over exactly its tokens
    (:class:`~specdec_mlp_speculator.training.loop.MLPSpeculatorTrainee` checks it once)."""
    return chained_loss(
        lambda k, state: speculator.advance(k, state, shifted(input_ids, k + 1)),
        lambda k, states, rows: speculator.head[k](states),
        speculator.first_state(hidden.float()), input_ids, loss_mask, speculator.spec.n_predict, decay, chunk,
        backward, bf16, keep_hits, vocabulary)
