"""EAGLE-2's dynamic draft tree: expand the best nodes depth by depth, then keep the best nodes.

Every node scores the sum of the draft log-probabilities along its path from the root (the last
committed token). Each depth expands the ``topk`` best nodes of the previous depth (the
*frontier*) into their ``topk`` most likely children; all those children are candidates. After
the last depth the candidates are reranked by score and the best ``num_nodes`` are kept.

A child never scores above its parent (log-probabilities are at most 0), so sorting by score,
ties broken by creation order, lists every parent before its children, and any leading run of
that order is a valid tree (a kept node's ancestors are kept). The engine relies on both: it
verifies parents first and may cut a proposal to its first nodes.
"""

from __future__ import annotations

import torch


class TreeCandidates:
    """The candidate nodes of one request's tree, added one depth at a time."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._tokens: list[torch.Tensor] = []
        self._parents: list[torch.Tensor] = []
        self._scores: list[torch.Tensor] = []
        self.count = 0

    def add_children(
        self, parents: torch.Tensor, parent_scores: torch.Tensor, logprobs: torch.Tensor, token_ids: torch.Tensor, topk: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Add the ``topk`` most likely children of each expanded node.

        :param parents: candidate indices of the ``F`` expanded nodes (``-1`` for the root).
        :param parent_scores: their cumulative scores, ``[F]``.
        :param logprobs: draft log-probabilities after each of them, ``[F, draft_vocab]``.
        :param token_ids: the target id of each draft id.
        :return: the new candidates' indices, scores and target token ids, ``[F * topk]`` each,
            grouped by parent.
        """
        values, draft_ids = logprobs.topk(topk, dim=-1)
        scores = (parent_scores[:, None] + values).flatten()
        indices = torch.arange(self.count, self.count + scores.numel(), device=self.device)
        tokens = token_ids[draft_ids.flatten()]
        self._tokens.append(tokens)
        self._parents.append(parents.repeat_interleave(topk))
        self._scores.append(scores)
        self.count += scores.numel()
        return indices, scores, tokens

    def best(self, num_nodes: int) -> tuple[list[int], list[int]]:
        """The best ``num_nodes`` candidates as a tree: ``(token_ids, parents)``, parents first."""
        scores = torch.cat(self._scores)
        order = torch.sort(scores, descending=True, stable=True).indices[:num_nodes]
        position = torch.full((self.count + 1,), -1, dtype=torch.long, device=self.device)
        position[order] = torch.arange(order.numel(), device=self.device)
        parents = torch.cat(self._parents)[order]
        # Index -1 (the root) reads the spare last slot, which stays -1.
        new_parents = position[parents]
        return torch.cat(self._tokens)[order].tolist(), new_parents.tolist()


def frontier_mask(num_cached: int, ancestors: torch.Tensor) -> torch.Tensor:
    """Head attention mask ``[F, num_cached + drafted + F]`` for ``F`` frontier nodes drafted together.

    Each node sees the committed cache (``num_cached`` positions), the cache slots of its own
    ancestors (``ancestors``: boolean ``[F, drafted]`` over the slots drafted so far) and itself.
    """
    count = ancestors.shape[0]
    committed = ancestors.new_ones((count, num_cached))
    itself = torch.eye(count, dtype=torch.bool, device=ancestors.device)
    return torch.cat((committed, ancestors, itself), dim=1)
