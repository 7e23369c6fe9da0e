"""A drafter's steps in fixed shapes, recorded once as CUDA graphs and replayed, as the target's
forwards are (:mod:`specdec.static_forward`).

A draft head's step is a few small matrix products. Run eagerly on a GPU, its time is the host
launching kernels one at a time: on an H200, next to a 3.5 ms captured target forward, EAGLE-3's
eager head cost so much that the policy hardly let it draft. A drafter whose loop keeps its
picks on the device can instead run the loop over a :class:`StaticDraftCache` (its requests' head
caches copied side by side into fixed buffers, each row writing its new positions at its own
length) through :class:`RecordedCalls`, which records the loop once per shape and replays it:
one launch for the whole chain.

``static`` mode runs the same fixed shapes without recording them (a CPU can test them);
``cuda_graph`` records them; ``emulated`` records and replays them with CUDA graph semantics on
any device (:mod:`specdec.graph_emulation`: the tests' stand-in for a GPU).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

import torch

from specdec.cuda_graphs import record_graph
from specdec.graph_emulation import EmulatedGraph, emulate_graph
from specdec.kv_cache import RequestKV
from specdec.setup_time import SetupClock
from specdec.static_forward import batch_buckets, bucket_for, key_length_buckets

if TYPE_CHECKING:
    from specdec.resources import TargetContext

T = TypeVar("T")
logger = logging.getLogger("specdec.static_draft")


class RecordedCalls:
    """Calls of a function of fixed-shape tensors: recorded once per key and replayed
    (``cuda_graph``; ``emulated``, the same on any device, for tests), or called directly
    (``static``).

    The function must read nothing back to the host and keep its shapes for a key; what it
    writes to buffers outside its inputs (a :class:`StaticDraftCache`) is written again by each
    replay.

    ``clock``: recording a key (tens of milliseconds, once) is timed on it as setup, so the
    adaptive policy does not take it for the cost of drafting (a drafter's
    :attr:`~specdec.resources.ResourceManager.setup_clock`).

    If recording fails (the function does something a CUDA graph cannot hold), the calls run
    unrecorded from then on (``static``), with a warning: slower, never wrong.
    """

    def __init__(self, mode: str, device: torch.device, clock: SetupClock | None = None) -> None:
        if mode not in ("static", "cuda_graph", "emulated"):
            raise ValueError(f"mode: static, cuda_graph or emulated, not {mode!r}")
        self.mode = mode
        self.device = device
        self.clock = clock or SetupClock()
        self._recorded: dict[object, tuple[list[torch.Tensor], torch.cuda.CUDAGraph | EmulatedGraph, object]] = {}
        self._pool = None

    @classmethod
    def like_target(cls, target: TargetContext, clock: SetupClock | None = None) -> RecordedCalls | None:
        """Calls that run as the target's forwards do: ``None`` where those are eager, recorded
        where they are captured on CUDA (``cuda_graph``, ``compile``), emulated where their
        capture is (``cuda_graph`` off CUDA: :func:`specdec.testing.recording.emulate_cuda_graphs`),
        ``static`` elsewhere."""
        execution = target.runner.execution
        if execution == "eager":
            return None
        if execution in ("cuda_graph", "compile") and target.device.type == "cuda":
            return cls("cuda_graph", target.device, clock)
        return cls("emulated" if execution == "cuda_graph" else "static", target.device, clock)

    @property
    def shapes(self) -> list[object]:
        """The keys recorded so far (none in ``static`` mode)."""
        return list(self._recorded)

    def __call__(self, key: object, fn: Callable[..., T], inputs: Sequence[torch.Tensor]) -> T:
        """``fn(*inputs)`` (a tensor or a tuple of them); recorded at the first call with ``key``,
        replayed at the next ones (the output is then the recorded tensors: read or copy them
        before the next call)."""
        if self.mode == "static":
            return fn(*inputs)
        if key not in self._recorded:
            static = [tensor.clone() for tensor in inputs]
            try:
                with self.clock.timing():
                    if self.mode == "emulated":
                        graph, output = emulate_graph(lambda: fn(*static))
                    else:
                        graph, output = record_graph(lambda: fn(*static), self.device, self._pool)
            except RuntimeError as exc:
                logger.warning("recording a drafting step as a CUDA graph failed (%s); running it unrecorded from now on", exc)
                self.mode = "static"
                return fn(*inputs)
            self._pool = graph.pool() if self.mode == "cuda_graph" else None
            self._recorded[key] = (static, graph, output)
        static, graph, output = self._recorded[key]
        for target, tensor in zip(static, inputs, strict=True):
            target.copy_(tensor)
        graph.replay()
        return output


class StaticDraftCache:
    """A drafter's per-layer keys and values for a batch, in fixed buffers of ``max_rows`` rows
    and ``capacity`` positions.

    :meth:`load` copies each request's cache into its row; a recorded step then sets
    :meth:`write_at` (each row's positions, a device tensor) and the key length it attends over,
    and a layer's ``append`` writes its new keys and values there and returns the buffers'
    first ``key_length`` positions: the drafter masks what lies past each row's own positions.
    Nothing reaches the requests' own caches, so positions drafted here need no rollback; a
    drafter that keeps some of them copies them out (:attr:`keys`, :attr:`values`).

    ``value_shape``: the values' ``(heads, dim)`` where they differ from the keys' (DeepSeek's
    latent attention caches a compressed latent and a rotary key).
    """

    def __init__(self, num_layers: int, max_rows: int, kv_heads: int, head_dim: int, capacity: int,
                 dtype: torch.dtype, device: torch.device, value_shape: tuple[int, int] | None = None) -> None:
        value_heads, value_dim = value_shape or (kv_heads, head_dim)
        self.max_rows = max_rows
        self.capacity = capacity
        self.keys = [torch.zeros(max_rows, kv_heads, capacity, head_dim, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(max_rows, value_heads, capacity, value_dim, dtype=dtype, device=device)
                       for _ in range(num_layers)]
        self._positions: torch.Tensor | None = None
        self._key_length = capacity
        self._batch_sizes = batch_buckets(max_rows)
        self._key_lengths = key_length_buckets(capacity)

    def shape_for(self, rows: int, positions: int) -> tuple[int, int]:
        """The recorded shape a step of ``rows`` requests attending over at most ``positions``
        positions runs in: its rows padded to a batch bucket, its keys to a key length bucket (as
        the target's forwards are, :mod:`specdec.static_forward`)."""
        padded_rows, key_length = bucket_for(rows, self._batch_sizes), bucket_for(positions, self._key_lengths)
        if padded_rows is None or key_length is None:
            raise ValueError(f"{rows} rows of {positions} positions exceed this cache's {self.max_rows} x {self.capacity}")
        return padded_rows, key_length

    def load(self, rows: list[list[RequestKV]]) -> list[int]:
        """Copy request ``b``'s caches (``rows[b]``: its first layers', in order) into row ``b``;
        returns the first layer's lengths."""
        for row, layers in enumerate(rows):
            if len(layers) > len(self.keys):
                raise ValueError(f"{len(layers)} layers for a cache of {len(self.keys)}")
            for keys, values, source in zip(self.keys, self.values, layers):
                if (cached := source.cached()) is not None:
                    keys[row, :, : source.length].copy_(cached[0][0])
                    values[row, :, : source.length].copy_(cached[1][0])
        return [layers[0].length for layers in rows]

    def write_at(self, positions: torch.Tensor, key_length: int) -> None:
        """The next appends write row ``b``'s new positions at ``positions[b]`` (``[rows, new]``)
        and return the first ``key_length`` positions."""
        self._positions, self._key_length = positions, key_length

    def layer(self, index: int) -> _StaticDraftLayer:
        return _StaticDraftLayer(self, index)


class _StaticDraftLayer:
    """One layer of a :class:`StaticDraftCache`, as a drafter's attention sees its cache."""

    def __init__(self, cache: StaticDraftCache, index: int) -> None:
        self._cache = cache
        self._index = index

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``[rows, heads, new, dim]`` keys and values at each row's positions."""
        cache = self._cache
        rows, new = keys.shape[0], keys.shape[2]
        positions = cache._positions[:rows, :new, None]
        key_buf, value_buf = cache.keys[self._index][:rows], cache.values[self._index][:rows]
        key_buf.scatter_(2, positions[:, None].expand(rows, keys.shape[1], new, keys.shape[-1]), keys)
        value_buf.scatter_(2, positions[:, None].expand(rows, values.shape[1], new, values.shape[-1]), values)
        return key_buf[:, :, : cache._key_length], value_buf[:, :, : cache._key_length]
