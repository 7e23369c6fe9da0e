"""The teacher-forced loss of a drafter whose draft positions follow one another through a state
(the MLP speculator's stages, ReDrafter's recurrent steps), or all read the target's state
(Medusa's heads: ``advance`` returns the state it is given).

Position ``k`` (0-based) at sequence position ``t`` reads the state of position ``k - 1`` (position
0: the caller's first state, from the target's final normed state at ``t``) and, teacher-forced,
token ``t + k + 1``, and learns token ``t + k + 2``: the draft at depth ``k + 1``. A position counts
only where that token is an assistant token (``loss_mask``). Position ``k``'s loss is its mean
cross-entropy, weighted by ``decay ** k``.

The output layer dominates the cost, so each position's logits are computed ``chunk`` rows at a
time over the scored rows only, and back-propagated chunk by chunk into a detached copy of the
position's state; the states' own graph (cheap) is back-propagated once at the end with the
gradients the chunks left.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn import functional as F

from specdec.training.chain_walk import shifted
from specdec.training.state import Scores
from specdec.training.vocabulary import TrainingVocabulary


def chained_loss(advance: Callable[[int, torch.Tensor], torch.Tensor],
                 logits: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor],
                 first_state: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor, positions: int,
                 decay: float = 1.0, chunk: int = 1024, backward: bool = False, bf16: bool = False,
                 keep_hits: bool = False, vocabulary: TrainingVocabulary | None = None) -> Scores:
    """Every draft position's loss and top-1 hits over a right-padded batch.

    :param advance: ``advance(k, state)``: position ``k``'s state ``[B, T, D]`` from the previous
        one (``first_state`` for ``k = 0``); it reads token ``t + k + 1`` itself
        (``shifted(input_ids, k + 1)``).
    :param logits: ``logits(k, states, rows)``: position ``k``'s logits for ``states`` ``[N, D]``,
        the rows ``rows`` (indices into the flattened ``[B * T]`` positions) of its state; over
        ``vocabulary``'s tokens when one is given.
    :param input_ids: ``[B, T]``; ``loss_mask`` ``[B, T]`` marks assistant tokens (False on padding).
    :param backward: back-propagate ``decay ** k * loss_k`` (training).
    :param bf16: the matrix products in bfloat16 (autocast; weights and summed losses stay float32).
    :param keep_hits: also return per-position hits (:attr:`Scores.hits`), for evaluation.
    :param vocabulary: score over these tokens only (training; evaluation takes the whole vocabulary).
    """
    mask = loss_mask.bool()
    scores = Scores([], [], [])
    if keep_hits:
        scores.hits = torch.zeros(*mask.shape, positions, dtype=torch.bool, device=mask.device)
        scores.scored = torch.zeros_like(scores.hits)
    roots: list[torch.Tensor] = []
    grads: list[torch.Tensor] = []
    autocast = torch.autocast(first_state.device.type, dtype=torch.bfloat16, enabled=bf16)
    with torch.set_grad_enabled(backward):
        state = first_state
        for k in range(positions):
            with autocast:
                state = advance(k, state)
            scored = shifted(mask, k + 2, False)
            future = shifted(input_ids, k + 2)
            if vocabulary is not None:
                future = vocabulary.index[future]
                scored &= future >= 0
            rows = scored.flatten().nonzero().squeeze(1)
            labels = future.flatten()[rows]
            # A state no parameter shaped (Medusa's) needs no gradient: its heads' own suffice.
            leaf = state.detach().requires_grad_(backward and state.requires_grad)
            count = int(rows.numel())
            loss_sum, correct, hit_list = 0.0, 0, []
            for start in range(0, count, chunk):
                chunk_rows = rows[start : start + chunk]
                with autocast:
                    out = logits(k, leaf.reshape(-1, leaf.shape[-1])[chunk_rows], chunk_rows)
                want = labels[start : start + chunk]
                loss = F.cross_entropy(out if bf16 else out.float(), want, reduction="none").float().sum()
                if backward:
                    (loss * (decay**k / count)).backward()
                loss_sum += float(loss.detach())
                hit = out.detach().argmax(-1) == want
                correct += int(hit.sum())
                hit_list.append(hit)
            if leaf.grad is not None:
                roots.append(state)
                grads.append(leaf.grad)
            if keep_hits and count:
                scores.hits[..., k][scored] = torch.cat(hit_list)
                scores.scored[..., k] = scored
            scores.loss_sums.append(loss_sum)
            scores.correct.append(correct)
            scores.counts.append(count)
        if roots:
            torch.autograd.backward(roots, grads)
    return scores
