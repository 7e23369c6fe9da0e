"""The suffix tree counts every substring up to its depth, grows and shrinks incrementally, and
drafts the most probable continuations best first."""

from __future__ import annotations

import random

import pytest

from specdec.suffix import SuffixTree


def substrings(sequences: list[list[int]], depth: int) -> dict[tuple[int, ...], int]:
    counts: dict[tuple[int, ...], int] = {}
    for seq in sequences:
        for i in range(len(seq)):
            for n in range(1, depth + 1):
                if i + n <= len(seq):
                    key = tuple(seq[i : i + n])
                    counts[key] = counts.get(key, 0) + 1
    return counts


def tree_counts(tree: SuffixTree) -> dict[tuple[int, ...], int]:
    counts, stack = {}, [((), 0)]
    while stack:
        path, node = stack.pop()
        for token, child in tree.children(node).items():
            counts[path + (token,)] = tree.count(child)
            stack.append((path + (token,), child))
    return counts


def test_counts_every_substring_up_to_the_depth_added_in_pieces() -> None:
    rng = random.Random(0)
    sequences = [[rng.randrange(4) for _ in range(rng.randrange(1, 40))] for _ in range(5)]
    tree = SuffixTree(5)
    for seq in sequences:
        frontier = tree.frontier()
        cut = len(seq) // 3
        frontier = tree.extend(frontier, seq[:cut])
        frontier = tree.extend(frontier, seq[cut:])
        assert frontier[-1] == tree.matches(seq)[-1]  # the frontier holds the sequence's last suffixes
    assert tree_counts(tree) == substrings(sequences, 5)
    assert tree.num_nodes == 1 + len(substrings(sequences, 5))


def test_removing_sequences_leaves_the_others() -> None:
    rng = random.Random(1)
    sequences = [[rng.randrange(5) for _ in range(30)] for _ in range(4)]
    tree = SuffixTree(6)
    for seq in sequences:
        tree.extend(tree.frontier(), seq)
    tree.remove(sequences[1])
    tree.remove(sequences[3])
    assert tree_counts(tree) == substrings([sequences[0], sequences[2]], 6)
    tree.remove(sequences[0])
    tree.remove(sequences[2])
    assert tree.num_nodes == 1 and not tree.children(0) and tree.count(0) == 0


def test_matches_are_the_suffixes_that_occur() -> None:
    tree = SuffixTree(4)
    tree.extend(tree.frontier(), [1, 2, 3, 4, 5])
    assert [tree.count(n) for n in tree.matches([9, 2, 3])] == [1, 1]  # "3", "2 3"; "9 2 3" never occurred
    assert tree.matches([7]) == []
    assert len(tree.matches([1, 2, 3, 4, 5])) == 4  # no deeper than the tree


def test_chain_follows_the_most_frequent_path_while_probable() -> None:
    """After "1": "2" three times in four, then "3" always: probabilities .75, .75; "9" once."""
    tree = SuffixTree(8)
    for seq in ([1, 2, 3], [1, 2, 3], [1, 2, 3], [1, 9]):
        tree.extend(tree.frontier(), seq)
    node = tree.matches([1])[0]
    draft = tree.speculate(node, 5, 0.0, tree=False)
    assert draft.token_ids == [2, 3] and draft.parents == [-1, 0]
    assert draft.probs == pytest.approx([0.75, 0.75])
    assert tree.speculate(node, 5, 0.8, tree=False).token_ids == []
    assert tree.speculate(node, 1, 0.0, tree=False).token_ids == [2]


def test_tree_adds_the_most_probable_nodes_first() -> None:
    tree = SuffixTree(8)
    for seq in ([1, 2, 3], [1, 2, 3], [1, 2, 4], [1, 9, 5]):
        tree.extend(tree.frontier(), seq)
    node = tree.matches([1])[0]
    draft = tree.speculate(node, 10, 0.0, tree=True)
    # 2 (.75), 3 (.5), 9 (.25), 4 (.25), 5 (.25): ties keep the order they were reached in
    assert draft.token_ids == [2, 3, 9, 4, 5]
    assert draft.parents == [-1, 0, -1, 0, 2]
    assert draft.probs == pytest.approx([0.75, 0.5, 0.25, 0.25, 0.25])
    assert tree.speculate(node, 10, 0.3, tree=True).token_ids == [2, 3]
    assert tree.speculate(node, 2, 0.0, tree=True).token_ids == [2, 3]
