"""Medusa-1's objective on a batch of the target's final states, computed where it counts.

Head ``k`` (0-based) reads the target's final normed state at position ``t`` (the state the
target's own ``lm_head`` turns into token ``t + 1``) and learns token ``t + k + 2``, the draft at
depth ``k + 1`` (as :mod:`specdec_medusa.drafter` uses it). The data's tokens are the target's
own greedy replies, so that token is what the target would write there. A position counts only
where that token is an assistant token (``loss_mask``), which also rules out padding.

Head ``k``'s loss is its mean cross-entropy over its positions, weighted by ``decay ** k`` (0.8 in
the Medusa paper): later heads are right less often and matter less, since a draft counts only
after every earlier one was accepted.

The vocabulary projection dominates the cost (49,152 x 576 per position and head for SmolLM2),
so the positions are gathered before the heads run (and :class:`TrainingVocabulary` may narrow
the softmax to the reply tokens that matter), and each head runs over ``chunk`` positions
at a time. With ``backward=True`` each chunk's loss is back-propagated at once: the target's
states are constants, so the chunks' gradients simply add up, and at most one chunk's logits
(``chunk x vocab`` floats) are alive at a time.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from specdec.training import Scores, TrainingVocabulary, projection, shifted
from specdec_medusa.heads import MedusaHeads


def medusa_loss(heads: MedusaHeads, hidden: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor,
                decay: float = 0.8, chunk: int = 1024, backward: bool = False, bf16: bool = False,
                keep_hits: bool = False, vocabulary: TrainingVocabulary | None = None) -> Scores:
    """Every head's loss and top-1 hits over a right-padded batch.

    :param hidden: ``[B, T, hidden]`` the target's final normed states (no gradient).
    :param input_ids: ``[B, T]`` tokens; ``loss_mask`` ``[B, T]`` marks assistant tokens (False on padding).
    :param backward: back-propagate ``decay ** k * loss_k`` chunk by chunk (training).
    :param bf16: the heads' matrix products and softmax in bfloat16 (autocast; weights and the summed
        losses stay float32).
    :param keep_hits: also return per-position hits (:attr:`Scores.hits`), for evaluation.
    :param vocabulary: score over these tokens only (training; evaluation takes the whole vocabulary).
    """
    mask = loss_mask.bool()
    scores = Scores([], [], [])
    if keep_hits:
        scores.hits = torch.zeros(*mask.shape, heads.num_heads, dtype=torch.bool, device=mask.device)
        scores.scored = torch.zeros_like(scores.hits)
    for k in range(heads.num_heads):
        scored = shifted(mask, k + 2, False)
        future = shifted(input_ids, k + 2)
        if vocabulary is not None:
            future = vocabulary.index[future]
            scored &= future >= 0
        labels = future[scored]
        states = hidden[scored]
        count = int(labels.numel())
        loss_sum, correct, hit_list = 0.0, 0, []
        for start in range(0, count, chunk):
            with torch.autocast(hidden.device.type, dtype=torch.bfloat16, enabled=bf16):
                # Narrowed per chunk: each chunk's backward frees the graph it ran through.
                logits = projection(heads.lm_heads[k], vocabulary)(heads.blocks[k](states[start : start + chunk].float()))
            want = labels[start : start + chunk]
            # In bfloat16 mode the softmax runs on the bfloat16 logits too: a quarter faster on a CPU
            # than on float32 copies (chunk x vocab floats each), and the gradient is no coarser than
            # the products that made the logits.
            loss = F.cross_entropy(logits if bf16 else logits.float(), want, reduction="none").float().sum()
            if backward:
                (loss * (decay**k / count)).backward()
            loss_sum += float(loss.detach())
            hit = logits.detach().argmax(-1) == want
            correct += int(hit.sum())
            hit_list.append(hit)
        if keep_hits and count:
            scores.hits[..., k][scored] = torch.cat(hit_list)
            scores.scored[..., k] = scored
        scores.loss_sums.append(loss_sum)
        scores.correct.append(correct)
        scores.counts.append(count)
    return scores
