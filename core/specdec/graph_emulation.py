"""CUDA graph semantics on any device, so that a machine without a GPU can test code meant to be
recorded (:class:`specdec.static_draft.RecordedCalls` in ``emulated`` mode).

A CUDA graph replays the kernels its recording launched, on the very memory they used then: a
replay sees the tensors the recorded run read (new values written into them, yes; a tensor made
afterwards and bound to the same Python name, no), Python values and branches frozen as they
were, and it cannot read the device from the host. Code that runs correctly unrecorded can fail
all three ways once recorded, and only a GPU would show it. :class:`EmulatedGraph` records the
ATen operations of one run (a ``TorchDispatchMode``), keeping every tensor they touched, and
replays them on those tensors: an operation that writes in place, or returns a view, acts on
the recorded memory again; one that returns a new tensor (or copies where it could not view) has its
result copied into the recorded one, where later operations read it. A host read while recording (``.item()``,
``nonzero`` ...) raises, as capture does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

T = TypeVar("T")

#: Operations whose result depends on the device's data on the host: a capture fails on them.
_HOST_READS = frozenset({
    "aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::unique_dim", "aten::_unique2",
    "aten::unique_consecutive", "aten::is_nonzero", "aten::equal",
})

#: Operations whose second argument lists index tensors, each possibly a boolean mask.
_MASK_INDEXING = frozenset({"aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_"})


class EmulatedGraph:
    """The operations of one recorded run, replayed on the tensors they used."""

    def __init__(self, calls: list[tuple[torch._ops.OpOverload, tuple, dict, Any, bool]]) -> None:
        self._calls = calls

    def pool(self) -> None:
        """No memory pool (a CUDA graph's ``pool()``, for code that shares one between graphs)."""

    def replay(self) -> None:
        for func, args, kwargs, recorded, fresh in self._calls:
            result = func(*args, **kwargs)
            if fresh:  # else it wrote the recorded memory itself, or views it
                for into, value in zip(_tensors(recorded), _tensors(result), strict=True):
                    into.copy_(value)


def emulate_graph(run: Callable[[], T]) -> tuple[EmulatedGraph, T]:
    """Record ``run`` as :func:`specdec.cuda_graphs.record_graph` does (two warm-up runs, then the
    recorded one); returns the emulated graph and what the recorded run returned, whose tensors
    each replay rewrites."""
    for _ in range(2):
        run()
    with _Recorder() as recorder:
        outputs = run()
    return EmulatedGraph(recorder.calls), outputs


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[torch._ops.OpOverload, tuple, dict, Any, bool]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func._schema.name in _HOST_READS or _indexes_by_mask(func, args) or _counts_repeats(func, args, kwargs):
            raise RuntimeError(f"{func._schema.name} reads the device on the host: a CUDA graph cannot record it")
        result = func(*args, **kwargs)
        self.calls.append((func, args, kwargs, result, _fresh(func, (args, kwargs), result)))
        return result


def _indexes_by_mask(func: torch._ops.OpOverload, args: tuple) -> bool:
    """Indexing by a boolean mask: its result's shape is the mask's count (``nonzero`` inside)."""
    return func._schema.name in _MASK_INDEXING and any(
        isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in _tensors(args[1]))


def _counts_repeats(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    """``repeat_interleave`` by a tensor of counts, its output's length not given: it adds the
    counts up on the host (by a number of repeats, it does not)."""
    if func._schema.name != "aten::repeat_interleave" or kwargs.get("output_size") is not None:
        return False
    # The overloads: Tensor (the counts alone), self_Tensor and self_int (a tensor, then the counts).
    repeats = args[0] if func._overloadname == "Tensor" else (args[1] if len(args) > 1 else kwargs.get("repeats"))
    return isinstance(repeats, torch.Tensor)


def _fresh(func: torch._ops.OpOverload, inputs: Any, result: Any) -> bool:
    """Whether ``func`` put its result in memory of its own, which a replay must refill: not when
    it wrote one of its arguments (``Tensor(a!)`` in its schema), nor when every tensor it
    returned views an argument's memory (``Tensor(a)``; ``reshape`` is annotated so, yet copies
    what it cannot view)."""
    if any(ret.alias_info is not None and ret.alias_info.is_write for ret in func._schema.returns):
        return False
    storages = {t.untyped_storage().data_ptr() for t in _tensors(inputs)}
    return any(t.untyped_storage().data_ptr() not in storages for t in _tensors(result))


def _tensors(value: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    tree_map(lambda leaf: found.append(leaf) if isinstance(leaf, torch.Tensor) else None, value)
    return found
