"""A KV cache whose buffers never move: the batch cache of the captured (static-shape) forward path.

A CUDA graph replays the kernels it recorded on the very addresses it recorded them with, so the
cache a captured forward writes to must keep its buffers for good: :class:`StaticKVCache`
allocates every layer's keys and values once, for ``max_rows`` requests of ``capacity`` positions,
and does everything else in place (requests leaving, joining, rolling back, moving an accepted
tree path). Inside a forward, a layer writes the new keys where :attr:`StaticKVCache.write_positions`
(a device tensor the forward fills) says and returns its buffer for the batch's rows up to
:attr:`StaticKVCache.attend` positions: attention runs over that bucketed length, the mask hiding
what each row has not written, so its shapes depend on the batch and token counts and the length
bucket, never on the lengths themselves.

Everything outside the forward (the engine's bookkeeping) keeps :class:`~specdec.kv_cache.BatchKVCache`'s
interface: requests are prefilled alone in an ordinary cache and copied into a row here.
"""

from __future__ import annotations

import torch
from transformers import PretrainedConfig

from specdec.kv_cache import BatchKVCache, GrowableLayer


class StaticLayer(GrowableLayer):
    """One attention layer's keys and values, ``[max_rows, heads, capacity, head_dim]`` each,
    allocated at the first write and never reallocated."""

    cache: StaticKVCache

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self._key_buf is None:
            self._allocate(key_states, value_states)
        rows = key_states.shape[0]
        positions = self.cache.write_positions
        index = torch.arange(rows, device=key_states.device)[:, None]
        # Advanced indices around a slice put their dimensions first: [rows, width, heads, dim].
        self._key_buf[index, :, positions] = key_states.transpose(1, 2)
        self._value_buf[index, :, positions] = value_states.transpose(1, 2)
        attend = self.cache.attend
        self.keys, self.values = self._key_buf[:rows, :, :attend], self._value_buf[:rows, :, :attend]
        return self.keys, self.values

    def _allocate(self, keys_like: torch.Tensor, values_like: torch.Tensor) -> None:
        self._key_buf = self._zeros(keys_like)
        self._value_buf = self._zeros(values_like)
        self.dtype, self.device, self.is_initialized = keys_like.dtype, keys_like.device, True

    def _zeros(self, like: torch.Tensor) -> torch.Tensor:
        # Zeros, not empty: masked positions still enter the attention product, and
        # uninitialised memory may hold NaN, which a mask cannot cancel. Ordinary tensors even
        # when the first forward runs in inference mode (capture at start-up does): rows join
        # and leave these buffers in place, also outside it.
        shape = (self.cache.max_rows, like.shape[1], self.cache.capacity, like.shape[-1])
        with torch.inference_mode(False):
            return torch.zeros(shape, dtype=like.dtype, device=like.device)

    def _grow(self, keys_like: torch.Tensor, values_like: torch.Tensor, capacity: int) -> None:
        if capacity > self.cache.capacity:
            raise ValueError(f"the static KV cache holds {self.cache.capacity} positions per request, not {capacity}")
        if self._key_buf is None:
            self._allocate(keys_like, values_like)

    def select_rows(self, rows: torch.Tensor) -> None:
        if self._key_buf is not None:
            self._key_buf[: len(rows)] = self._key_buf.index_select(0, rows)
            self._value_buf[: len(rows)] = self._value_buf.index_select(0, rows)

    def append_rows(self, others: list[GrowableLayer], num_mine: int, num_theirs: list[int]) -> None:
        """Copy ``others``' rows (ordinary caches) into rows ``num_mine`` onward, in place."""
        row = num_mine
        for other, count in zip(others, num_theirs, strict=True):
            length = min(max(other.cache.lengths, default=0), self.cache.capacity)
            if other._key_buf is not None and length > 0:
                if self._key_buf is None:
                    self._allocate(other._key_buf, other._value_buf)
                self._key_buf[row : row + count, :, :length] = other._key_buf[:, :, :length]
                self._value_buf[row : row + count, :, :length] = other._value_buf[:, :, :length]
            row += count


class StaticKVCache(BatchKVCache):
    """A :class:`~specdec.kv_cache.BatchKVCache` of fixed buffers: ``max_rows`` requests of up to
    ``capacity`` positions each (a forward's padded tokens included)."""

    def __init__(self, config: PretrainedConfig, max_rows: int, capacity: int) -> None:
        super().__init__(config, rows=0)
        self.layers = [StaticLayer(self) for _ in self.layers]
        self.max_rows = max_rows
        self.capacity = capacity
        #: The positions the running forward attends over, from the first (set by the forward:
        #: the shortest length bucket that holds its rows' keys, ``capacity`` at most).
        self.attend = capacity
        #: ``[rows, width]``: where the running forward writes each row's tokens (set by the forward).
        self.write_positions: torch.Tensor | None = None

    def capacity_for(self, end: int, width: int) -> int:
        return end

    def check_room(self, rows: int, width: int) -> None:
        """Refuse a forward that would write past the buffers (rows or positions)."""
        if rows > self.max_rows:
            raise ValueError(f"{rows} requests in a forward over a static KV cache of {self.max_rows} rows")
        end = max(self.lengths, default=0) + width
        if end > self.capacity:
            raise ValueError(f"a forward to position {end} over a static KV cache of {self.capacity} positions")

    def append_rows(self, *others: BatchKVCache) -> None:
        joining = sum(other.num_rows for other in others)
        if self.num_rows + joining > self.max_rows:
            raise ValueError(f"{self.num_rows + joining} requests in a static KV cache of {self.max_rows} rows")
        super().append_rows(*others)

    def reset(self) -> None:
        """Forget every row (the buffers stay, for the forwards captured on them)."""
        self.lengths = []
