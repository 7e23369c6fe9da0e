"""The core's tree helpers: static trees from paths, depths and root-down paths."""

from __future__ import annotations

import pytest

from specdec.trees import DraftTree, node_depths, parents_of_paths, path_to


def test_parents_of_paths_lays_out_a_tree() -> None:
    paths = [(0,), (0, 0), (1,), (0, 1), (0, 0, 0), (1, 0)]
    parents = parents_of_paths(paths)
    assert parents == [-1, 0, -1, 0, 1, 2]
    assert node_depths(parents) == [1, 2, 1, 2, 3, 2]
    assert path_to(4, parents) == [0, 1, 4]
    assert path_to(5, parents) == [2, 5]
    assert path_to(-1, parents) == []


@pytest.mark.parametrize(
    ("paths", "message"),
    [([(0, 0), (0,)], "comes before its parent"), ([(0,), (0,)], "appears twice"), ([()], "must not be empty")],
)
def test_parents_of_paths_rejects_what_is_not_a_parents_first_tree(paths: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parents_of_paths(paths)


def test_draft_tree_shares_common_prefixes() -> None:
    """Chains added to a DraftTree share their common prefixes (same parent and token: one
    node), parents come first, and a token repeated under another parent is a node of its own."""
    tree = DraftTree()
    assert tree.add_chain([5, 6, 7]) == [0, 1, 2]
    assert tree.add_chain([5, 6, 8]) == [0, 1, 3]
    assert tree.add_chain([6]) == [4]
    assert tree.add(0, 6) == 1 and tree.add(4, 6) == 5
    assert tree.token_ids == [5, 6, 7, 8, 6, 6]
    assert tree.parents == [-1, 0, 1, 1, -1, 4]
    assert len(tree) == 6
