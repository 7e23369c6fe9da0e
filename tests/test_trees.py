"""The core's tree helpers: static trees from paths, depths and root-down paths."""

from __future__ import annotations

import pytest

from specdec.trees import node_depths, parents_of_paths, path_to


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
