"""The target hidden states a forward keeps for the active method: only the layers it reads.

A model's forward yields ``L + 1`` hidden states for ``L`` decoder layers (``[i]`` enters decoder
layer ``i``, ``[0]`` is the token embeddings, ``[-1]`` the final normed state). A method reads one
to three of them (Medusa, MTP, the MLP speculator and ReDrafter the last; EAGLE-3 three), so the
runner keeps only those: on the captured paths (CUDA graphs, compiled forwards) every kept state
is copied out of the graph's buffers once per forward, and a graph recorded with fewer outputs
holds less memory.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class HiddenStates:
    """The kept hidden states of one forward, indexed as transformers' ``hidden_states`` tuple:
    ``states[i]`` (negative ``i`` counts from the end, ``[-1]`` the final normed state) for every
    ``i`` the runner was asked to keep; any other index is a ``KeyError`` saying so."""

    def __init__(self, states: dict[int, torch.Tensor], count: int) -> None:
        self._states = states
        #: How many hidden states the model's forward has (``L + 1``), kept or not.
        self.count = count

    @property
    def kept(self) -> tuple[int, ...]:
        """The indices held, ascending, each in ``0 .. count - 1``."""
        return tuple(sorted(self._states))

    def __getitem__(self, index: int) -> torch.Tensor:
        key = index + self.count if index < 0 else index
        if key not in self._states:
            raise KeyError(
                f"hidden state {index} was not kept (kept: {list(self.kept)}); a method lists the ones it reads "
                "in HiddenStateResources(target, layers=...)"
            )
        return self._states[key]

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> HiddenStates:
        """The same entries, each passed through ``fn`` (a row's slice, a copy)."""
        return HiddenStates({i: fn(h) for i, h in self._states.items()}, self.count)

    @staticmethod
    def concat(parts: list[HiddenStates]) -> HiddenStates:
        """The entries of consecutive forwards (or cached blocks), joined along their positions."""
        first = parts[0]
        return HiddenStates({i: torch.cat([part._states[i] for part in parts]) for i in first._states}, first.count)
