"""Estimating a chain drafter's acceptance from per-position hits, without decoding.

A drafter whose output ``k`` at position ``t`` predicts token ``t + k + 2`` (Medusa's heads, an MLP
speculator's stages: each reads the target's state at ``t`` and, teacher-forced, the real tokens
before its own) is scored at every position at once in training. Where its first ``k`` outputs
were right, teacher forcing fed exactly what greedy drafting would have, so the hits say how a
greedy chain would have fared.
"""

from __future__ import annotations

import torch


def shifted(x: torch.Tensor, k: int, fill: int | bool = 0) -> torch.Tensor:
    """``x`` moved ``k`` positions left along dim 1 (``out[:, t] = x[:, t + k]``), ``fill`` at the end."""
    out = torch.full_like(x, fill)
    if k < x.shape[1]:
        out[:, : x.shape[1] - k] = x[:, k:]
    return out


def chain_acceptance(hits: torch.Tensor, scored: torch.Tensor, loss_mask: torch.Tensor) -> tuple[int, int]:
    """``(steps, accepted)`` of greedy chain drafting over the replies, from ``hits`` and ``scored``
    (``[B, T, outputs]``: output ``k`` at position ``t`` was right / was scored): from the state
    before a reply's first token the target writes one token and the drafter drafts the next
    ones; drafts count up to the first miss, then drafting goes on from the state before the
    next unwritten token. ``1 + accepted / steps`` estimates the mean acceptance length (a tree
    accepts at least this much)."""
    starts = (shifted(loss_mask.bool(), 1, False) & scored[..., 0]).tolist()
    hits, scored = hits.tolist(), scored.tolist()
    steps = accepted = 0
    for row_start, row_hits, row_scored in zip(starts, hits, scored):
        t = 0
        while t < len(row_start):
            if not row_start[t]:
                t += 1
                continue
            run = 0
            while run < len(row_hits[t]) and row_scored[t][run] and row_hits[t][run]:
                run += 1
            steps += 1
            accepted += run
            t += run + 1
    return steps, accepted
