"""The MLP speculator's objective on a batch of the target's final states (IBM's first stage).

Stage ``k`` (0-based) at position ``t`` reads stage ``k - 1``'s state (stage 0: the target's final
normed state at ``t``) and, teacher-forced, token ``t + k + 1``, and learns token ``t + k + 2``:
the draft at depth ``k + 1``, as :mod:`specdec_mlp_speculator.drafter` uses it. The tokens are the
target's own replies, so that is what the target would write. A position counts only where that
token is an assistant token (``loss_mask``). Stage ``k``'s loss is its mean cross-entropy, weighted
by ``decay ** k``.

The output layer dominates the cost, so each stage's logits are computed ``chunk`` positions at a
time over the scored positions only, and back-propagated chunk by chunk into a detached copy of
the stage's state; the states' own graph (every stage's projection, embedding and norm, cheap)
is back-propagated once at the end with the gradients the chunks left.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from specdec.training import Scores, TrainingVocabulary, projection, shifted
from specdec_mlp_speculator.speculator import MLPSpeculator


def mlp_loss(speculator: MLPSpeculator, hidden: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor,
             decay: float = 1.0, chunk: int = 1024, backward: bool = False, bf16: bool = False,
             keep_hits: bool = False, vocabulary: TrainingVocabulary | None = None) -> Scores:
    """Every stage's loss and top-1 hits over a right-padded batch.

    :param hidden: ``[B, T, hidden]`` the target's final normed states (no gradient).
    :param input_ids: ``[B, T]``; ``loss_mask`` ``[B, T]`` marks assistant tokens (False on padding).
    :param backward: back-propagate ``decay ** k * loss_k`` (training).
    :param bf16: the matrix products in bfloat16 (autocast; weights and summed losses stay float32).
    :param keep_hits: also return per-position hits (:attr:`Scores.hits`), for evaluation.
    :param vocabulary: score over these tokens only (training; evaluation takes the whole vocabulary).
    """
    mask = loss_mask.bool()
    n = speculator.spec.n_predict
    scores = Scores([], [], [])
    if keep_hits:
        scores.hits = torch.zeros(*mask.shape, n, dtype=torch.bool, device=mask.device)
        scores.scored = torch.zeros_like(scores.hits)
    roots: list[torch.Tensor] = []
    grads: list[torch.Tensor] = []
    autocast = torch.autocast(hidden.device.type, dtype=torch.bfloat16, enabled=bf16)
    with torch.set_grad_enabled(backward):
        state = speculator.first_state(hidden.float())
        for k in range(n):
            with autocast:
                state = speculator.advance(k, state, shifted(input_ids, k + 1))
            scored = shifted(mask, k + 2, False)
            future = shifted(input_ids, k + 2)
            if vocabulary is not None:
                future = vocabulary.index[future]
                scored &= future >= 0
            rows = scored.flatten().nonzero().squeeze(1)
            labels = future.flatten()[rows]
            leaf = state.detach().requires_grad_(backward)
            count = int(rows.numel())
            loss_sum, correct, hit_list = 0.0, 0, []
            for start in range(0, count, chunk):
                with autocast:
                    states = leaf.reshape(-1, leaf.shape[-1])[rows[start : start + chunk]]
                    logits = projection(speculator.head[k], vocabulary)(states)
                want = labels[start : start + chunk]
                loss = F.cross_entropy(logits if bf16 else logits.float(), want, reduction="none").float().sum()
                if backward:
                    (loss * (decay**k / count)).backward()
                loss_sum += float(loss.detach())
                hit = logits.detach().argmax(-1) == want
                correct += int(hit.sum())
                hit_list.append(hit)
            if backward and leaf.grad is not None:
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
