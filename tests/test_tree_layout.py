"""The tile-aligned layout of a draft tree (specdec.tree_layout): every token sees exactly the keys
its chain sees, each in the same 32-key tile offset and 512-key block as in the chain, whatever
the tree's shape and the cache's length."""

from __future__ import annotations

import random

import pytest

from specdec.kv_cache import KEY_BLOCK
from specdec.tree_layout import KEY_SPLIT, SUM_SPLIT, tile_aligned_layout


def _random_row(rng: random.Random, nodes: int) -> tuple[int, ...]:
    """A tree row's parents, the root first."""
    parents = [-1]
    for node in range(1, nodes + 1):
        parents.append(node - 1 if rng.random() < 0.4 else rng.randrange(node))
    return tuple(parents)


def _depths(parents: tuple[int, ...]) -> list[int]:
    depths = [0]
    for parent in parents[1:]:
        depths.append(depths[parent] + 1)
    return depths


def test_a_chain_stays_in_place() -> None:
    layout = tile_aligned_layout((-1, 0, 1, 2), start=45)
    assert layout.size == 4
    assert layout.slots == (0, 1, 2, 3)
    assert layout.writes == ((0, 0), (1, 1), (2, 2), (3, 3))
    assert layout.copies == ()
    assert layout.committed == (None,) * 4
    assert layout.visible == ((0,), (0, 1), (0, 1, 2), (0, 1, 2, 3))


def test_a_branch_gets_a_segment_of_its_own_with_the_partial_tile_copied() -> None:
    """At cache length 40 the partial tile holds 8 committed entries (32..39). The root's second
    child starts segment 1, one tile on: copies of those 8 entries at slots 24..31 (cache 64..71),
    the root copied to 32, the child at 33."""
    layout = tile_aligned_layout((-1, 0, 0), start=40)
    assert layout.slots == (0, 1, 33)
    assert layout.copies == tuple((i - 8, 24 + i) for i in range(8))
    assert layout.writes == ((0, 0), (0, 32), (1, 1), (2, 33))
    assert layout.committed == (None, None, -8)
    assert layout.visible[2] == (*range(24, 32), 32, 33)
    assert layout.span == 34


def test_near_the_end_of_a_block_a_tree_keeps_its_leading_chain() -> None:
    """At 500 the partial tile is the block's last: no further segment fits, so the row keeps its
    tokens up to the first that would start one."""
    layout = tile_aligned_layout((-1, 0, 1, 0, 3), start=500)
    assert layout.size == 3
    assert layout.slots == (0, 1, 2)


def test_a_tree_stays_in_its_run_of_summed_keys() -> None:
    """Where keys are summed in runs of 192 (no AMX), a tree at 170 has the 6th tile, the run's
    last, for its segments: the first chain alone; at 200 the run goes on to 384, and the same
    tree is laid out whole, as it is at 170 where a block is summed in one run."""
    parents = (-1, 0, 1, 0, 3)
    assert tile_aligned_layout(parents, 170, SUM_SPLIT).size == 3
    assert tile_aligned_layout(parents, 200, SUM_SPLIT).size == 5
    assert tile_aligned_layout(parents, 170, KEY_SPLIT).size == 5


@pytest.mark.parametrize("split", [KEY_SPLIT, SUM_SPLIT])
@pytest.mark.parametrize("seed", range(40))
def test_every_token_sees_its_chains_keys_tile_for_tile(seed: int, split: int) -> None:
    rng = random.Random(seed)
    start = rng.randrange(0, 3 * KEY_SPLIT)
    parents = _random_row(rng, rng.randrange(1, 40))
    layout = tile_aligned_layout(parents, start, split)
    depths = _depths(parents)
    assert 1 <= layout.size <= len(parents)
    assert layout == tile_aligned_layout(parents, start % KEY_SPLIT, split)
    # What each slot holds: a copied committed entry (its position) or a token (the position of its depth).
    position = {slot: start + source for source, slot in layout.copies}
    for token, slot in layout.writes:
        assert slot not in position or position[slot] == start + depths[token]
        position[slot] = start + depths[token]
    assert {(j, layout.slots[j]) for j in range(layout.size)} <= set(layout.writes)
    tail = start % KEY_BLOCK
    for j in range(layout.size):
        path = [j]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        committed = 0 if layout.committed[j] is None else tail
        # The chain sees the partial tile and its path; the token sees the same positions ...
        seen = sorted(position[slot] for slot in layout.visible[j]) + [start - tail + i for i in range(tail - committed)]
        assert sorted(seen) == [start - tail + i for i in range(tail)] + sorted(start + depths[t] for t in path)
        # ... each at a whole number of tiles from its position, in its position's block, in order.
        for slot in layout.visible[j]:
            shift = start + slot - position[slot]
            assert shift % KEY_BLOCK == 0 and shift >= 0
            assert (start + slot) // KEY_SPLIT == position[slot] // KEY_SPLIT
            assert (start + slot) % KEY_SPLIT // split == position[slot] % KEY_SPLIT // split or shift == 0
        slots = sorted(layout.visible[j], key=lambda s: position[s])
        assert slots == sorted(slots)
        assert layout.slots[j] == max(layout.visible[j])
