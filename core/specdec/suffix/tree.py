"""A suffix tree of bounded depth over token sequences, counting each substring's occurrences.

Every substring of up to ``depth`` tokens of the sequences added is a path from the root, and
each node counts how often its substring occurs, so a node's children, weighed by their counts,
are what followed that substring and how often (SuffixDecoding, arXiv 2411.04975, builds its
trees the same way and bounds them by the same depth). A sequence grows one token at a time at
``depth`` dictionary steps a token: its *frontier* holds the nodes of its last ``0 .. depth``
tokens, and each but the deepest gains the new token as a child. Removing a sequence replays it,
decrementing, and drops the nodes no occurrence is left of.

:meth:`SuffixTree.speculate` grows a draft from a matched node, best first by estimated
probability: a child's probability is its share of its parent's occurrences, times its parent's.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

#: The root's node id.
ROOT = 0


@dataclass
class Draft:
    """Draft tokens from a node: ``parents[i]`` is token ``i``'s parent index (-1: the match), a
    parent first; ``probs[i]`` the estimated probability that the target follows the path to it.
    ``score``, their sum, is the expected number of accepted tokens."""

    token_ids: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    match_len: int = 0

    @property
    def score(self) -> float:
        return sum(self.probs)


class SuffixTree:
    """Counted substrings of up to ``depth`` tokens of the sequences added.

    Nodes are ids into two lists, each node's children a ``{token: child id}`` dict and its
    count an int, rather than an object each: dicts of ints are outside the reach of Python's
    cyclic garbage collector, which would otherwise walk every node of every tree at each of its
    full passes (a cache of a few hundred thousand nodes then cost about 200 us a step).
    """

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self._children: list[dict[int, int]] = [{}]
        self._count: list[int] = [0]
        self._free: list[int] = []

    @property
    def num_nodes(self) -> int:
        """Nodes in the tree (the root included): what its memory grows with."""
        return len(self._count) - len(self._free)

    def count(self, node: int) -> int:
        return self._count[node]

    def children(self, node: int) -> dict[int, int]:
        """``{token: child}`` of ``node``."""
        return self._children[node]

    @staticmethod
    def frontier() -> list[int]:
        """The frontier of an empty sequence."""
        return [ROOT]

    def extend(self, frontier: list[int], tokens: Sequence[int]) -> list[int]:
        """Add ``tokens`` to the sequence whose frontier is ``frontier``; the new frontier."""
        children, count, depth = self._children, self._count, self.depth
        for token in tokens:
            grown = [ROOT]
            for node in frontier if len(frontier) <= depth else frontier[:depth]:
                child = children[node].get(token)
                if child is None:
                    child = children[node][token] = self._new()
                count[child] += 1
                grown.append(child)
            frontier = grown
        count[ROOT] += len(tokens)
        return frontier

    def remove(self, tokens: Iterable[int]) -> None:
        """Take a sequence added with :meth:`extend` out again."""
        children, count, depth = self._children, self._count, self.depth
        frontier = [ROOT]
        for token in tokens:
            grown = [ROOT]
            for node in frontier if len(frontier) <= depth else frontier[:depth]:
                child = children[node][token]
                count[child] -= 1
                if count[child] == 0:  # no occurrence left: nor, by the end, of anything below it
                    del children[node][token]
                    self._free.append(child)  # its children stay readable until it is reused
                grown.append(child)
            count[ROOT] -= 1
            frontier = grown

    def matches(self, pattern: list[int]) -> list[int]:
        """The nodes of ``pattern``'s suffixes that occur, shortest first: entry ``i`` matches
        the last ``i + 1`` tokens. (A suffix occurs only if every shorter one does.)"""
        found = []
        for length in range(1, min(len(pattern), self.depth) + 1):
            node: int | None = ROOT
            for token in pattern[len(pattern) - length :]:
                node = self._children[node].get(token)
                if node is None:
                    return found
            found.append(node)
        return found

    def speculate(self, node: int, max_tokens: int, min_prob: float, tree: bool) -> Draft:
        """Up to ``max_tokens`` tokens following ``node``, each with an estimated probability of at
        least ``min_prob``: the most probable path (a chain), or the most probable nodes (a tree,
        added best first, so any first ``n`` of them are a tree)."""
        children, count = self._children, self._count
        draft = Draft()
        if tree:
            heap: list[tuple[float, int, int, int, int]] = []
            serial = 0  # ties: the earlier reached first

            def push(parent: int, index: int, prob: float) -> None:
                nonlocal serial
                for token, child in children[parent].items():
                    p = prob * count[child] / count[parent]
                    if p >= min_prob:
                        heapq.heappush(heap, (-p, serial, index, token, child))
                        serial += 1

            push(node, -1, 1.0)
            while heap and len(draft.token_ids) < max_tokens:
                p, _, parent, token, child = heapq.heappop(heap)
                draft.token_ids.append(token)
                draft.parents.append(parent)
                draft.probs.append(-p)
                push(child, len(draft.token_ids) - 1, -p)
            return draft
        prob = 1.0
        while len(draft.token_ids) < max_tokens and children[node]:
            token, child = max(children[node].items(), key=lambda item: (count[item[1]], -item[0]))
            prob *= count[child] / count[node]
            if prob < min_prob:
                break
            draft.token_ids.append(token)
            draft.parents.append(len(draft.token_ids) - 2)
            draft.probs.append(prob)
            node = child
        return draft

    def _new(self) -> int:
        if self._free:
            node = self._free.pop()
            self._children[node], self._count[node] = {}, 0
            return node
        self._children.append({})
        self._count.append(0)
        return len(self._count) - 1
