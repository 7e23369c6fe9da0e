"""``medusa_choices``: the static draft tree, as TensorRT-LLM and the Medusa repository write it.

A choice is a path of top-k indices from the root: ``[0, 1, 0]`` is head 1's top-0 token, then
head 2's top-1 token after it, then head 3's top-0 token. TensorRT-LLM accepts two forms, and
:func:`expand_choices` reads both:

- every candidate listed (the Medusa repository's form):
  ``[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0], [0, 1], [0, 1, 0], [1], [1, 0], [1, 1]]``;
- only the unique paths, each standing for all its prefixes: ``[[0, 0, 0, 0], [0, 1, 0], [1, 0], [1, 1]]``
  is the same nine-node tree.

Nodes keep the order they are first listed in, each after its prefixes. Published trees such as
``mc_sim_7b_63`` are listed best first (built greedily by estimated acceptance), so cutting the
tree to a step's node budget keeps its best nodes.
"""

from __future__ import annotations

from collections.abc import Sequence

#: Medusa's published tree for Vicuna-7B (FasterDecoding/Medusa ``medusa_choices.py``): 63 nodes, depth 4.
MC_SIM_7B_63: tuple[tuple[int, ...], ...] = (
    (0,), (0, 0), (1,), (0, 1), (2,), (0, 0, 0), (1, 0), (0, 2), (3,), (0, 3), (4,), (0, 4), (2, 0), (0, 5),
    (0, 0, 1), (5,), (0, 6), (6,), (0, 7), (0, 1, 0), (1, 1), (7,), (0, 8), (0, 0, 2), (3, 0), (0, 9), (8,),
    (9,), (1, 0, 0), (0, 2, 0), (1, 2), (0, 0, 3), (4, 0), (2, 1), (0, 0, 4), (0, 0, 5), (0, 0, 0, 0), (0, 1, 1),
    (0, 0, 6), (0, 3, 0), (5, 0), (1, 3), (0, 0, 7), (0, 0, 8), (0, 0, 9), (6, 0), (0, 4, 0), (1, 4), (7, 0),
    (0, 1, 2), (2, 0, 0), (3, 1), (2, 2), (8, 0), (0, 5, 0), (1, 5), (1, 0, 1), (0, 2, 1), (9, 0), (0, 6, 0),
    (0, 0, 0, 1), (1, 6), (0, 7, 0),
)


def expand_choices(choices: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    """Every candidate of the tree ``choices`` describes, each after its prefixes, duplicates dropped."""
    nodes: dict[tuple[int, ...], None] = {}
    for choice in choices:
        path = tuple(choice)
        if not path:
            raise ValueError("an empty path: the root (the last committed token) is implied, leave it out")
        if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in path):
            raise ValueError(f"path {list(path)}: top-k indices must be integers >= 0")
        for end in range(1, len(path) + 1):
            nodes.setdefault(path[:end], None)
    return list(nodes)


def cut_to_depth(nodes: Sequence[tuple[int, ...]], depth: int) -> list[tuple[int, ...]]:
    """The nodes no deeper than ``depth`` (a tree again: a kept node's prefixes are shallower)."""
    return [node for node in nodes if len(node) <= depth]
