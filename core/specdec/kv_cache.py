"""A KV cache that grows in place, for decoding loops that append a few tokens per step.

transformers' ``DynamicLayer`` concatenates the whole cache with the new keys every forward, a
full copy of the KV cache per step (about 12% of a SmolLM2 step at 1,000 tokens of context on
CPU). This layer keeps a buffer with spare capacity, writes new keys into it and exposes the
filled part as a view; rolling back rejected drafts only moves the length.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PretrainedConfig
from transformers.cache_utils import DynamicLayer

_MIN_CAPACITY = 256


class GrowableLayer(DynamicLayer):
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._key_buf = self._value_buf = None
        self._length = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self._length, self._length + key_states.shape[-2]
        if self._key_buf is None or end > self._key_buf.shape[-2]:
            self._grow(key_states, value_states, max(end, 2 * start, _MIN_CAPACITY))
        self._key_buf[..., start:end, :] = key_states
        self._value_buf[..., start:end, :] = value_states
        self._set_length(end)
        return self.keys, self.values

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, capacity: int) -> None:
        def bigger(old: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
            shape = (*like.shape[:-2], capacity, like.shape[-1])
            buf = torch.empty(shape, dtype=like.dtype, device=like.device)
            if old is not None:
                buf[..., : self._length, :] = old[..., : self._length, :]
            return buf

        self._key_buf = bigger(self._key_buf, key_states)
        self._value_buf = bigger(self._value_buf, value_states)

    def _set_length(self, length: int) -> None:
        self._length = length
        self.keys = self._key_buf[..., :length, :]
        self.values = self._value_buf[..., :length, :]

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of tokens to remove")
        if tokens_to_remove and self.is_initialized:
            self._set_length(max(self._length + tokens_to_remove, 0))

    def get_seq_length(self) -> int:
        return self._length if self.is_initialized else 0

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("GrowableLayer holds one request per cache")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("GrowableLayer holds one request per cache")


def new_kv_cache(config: PretrainedConfig) -> DynamicCache:
    """A ``DynamicCache`` whose full-attention layers grow in place (others stay as they are)."""
    cache = DynamicCache(config=config)
    cache.layers = [GrowableLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache
