"""Medusa-1's objective on a batch of the target's final states, computed where it counts.

Head ``k`` (0-based) reads the target's final normed state at position ``t`` (the state the
target's own ``lm_head`` turns into token ``t + 1``) and learns token ``t + k + 2``, the draft at
depth ``k + 1`` (as :mod:`specdec_medusa.drafter` uses it). The data's tokens are the target's
own greedy replies, so that token is what the target would write there. A position counts only
where that token is an assistant token (``loss_mask``), which also rules out padding.

Head ``k``'s loss is its mean cross-entropy over its positions, weighted by ``decay ** k`` (0.8 in
the Medusa paper): later heads are right less often and matter less, since a draft counts only
after every earlier one was accepted.

The core's :func:`~specdec.training.chained_loss` computes it, every head reading the target's
state as it is (the target's states are constants): chunk by chunk over the gathered positions,
since the vocabulary projection dominates the cost (49,152 x 576 per position and head for
SmolLM2), with :class:`TrainingVocabulary` narrowing the softmax where asked.
"""

from __future__ import annotations

import torch

from specdec.training import Scores, TrainingVocabulary, chained_loss, projection
from specdec_medusa.heads import MedusaHeads


def medusa_loss(heads: MedusaHeads, hidden: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor,
                decay: float = 0.8, chunk: int = 1024, backward: bool = False, bf16: bool = False,
                keep_hits: bool = False, vocabulary: TrainingVocabulary | None = None) -> Scores:
    """Every head's loss and top-1 hits over a right-padded batch (``hidden`` ``[B, T, hidden]``: the
    target's final normed states, no gradient; the rest as :func:`~specdec.training.chained_loss`)."""
    return chained_loss(
        lambda k, state: state,
        lambda k, states, rows: projection(heads.lm_heads[k], vocabulary)(heads.blocks[k](states)),
        hidden.float(), input_ids, loss_mask, heads.num_heads, decay, chunk, backward, bf16, keep_hits, vocabulary)
