"""Automatic prefix caching: the KV entries of prompts' leading blocks, kept for later prompts
that begin with the same tokens (agent loops resending their conversation, retries, a shared
system prompt). vLLM's ``enable_prefix_caching``, TensorRT-LLM's ``enable_block_reuse``.

A block is ``block_size`` positions of one prompt, at a multiple of ``block_size``; it holds every
layer's keys and values for them and the hidden states the active method keeps. Blocks form a
tree keyed by their tokens, so a block is found only under the exact tokens before it (no hash
to collide). The least recently used block that no other block continues leaves first when the
cache would pass its memory budget.

A hit is the same bits as prefilling again: a prompt is always prefilled in position-aligned
chunks of ``block_size`` tokens (:mod:`specdec.prefill`), and a chunk's entries depend only on
the tokens up to its end, through the same forward whether the chunks before it were computed
or taken from here. That is also why only whole blocks are kept.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specdec.hidden_states import HiddenStates

#: Positions per cached block, and per prefill chunk when prefix caching is on. On a 2-core CPU
#: with SmolLM2-135M, chunks of 256 prefill as fast as one forward of the whole prompt (1,000 to
#: 4,000 tokens, float32); much smaller chunks multiply less efficiently.
DEFAULT_BLOCK_SIZE = 256

#: A block's keys and values per layer, and its kept hidden states.
BlockContents = tuple[list[tuple[torch.Tensor, torch.Tensor]], HiddenStates | None]


@dataclass(eq=False)
class Block:
    """One cached block: its tokens, each layer's keys and values ``[heads, block_size, head_dim]``,
    and the kept hidden states ``[block_size, hidden]`` (``None`` when the method keeps none)."""

    tokens: tuple[int, ...]
    parent: Block | None
    entries: list[tuple[torch.Tensor, torch.Tensor]]
    hidden: HiddenStates | None
    nbytes: int
    children: dict[tuple[int, ...], Block] = field(default_factory=dict)


class PrefixCache:
    """Blocks of ``block_size`` positions of earlier prompts, at most ``capacity_bytes`` of them
    (keys, values and hidden states together)."""

    def __init__(self, capacity_bytes: int, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        self.capacity_bytes = capacity_bytes
        self.block_size = block_size
        self.used_bytes = 0
        self._roots: dict[tuple[int, ...], Block] = {}
        #: Every block, least recently used first.
        self._lru: OrderedDict[int, Block] = OrderedDict()

    def __len__(self) -> int:
        return len(self._lru)

    def match(self, token_ids: list[int]) -> list[Block]:
        """The cached blocks that begin ``token_ids``, in order, leaving at least its last token
        to be computed (its logits are the prefill's output); they become the most recently used."""
        found: list[Block] = []
        children, size = self._roots, self.block_size
        for start in range(0, len(token_ids) - size, size):
            block = children.get(tuple(token_ids[start : start + size]))
            if block is None:
                break
            found.append(block)
            children = block.children
        self._touch(found)
        return found

    def insert(self, token_ids: list[int], contents: Callable[[int], BlockContents]) -> None:
        """Keep the whole blocks of ``token_ids``; ``contents(i)`` gives the entries and hidden
        states of its ``i``-th block, asked only for blocks not cached yet (a cached block stays as
        it is: the same bits)."""
        path: list[Block] = []
        children, parent, size = self._roots, None, self.block_size
        for index in range(len(token_ids) // size):
            tokens = tuple(token_ids[index * size : (index + 1) * size])
            block = children.get(tokens)
            if block is None:
                entries, hidden = contents(index)
                nbytes = sum(t.numel() * t.element_size() for pair in entries for t in pair)
                if hidden is not None:
                    nbytes += sum(hidden[i].numel() * hidden[i].element_size() for i in hidden.kept)
                if not self._make_room(nbytes, keep=path):
                    break
                block = Block(tokens, parent, entries, hidden, nbytes)
                children[tokens] = block
                self.used_bytes += nbytes
            path.append(block)
            children, parent = block.children, block
        self._touch(path)

    def clear(self) -> None:
        self._roots.clear()
        self._lru.clear()
        self.used_bytes = 0

    def _touch(self, path: list[Block]) -> None:
        # The deepest block first, so that a block is always used less recently than the blocks
        # before it: eviction then meets a path's end before its start.
        for block in reversed(path):
            self._lru[id(block)] = block
            self._lru.move_to_end(id(block))

    def _make_room(self, nbytes: int, keep: list[Block]) -> bool:
        """Evict least recently used leaves (never a block of ``keep``) until ``nbytes`` more
        fit; ``False`` when they cannot."""
        if nbytes > self.capacity_bytes:
            return False
        kept = {id(block) for block in keep}
        while self.used_bytes + nbytes > self.capacity_bytes:
            victim = next((b for key, b in self._lru.items() if not b.children and key not in kept), None)
            if victim is None:
                return False
            del self._lru[id(victim)]
            siblings = victim.parent.children if victim.parent is not None else self._roots
            del siblings[victim.tokens]
            self.used_bytes -= victim.nbytes
        return True
