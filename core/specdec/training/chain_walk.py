"""Estimating a chain drafter's acceptance from per-position hits, without decoding.

A drafter whose output ``k`` at position ``t`` predicts token ``t + k + 2`` (Medusa's heads, an MLP
speculator's stages: each reads the target's state at ``t`` and, teacher-forced, the real tokens
before its own) is scored at every position at once in training. Where its first ``k`` outputs
were right, teacher forcing fed exactly what greedy drafting would have, so the hits say how a
greedy chain would have fared.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specdec.training.batching import collate, conversation_lengths
from specdec.training.distributed import World, sum_across
from specdec.training.state import Scores


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


@dataclass
class ChainEvaluation:
    """A held-out measurement: per output mean loss and top-1 accuracy, and the estimated mean
    acceptance length of greedy chain drafting (:func:`chain_acceptance`)."""

    losses: list[float]
    accuracies: list[float]
    acceptance_length: float


@torch.no_grad()
def evaluate_chain(score: Callable[[dict[str, torch.Tensor], torch.Tensor], Scores], outputs: int,
                   dataset: torch.utils.data.Dataset, batch_size: int, world: World,
                   device: torch.device) -> ChainEvaluation:
    """Score ``dataset`` (each rank a share, shortest conversations together) with ``score(batch,
    loss_mask)``, which returns one collated batch's :class:`Scores` of ``outputs`` outputs with
    their hits kept; the totals are summed across ranks."""
    lengths = conversation_lengths(dataset)
    items = sorted(range(world.rank, len(dataset), world.size), key=lambda i: lengths[i])
    totals = [0.0] * (3 * outputs + 2)
    for start in range(0, len(items), batch_size):
        batch = collate([dataset[i] for i in items[start : start + batch_size]])
        mask = batch["loss_mask"].to(device)
        scores = score(batch, mask)
        walk = chain_acceptance(scores.hits, scores.scored, mask)
        totals = [t + v for t, v in zip(totals, [*scores.loss_sums, *scores.correct, *scores.counts, *walk])]
    totals = sum_across(totals, world)
    n = outputs
    scores = Scores(totals[:n], totals[n : 2 * n], totals[2 * n : 3 * n])
    steps, accepted = totals[3 * n :]
    return ChainEvaluation(scores.losses(), scores.accuracies(), 1 + accepted / steps if steps else 1.0)
