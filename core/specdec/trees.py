"""Draft trees laid out flat, parents first, as :class:`~specdec.requests.DraftProposal` carries them.

A tree's nodes are ``token_ids[i]`` with ``parents[i]`` the index of node ``i``'s parent (``-1``
for a child of the root, the request's last committed token). Every parent comes before its
children, so any leading run of the nodes is again a tree: the engine may cut a proposal to its
budget by keeping its first nodes. The helpers here build and read such trees for any tree
method:

- :class:`TreeCandidates`: EAGLE-2's dynamic tree, the best nodes by cumulative score;
- :func:`parents_of_paths`: a static tree given by each node's path from the root (Medusa's
  ``medusa_choices``);
- :func:`node_depths` and :func:`path_to`: where a node sits and how it is reached.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["TreeCandidates", "node_depths", "parents_of_paths", "path_to"]


class TreeCandidates:
    """The candidate nodes of one request's tree, added one depth at a time (EAGLE-2).

    Every node scores the sum of the draft log-probabilities along its path from the root. Each
    depth expands the best nodes of the previous depth (the *frontier*) into their ``topk`` most
    likely children; all those children are candidates. :meth:`best` then keeps the best nodes.

    A child never scores above its parent (log-probabilities are at most 0), so sorting by score,
    ties broken by creation order, lists every parent before its children, and any leading run of
    that order is a valid tree (a kept node's ancestors are kept).
    """

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


class DraftTree:
    """A tree of draft tokens built node by node, parents first, as a proposal lays it out.

    Adding a token under a parent that already has a child with that token returns that child:
    both would have the same ancestors and token, so the same forward row. Chains from several
    sources (n-gram candidates, a lookahead window) thus share their common prefixes.
    """

    def __init__(self) -> None:
        self.token_ids: list[int] = []
        self.parents: list[int] = []
        self._nodes: dict[tuple[int, int], int] = {}

    def __len__(self) -> int:
        return len(self.token_ids)

    def add(self, parent: int, token: int) -> int:
        """The node for ``token`` under ``parent`` (``-1``: the root), added if it is new."""
        node = self._nodes.get((parent, token))
        if node is None:
            node = len(self.token_ids)
            self.token_ids.append(token)
            self.parents.append(parent)
            self._nodes[(parent, token)] = node
        return node

    def add_chain(self, tokens: Sequence[int], parent: int = -1) -> list[int]:
        """The nodes of ``tokens`` as a chain below ``parent``, added where new."""
        nodes = []
        for token in tokens:
            parent = self.add(parent, token)
            nodes.append(parent)
        return nodes


def parents_of_paths(paths: Sequence[Sequence[int]]) -> list[int]:
    """The parent index of each node of a tree given by its nodes' paths from the root.

    ``paths[i]`` is node ``i``'s path (any labels per level, e.g. Medusa's top-k indices); the
    root's children have paths of length 1. Every node's parent path must come earlier.
    """
    index: dict[tuple[int, ...], int] = {}
    parents = []
    for i, path in enumerate(paths):
        key = tuple(path)
        if not key:
            raise ValueError("a tree node's path must not be empty (the root is not a node)")
        if key in index:
            raise ValueError(f"path {list(key)} appears twice")
        parent = index.get(key[:-1], -1) if len(key) > 1 else -1
        if len(key) > 1 and parent < 0:
            raise ValueError(f"path {list(key)} comes before its parent {list(key[:-1])}")
        index[key] = i
        parents.append(parent)
    return parents


def node_depths(parents: Sequence[int]) -> list[int]:
    """Each node's depth: 1 for a child of the root, one more than its parent otherwise."""
    depths: list[int] = []
    for parent in parents:
        depths.append(depths[parent] + 1 if parent >= 0 else 1)
    return depths


def path_to(node: int, parents: Sequence[int]) -> list[int]:
    """The node indices from the root's child down to ``node`` (empty for ``node == -1``)."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]
