"""Where a verify forward writes a draft tree's tokens so that each token's logits have the bits of
decoding its path one token at a time (bfloat16 on a CPU with oneDNN's bfloat16 kernels).

PyTorch's CPU flash attention adds up a query's keys tile by tile, :data:`~specdec.kv_cache.KEY_BLOCK`
(32) keys to a tile, within blocks of :data:`~specdec.kv_cache.KEY_SPLIT` keys; without AMX,
oneDNN's multiply also sums each block's keys in separate runs of :data:`SUM_SPLIT` keys, added
together at the end (:func:`summation_split`). Keys a query does not see add exact zeros wherever
they lie, but which of the keys it does see share a tile or a run changes the rounding. A chain
puts the key at position ``p`` in slot ``p``, so a query's last keys share a tile with the end of
the committed cache. A tree laid out flat puts each node's ancestors wherever its siblings leave
room, grouped differently: on SmolLM2, about one node in ten got other bits than its chain.

:func:`tile_aligned_layout` lays a tree out in *segments*, each the chain from the root to a
tip, placed a whole number of tiles after the cache's last, partial tile and inside the same
run of summed keys: every key then shares its tile and its run with exactly the keys it shares
them with in the chain. The first segment is the chain in place; each further one starts where the tree
branches and holds copies of the committed keys of the partial tile and of the branch's
ancestors, written by the same forward (a token's key and value go to every segment that holds
it). Tokens are computed once each; only key slots are repeated. A tree that needs more segments
than the run has room for is cut to its leading tokens that fit (still a tree, as parents come
first); near the run's end that leaves the first chain.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, lru_cache

import torch

from specdec.kv_cache import KEY_BLOCK, KEY_SPLIT
from specdec.trees import node_depths, path_to

__all__ = ["KEY_SPLIT", "SUM_SPLIT", "TileLayout", "summation_split", "tile_aligned_layout"]

#: The keys oneDNN's bfloat16 multiply without AMX sums in one run, from the start of each
#: :data:`KEY_SPLIT` block (runs of 192, 192 and 128 keys): measured on a 2-core AMD EPYC with
#: AVX512-BF16, where a tree segment placed in the next run gave a node other bits than its chain.
SUM_SPLIT = 192


@cache
def summation_split() -> int:
    """The run of keys this CPU's bfloat16 attention sums at once: :data:`KEY_SPLIT` with AMX
    (each block in one run, as measured on AMX Xeons), :data:`SUM_SPLIT` without."""
    return KEY_SPLIT if torch.cpu._is_amx_tile_supported() else SUM_SPLIT


@dataclass(frozen=True)
class TileLayout:
    """One tree row of a verify forward, every slot counted from the row's cache length
    (the root's slot, 0); negative slots are committed entries.

    :param size: how many of the row's tokens (root first) are laid out: the others are dropped.
    :param slots: each kept token's own slot (its depth for the first segment's tokens).
    :param writes: ``(token, slot)`` for every slot a token's key and value go to, its own first.
    :param copies: ``(source, slot)``: committed entries of the partial tile, copied in front of a
        further segment before the forward's attention reads them.
    :param committed: per token, how many slots before the root it sees: all (its cache, ``None``)
        or up to the partial tile (``-tail``, a further segment's token, which sees the copies).
    :param visible: per token, the slots it sees from the root's on.
    """

    size: int
    slots: tuple[int, ...]
    writes: tuple[tuple[int, int], ...]
    copies: tuple[tuple[int, int], ...]
    committed: tuple[int | None, ...]
    visible: tuple[tuple[int, ...], ...]

    @property
    def span(self) -> int:
        """Slots from the root's to the last written, inclusive."""
        return 1 + max(slot for _, slot in self.writes)


def tile_aligned_layout(parents: tuple[int, ...], start: int, split: int | None = None) -> TileLayout:
    """Lay out a tree row (``parents[0] == -1`` for the root, every parent before its children)
    whose root goes to cache index ``start``, every segment inside the run of ``split`` keys
    (a multiple of :data:`KEY_BLOCK`; :func:`summation_split` unless given) that ``start`` lies
    in. The layout depends on ``start`` only through its place in its :data:`KEY_SPLIT` block, so
    layouts are cached by that."""
    return _layout(tuple(parents), start % KEY_SPLIT, split or summation_split())


@lru_cache(maxsize=4096)
def _layout(parents: tuple[int, ...], start: int, split: int) -> TileLayout:
    tail = start % KEY_BLOCK
    tile = start // KEY_BLOCK
    run_end = min((start // split + 1) * split, KEY_SPLIT) // KEY_BLOCK  # the first tile past the run
    depth = [d - 1 for d in node_depths(parents)]  # the root (parents[0] == -1) at depth 0
    per_segment = -(-(tail + max(depth) + 1) // KEY_BLOCK)

    def base(segment: int) -> int:
        """The first slot of a segment: its copy of the partial tile (the committed tail)."""
        return segment * per_segment * KEY_BLOCK - tail

    def fits(segment: int) -> bool:
        return tile + (segment + 1) * per_segment <= run_end

    segment_of = [0]
    tips = [0]
    writes = [(0, 0)]
    copies: list[tuple[int, int]] = []
    size = len(parents)
    for j in range(1, len(parents)):
        parent = parents[j]
        segment = segment_of[parent]
        if tips[segment] != parent:
            segment = len(tips)
            if not fits(segment):
                size = j
                break
            tips.append(j)
            copies += [(i - tail, base(segment) + i) for i in range(tail)]
            writes += [(u, base(segment) + tail + depth[u]) for u in path_to(parent, parents)]
        tips[segment] = j
        segment_of.append(segment)
        writes.append((j, base(segment) + tail + depth[j]))
    slots = tuple(base(segment_of[j]) + tail + depth[j] for j in range(size))
    visible = []
    for j in range(size):
        segment = segment_of[j]
        own = [base(segment) + tail + depth[u] for u in path_to(j, parents)]
        copied = [base(segment) + i for i in range(tail)] if segment else []
        visible.append(tuple(copied + own))
    writes.sort(key=lambda w: (w[0], w[1] != slots[w[0]]))
    return TileLayout(
        size=size,
        slots=slots,
        writes=tuple(writes),
        copies=tuple(copies),
        committed=tuple(None if segment_of[j] == 0 else -tail for j in range(size)),
        visible=tuple(visible),
    )

