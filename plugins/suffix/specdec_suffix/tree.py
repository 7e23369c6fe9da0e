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
from collections.abc import Iterable
from dataclasses import dataclass, field


class Node:
    __slots__ = ("children", "count")

    def __init__(self) -> None:
        self.children: dict[int, Node] = {}
        self.count = 0


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
    """Counted substrings of up to ``depth`` tokens of the sequences added."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.root = Node()
        #: Nodes in the tree (the root included): what its memory grows with.
        self.num_nodes = 1

    def frontier(self) -> list[Node]:
        """The frontier of an empty sequence."""
        return [self.root]

    def extend(self, frontier: list[Node], tokens: Iterable[int]) -> list[Node]:
        """Add ``tokens`` to the sequence whose frontier is ``frontier``; the new frontier."""
        for token in tokens:
            grown = [self.root]
            for node in frontier[: self.depth]:
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = Node()
                    self.num_nodes += 1
                child.count += 1
                grown.append(child)
            self.root.count += 1
            frontier = grown
        return frontier

    def remove(self, tokens: Iterable[int]) -> None:
        """Take a sequence added with :meth:`extend` out again."""
        frontier = [self.root]
        for token in tokens:
            grown = [self.root]
            for node in frontier[: self.depth]:
                child = node.children[token]
                child.count -= 1
                if child.count == 0:  # no occurrence left: nor of anything below it
                    del node.children[token]
                    self.num_nodes -= 1
                grown.append(child)
            self.root.count -= 1
            frontier = grown

    def matches(self, pattern: list[int]) -> list[Node]:
        """The nodes of ``pattern``'s suffixes that occur, shortest first: entry ``i`` matches
        the last ``i + 1`` tokens. (A suffix occurs only if every shorter one does.)"""
        found = []
        for length in range(1, min(len(pattern), self.depth) + 1):
            node = self.root
            for token in pattern[len(pattern) - length :]:
                node = node.children.get(token)
                if node is None:
                    return found
            found.append(node)
        return found

    @staticmethod
    def speculate(node: Node, max_tokens: int, min_prob: float, tree: bool) -> Draft:
        """Up to ``max_tokens`` tokens following ``node``, each with an estimated probability of at
        least ``min_prob``: the most probable path (a chain), or the most probable nodes (a tree,
        added best first, so any first ``n`` of them are a tree)."""
        draft = Draft()
        if tree:
            heap: list[tuple[float, int, int, int, Node]] = []
            serial = 0  # ties: the earlier pushed first

            def push(parent: Node, index: int, prob: float) -> None:
                nonlocal serial
                for token, child in parent.children.items():
                    p = prob * child.count / parent.count
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
        while len(draft.token_ids) < max_tokens and node.children:
            token, child = max(node.children.items(), key=lambda item: (item[1].count, -item[0]))
            prob *= child.count / node.count
            if prob < min_prob:
                break
            draft.token_ids.append(token)
            draft.parents.append(len(draft.token_ids) - 2)
            draft.probs.append(prob)
            node = child
        return draft
