"""A KV cache that grows in place and holds a batch of requests, each with its own length.

transformers' ``DynamicLayer`` concatenates the whole cache with the new keys every forward, a
full copy of the KV cache per step (about 12% of a SmolLM2 step at 1,000 tokens of context on
CPU). These layers keep a buffer with spare capacity, write new keys into it and expose the
filled part as a view; rolling back rejected drafts only moves a length.

Rows are independent requests. Speculative decoding accepts a different number of tokens per
request every step, so each row has its own length (``BatchKVCache.lengths``). A forward writes
row ``b``'s new entries at ``lengths[b]`` onward and returns keys up to the longest row; the
runner's attention mask hides, per row, everything at or past that row's own end. Entries past a
row's length are stale (rejected drafts, padding) and are overwritten by its next forward.

Sliding-window attention layers (Gemma 2 and 3, gpt-oss, Mistral with ``sliding_window``) are
held the same way, every position kept: the runner's masks hide the keys outside each query's
window (:mod:`specdec.runner`). transformers' own sliding layers keep only the last
``window - 1`` entries, which a verify forward's rejected drafts could not be rolled back from.
Capacity never doubles past the model's context (:meth:`BatchKVCache.capacity_for`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache, PretrainedConfig, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from specdec.errors import ModelLoadError

_MIN_CAPACITY = 256

#: PyTorch's CPU flash attention adds up a query's keys 32 to a tile (draft trees are laid out
#: by these tiles: :mod:`specdec.tree_layout`).
KEY_BLOCK = 32
#: PyTorch's CPU flash attention multiplies its keys in blocks of this many (fewer when a forward
#: has fewer keys), each block on its own; a batch forward reads its keys in whole blocks.
KEY_SPLIT = 512


def padded_key_length(end: int) -> int:
    """``end`` keys rounded up to whole :data:`KEY_SPLIT` blocks, the extra ones masked.

    PyTorch's CPU flash attention sums a query's keys in an order that depends on how many keys
    it is given: a token two drafts before the end of a verify forward saw two more (masked) keys
    than the same token decoded alone, and on a 2-core AVX512-BF16 Xeon its bfloat16 attention
    output differed in about a third of the shapes tried. Whole blocks of 32 keys sufficed there
    (AMX); on a 2-core AMD EPYC with AVX512-BF16 (oneDNN without AMX) the multiply's order also
    depended on the block's length (a token at 286 got other bits with 288 keys than with 320,
    and one at 831 with 832 than with 864). Every block whole, each multiply has the same shape
    whatever the forward, a masked key adds an exact zero wherever it lies, and so does a wholly
    masked block: each token gets the same bits alone, in a verify forward or in a batch (the
    issue-48 batch invariance that makes bfloat16 speculative output plain decoding's, bit for
    bit). Measured on that EPYC, plain decoding at 20-130 tokens of context took 0.6% longer a
    step than with blocks of 32, and nothing measurable at 800.
    """
    return -(-end // KEY_SPLIT) * KEY_SPLIT

#: The attention layer types the cache holds (names as in transformers' ``config.layer_types``).
SUPPORTED_LAYER_TYPES = ("full_attention", "sliding_attention")


def attention_layer_types(config: PretrainedConfig) -> list[str]:
    """Each decoder layer's attention type, as transformers names it (``full_attention``,
    ``sliding_attention``, ``chunked_attention``, ``linear_attention``...).

    A config without ``layer_types`` gives every layer one type, read from its fields the way
    transformers' caches read it.
    """
    text = config.get_text_config(decoder=True)
    types = getattr(text, "layer_types", None)
    if types is not None:
        return list(types)
    if getattr(text, "sliding_window", None) is not None:
        kind = "sliding_attention"
    elif getattr(text, "attention_chunk_size", None) is not None:
        kind = "chunked_attention"
    else:
        kind = "full_attention"
    return [kind] * int(text.num_hidden_layers)


def sliding_window(config: PretrainedConfig) -> int | None:
    """The window of the model's sliding-window layers; ``None`` when it has none."""
    if "sliding_attention" not in attention_layer_types(config):
        return None
    return int(config.get_text_config(decoder=True).sliding_window)


def context_length(config: PretrainedConfig) -> int:
    """The most positions the model takes (``max_position_embeddings``; unbounded without one)."""
    return int(getattr(config.get_text_config(decoder=True), "max_position_embeddings", 0) or 1 << 30)


def check_supported(config: PretrainedConfig) -> None:
    """Refuse a model whose attention layers the cache cannot hold, naming what is missing."""
    missing = sorted(set(attention_layer_types(config)) - set(SUPPORTED_LAYER_TYPES))
    if missing:
        raise ModelLoadError(
            f"{getattr(config, 'model_type', 'this model')}: specdec's KV cache does not support {', '.join(missing)} "
            f"layers yet (it holds {' and '.join(SUPPORTED_LAYER_TYPES)} layers)"
        )


def check_model_supported(model: PreTrainedModel) -> None:
    """:func:`check_supported`, and refuse a model that keeps a recurrent state in place of a KV
    cache: transformers marks those ``_is_stateful``, and some (RWKV, xLSTM) name no layer types
    to refuse them by, so they would decode wrongly or fail mid-decoding."""
    check_supported(model.config)
    if getattr(model, "_is_stateful", False):
        raise ModelLoadError(
            f"{getattr(model.config, 'model_type', 'this model')}: specdec's KV cache does not support models with a "
            f"recurrent state yet ({type(model).__name__} keeps one in place of a key/value cache)"
        )


@dataclass(frozen=True)
class ScatterPlan:
    """A forward's writes as flat index tensors: token ``sources[i]`` of row ``rows[i]`` goes to
    position ``slots[i]``, after the row ``copy_rows[i]``'s entry at ``copy_from[i]`` has been
    copied to ``copy_to[i]``. Shared by every layer."""

    rows: torch.Tensor
    slots: torch.Tensor
    sources: torch.Tensor
    copy_rows: torch.Tensor
    copy_from: torch.Tensor
    copy_to: torch.Tensor


class GrowableLayer(DynamicLayer):
    """One attention layer's keys and values, ``[rows, heads, capacity, head_dim]`` each.

    Keys and values may differ in heads and head size: DeepSeek-V3's multi-head latent attention
    caches its compressed latent (``kv_lora_rank`` wide) as the keys and the shared rotary key
    (``qk_rope_head_dim`` wide) as the values, one head each.
    """

    def __init__(self, cache: BatchKVCache) -> None:
        super().__init__()
        self.cache = cache
        self._key_buf: torch.Tensor | None = None
        self._value_buf: torch.Tensor | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        starts = self.cache.lengths
        width = key_states.shape[-2]
        # A forward that sets the key length writes within it (a tree row's slots may end before
        # its start plus the forward's width).
        end = self.cache.attend if self.cache.attend is not None else max(starts) + width
        if self._key_buf is None or end > self._key_buf.shape[-2]:
            self._grow(key_states, value_states, self.cache.capacity_for(end, width))
        first = starts[0]
        plan = self.cache.scatter
        if plan is not None:
            if plan.copy_rows.numel():
                self._key_buf[plan.copy_rows, :, plan.copy_to] = self._key_buf[plan.copy_rows, :, plan.copy_from]
                self._value_buf[plan.copy_rows, :, plan.copy_to] = self._value_buf[plan.copy_rows, :, plan.copy_from]
            self._key_buf[plan.rows, :, plan.slots] = key_states.transpose(1, 2)[plan.rows, plan.sources]
            self._value_buf[plan.rows, :, plan.slots] = value_states.transpose(1, 2)[plan.rows, plan.sources]
        elif all(s == first for s in starts):
            self._key_buf[..., first : first + width, :] = key_states
            self._value_buf[..., first : first + width, :] = value_states
        else:
            rows, positions = self.cache.write_index(width, key_states.device)
            # Advanced indices around a slice put their dimensions first: [rows, width, heads, dim].
            self._key_buf[rows, :, positions] = key_states.transpose(1, 2)
            self._value_buf[rows, :, positions] = value_states.transpose(1, 2)
        self.keys = self._key_buf[..., :end, :]
        self.values = self._value_buf[..., :end, :]
        return self.keys, self.values

    def _grow(self, keys_like: torch.Tensor, values_like: torch.Tensor, capacity: int) -> None:
        """Reallocate both buffers with room for ``capacity`` entries, each shaped like its own
        tensor (keys and values may differ in heads and head size)."""
        self._key_buf = self._bigger(self._key_buf, keys_like, capacity)
        self._value_buf = self._bigger(self._value_buf, values_like, capacity)

    def _bigger(self, old: torch.Tensor | None, like: torch.Tensor, capacity: int) -> torch.Tensor:
        shape = (self.cache.num_rows, like.shape[1], capacity, like.shape[-1])
        # Zeros, not empty: masked positions still enter the attention product, and
        # uninitialised memory may hold NaN, which a mask cannot cancel.
        buf = torch.zeros(shape, dtype=like.dtype, device=like.device)
        if old is not None:
            buf[..., : old.shape[-2], :] = old
        return buf

    def get_seq_length(self) -> int:
        return max(self.cache.lengths, default=0)

    def select_rows(self, rows: torch.Tensor) -> None:
        if self._key_buf is not None:
            self._key_buf = self._key_buf.index_select(0, rows)
            self._value_buf = self._value_buf.index_select(0, rows)

    def append_rows(self, others: list[GrowableLayer], num_mine: int, num_theirs: list[int]) -> None:
        """Add ``others``' rows after this layer's, all in one copy (capacity becomes the largest).

        Any side may not have run a forward yet (no buffers): its rows start empty.
        """
        layers = [self, *others]
        filled = next((layer for layer in layers if layer._key_buf is not None), None)
        if filled is None:
            return
        counts = [num_mine, *num_theirs]
        capacity = max(layer._key_buf.shape[-2] for layer in layers if layer._key_buf is not None)

        def joined(pick: str) -> torch.Tensor:
            like = getattr(filled, pick)
            shape = (sum(counts), like.shape[1], capacity, like.shape[-1])
            buf = torch.zeros(shape, dtype=like.dtype, device=like.device)
            start = 0
            for layer, count in zip(layers, counts, strict=True):
                part = getattr(layer, pick)
                if part is not None:
                    buf[start : start + count, :, : part.shape[-2]] = part
                start += count
            return buf

        self._key_buf = joined("_key_buf")
        self._value_buf = joined("_value_buf")
        self.dtype, self.device, self.is_initialized = filled._key_buf.dtype, filled._key_buf.device, True

    def replace_row(self, row: int, other: GrowableLayer, length: int) -> None:
        """Write the first ``length`` entries of ``other``'s single row over row ``row``.

        The row's old entries past ``length`` stay; they lie past its new length, where they are
        stale like a rejected draft's.
        """
        if other._key_buf is None or length == 0:
            return
        if self._key_buf is None or length > self._key_buf.shape[-2]:
            self._grow(other._key_buf, other._value_buf, self.cache.capacity_for(length, 0))
        self._key_buf[row, :, :length] = other._key_buf[0, :, :length]
        self._value_buf[row, :, :length] = other._value_buf[0, :, :length]

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("roll back through BatchKVCache.crop / rollback_rows")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("BatchKVCache rows are managed with select_rows / append_rows")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("BatchKVCache rows are managed with select_rows / append_rows")


class BatchKVCache(DynamicCache):
    """A ``DynamicCache`` of in-place layers whose rows are requests with their own lengths.

    The owner of the forward calls :meth:`advance` after it, with how many of the written
    positions each row keeps; layers write at the lengths as they were before the forward.
    """

    def __init__(self, config: PretrainedConfig, rows: int = 1) -> None:
        check_supported(config)
        super().__init__(config=config)
        self.layers = [GrowableLayer(self) for _ in self.layers]
        self.lengths = [0] * rows
        #: The positions the running forward's attention reads, when its owner sets them (the
        #: runner pads them to :func:`padded_key_length`, its mask hiding the extra ones, and
        #: every write of the forward lies within them); ``None``: up to the longest row's end.
        self.attend: int | None = None
        #: Where the running forward writes its tokens, when its owner lays them out other than one
        #: after another from each row's length (tile-aligned trees, :mod:`specdec.tree_layout`).
        self.scatter: ScatterPlan | None = None
        #: The model's context; rows never hold more, but for a verify forward's last drafts.
        self.context_length = context_length(config)

    @property
    def lengths(self) -> list[int]:
        return self._lengths

    @lengths.setter
    def lengths(self, value: list[int]) -> None:
        self._lengths = value
        self._write_index: tuple[int, tuple[torch.Tensor, torch.Tensor]] | None = None

    def write_index(self, width: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Row and position indices where this forward writes ``width`` entries per row
        (computed once per forward, shared by every layer)."""
        if self._write_index is None or self._write_index[0] != width:
            starts = torch.tensor(self._lengths, device=device)
            positions = starts[:, None] + torch.arange(width, device=device)[None, :]
            self._write_index = (width, (torch.arange(len(self._lengths), device=device)[:, None], positions))
        return self._write_index[1]

    @property
    def num_rows(self) -> int:
        return len(self.lengths)

    def capacity_for(self, end: int, width: int) -> int:
        """The capacity a layer grows to when it must hold ``end`` entries, for a forward writing
        ``width`` per row: double the longest row (rare copies as rows grow), but never past the
        model's context plus that forward's width. The engine ends requests at the context, but a
        row just short of it still verifies drafts, and a batch pads every row to its widest."""
        roomy = max(2 * max(self.lengths, default=0), _MIN_CAPACITY)
        return max(end, min(roomy, self.context_length + width))

    def advance(self, counts: list[int]) -> None:
        self.lengths = [length + n for length, n in zip(self.lengths, counts, strict=True)]

    def rollback_rows(self, counts: list[int]) -> None:
        """Drop the last ``counts[b]`` positions of row ``b``."""
        self.lengths = [max(length - n, 0) for length, n in zip(self.lengths, counts, strict=True)]

    def crop(self, max_length: int) -> None:
        """transformers' convention: a negative ``max_length`` removes that many positions from every row."""
        if max_length >= 0:
            self.lengths = [min(length, max_length) for length in self.lengths]
        else:
            self.rollback_rows([-max_length] * self.num_rows)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return max(self.lengths, default=0)

    @torch.inference_mode()
    def move_entries(self, row: int, sources: list[int], destination: int) -> None:
        """Copy row ``row``'s entries at positions ``sources`` to ``destination`` onward, in every
        layer: an accepted path through a draft tree becomes a contiguous run of the cache (in
        inference mode, as the forwards that may have made its buffers)."""
        for layer in self.layers:
            if layer._key_buf is not None:
                index = torch.tensor(sources, dtype=torch.long, device=layer._key_buf.device)
                end = destination + len(sources)
                layer._key_buf[row, :, destination:end] = layer._key_buf[row, :, index]
                layer._value_buf[row, :, destination:end] = layer._value_buf[row, :, index]

    def select_rows(self, rows: list[int]) -> None:
        """Keep only ``rows`` (in that order): finished requests leave the batch."""
        index = None
        for layer in self.layers:
            if layer._key_buf is not None:
                index = index if index is not None else torch.tensor(rows, dtype=torch.long, device=layer._key_buf.device)
                layer.select_rows(index)
        self.lengths = [self.lengths[r] for r in rows]

    def append_rows(self, *others: BatchKVCache) -> None:
        """Move ``others``' rows (e.g. requests just prefilled alone) to the end of this batch.

        Each layer is copied once however many caches join.
        """
        for index, mine in enumerate(self.layers):
            mine.append_rows([other.layers[index] for other in others], self.num_rows, [o.num_rows for o in others])
        self.lengths = self.lengths + [length for other in others for length in other.lengths]

    @torch.inference_mode()
    def replace_row(self, row: int, other: BatchKVCache) -> None:
        """Put ``other``'s single row (a request just prefilled alone) in place of row ``row``,
        whose request has left (in inference mode, as the forwards that may have made its buffers).

        Only that row is written, where leaving and joining (:meth:`select_rows`,
        :meth:`append_rows`) copy the whole cache: with continuous batching a request leaves
        every few steps, and a copy of every layer's cache each time cost about 15% of a batch
        of 48 requests' decoding time on CPU.
        """
        if other.num_rows != 1:
            raise ValueError(f"replace_row takes a cache of one row, not {other.num_rows}")
        length = other.lengths[0]
        for mine, theirs in zip(self.layers, other.layers, strict=True):
            mine.replace_row(row, theirs, length)
        self.lengths = [length if r == row else n for r, n in enumerate(self.lengths)]


    def entries(self, row: int, start: int, end: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A copy of row ``row``'s entries at positions ``start`` to ``end``, per layer: keys and
        values ``[heads, end - start, head_dim]`` each."""
        return [
            (layer._key_buf[row, :, start:end].clone(), layer._value_buf[row, :, start:end].clone())
            for layer in self.layers
        ]

    @classmethod
    def from_entries(cls, config: PretrainedConfig, entries: list[tuple[torch.Tensor, torch.Tensor]]) -> BatchKVCache:
        """A one-row cache holding ``entries`` (per layer, as :meth:`entries` gives them) from
        position 0, ready for forwards that continue it."""
        cache = cls(config, 1)
        length = entries[0][0].shape[-2]
        capacity = cache.capacity_for(length, 0)
        for layer, (keys, values) in zip(cache.layers, entries, strict=True):
            layer._grow(keys[None], values[None], capacity)
            layer._key_buf[0, :, :length] = keys
            layer._value_buf[0, :, :length] = values
            layer.lazy_initialization(keys[None], values[None])
            layer.keys, layer.values = layer._key_buf[..., :length, :], layer._value_buf[..., :length, :]
        cache.lengths = [length]
        return cache


def new_kv_cache(config: PretrainedConfig, rows: int = 1) -> BatchKVCache:
    """An empty cache for ``rows`` requests."""
    return BatchKVCache(config, rows)


class RequestKV:
    """One attention layer's keys and values for one request, held by a drafter outside the
    target's batch cache (an EAGLE-3 head layer, an MTP block). Grows in place, doubling; rolls
    back by cropping its length. Keys and values may differ in heads and head size."""

    def __init__(self) -> None:
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None
        self.length = 0

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``[..., n, dim]`` keys and values after the cached ones; return everything cached."""
        end = self.length + keys.shape[-2]
        if self._keys is None or end > self._keys.shape[-2]:
            capacity = max(end, 2 * self.length, 64)
            self._keys = self._grown(self._keys, keys, capacity)
            self._values = self._grown(self._values, values, capacity)
        self._keys[..., self.length : end, :] = keys
        self._values[..., self.length : end, :] = values
        self.length = end
        return self._keys[..., :end, :], self._values[..., :end, :]

    def crop(self, length: int) -> None:
        """Keep the first ``length`` positions."""
        self.length = min(self.length, max(length, 0))

    def cached(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The cached keys and values, ``[..., length, dim]`` views (``None`` before the first append)."""
        if self._keys is None:
            return None
        return self._keys[..., : self.length, :], self._values[..., : self.length, :]

    def _grown(self, old: torch.Tensor | None, like: torch.Tensor, capacity: int) -> torch.Tensor:
        buf = like.new_empty((*like.shape[:-2], capacity, like.shape[-1]))
        if old is not None:
            buf[..., : self.length, :] = old[..., : self.length, :]
        return buf


class RaggedDraftBatch:
    """Several requests' drafter caches side by side, so a drafter runs one forward for the batch
    rather than one per request (a draft head's step is a few small matmuls, whose cost barely
    grows with the rows they multiply).

    ``rows[b]`` is request ``b``'s :class:`RequestKV` of every layer, each holding
    ``[1, heads, length, dim]``. Each layer's cached keys and values are copied into a padded
    buffer when the layer first appends: row ``b`` holds its own ``lengths[b]`` positions, then
    padding up to the longest, then room for ``room`` new positions written for every row at once.
    :meth:`extend` says which new positions are real per row and returns the mask a forward over
    them attends with. Nothing reaches a request's own cache unless the drafter appends
    :meth:`appended` to it, so positions drafted here need no rollback.
    """

    def __init__(self, rows: list[list[RequestKV]], room: int, device: torch.device) -> None:
        self.lengths = [layers[0].length for layers in rows]
        self.device = device
        self.end = max(self.lengths)
        self.capacity = self.end + room
        #: ``[rows, end]``, on the CPU (masks are built there, without waiting for the device):
        #: the positions each row may attend to.
        self.valid = torch.arange(self.end)[None, :] < torch.tensor(self.lengths)[:, None]
        self._layers = [_RaggedLayer(self, [layers[i] for layers in rows]) for i in range(len(rows[0]))]
        self._start = self.end

    def layer(self, index: int) -> _RaggedLayer:
        return self._layers[index]

    def extend(self, real: torch.Tensor) -> torch.Tensor | None:
        """Take ``real.shape[1]`` new positions per row, ``real[b, i]`` (a CPU tensor) telling
        whether row ``b``'s ``i``-th is a real one (later positions never attend to padding).

        Returns the boolean mask ``[rows, 1, new, end]``, on the device, for a forward over the new
        positions: each attends to its row's real positions before it and to itself; ``None`` when
        that is everything (one new position per row, no padding anywhere).
        """
        width = real.shape[1]
        if self.end + width > self.capacity:
            raise ValueError(f"{self.end + width} positions exceed the {self.capacity} this batch has room for")
        mask = None
        if width > 1 or not bool(self.valid.all()):
            own = torch.ones(width, width, dtype=torch.bool).tril()[None] & real[:, None, :] | torch.eye(width, dtype=torch.bool)
            mask = torch.cat((self.valid[:, None, :].expand(-1, width, -1), own), dim=-1)[:, None].to(self.device)
        self.valid = torch.cat((self.valid, real), dim=1)
        self._start, self.end = self.end, self.end + width
        return mask

    def appended(self, row: int, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, the keys and values of row ``row``'s first ``count`` positions of the last
        :meth:`extend`, shaped for :meth:`RequestKV.append`."""
        return [layer.rows(row, self._start, self._start + count) for layer in self._layers]


class _RaggedLayer:
    """One layer of a :class:`RaggedDraftBatch`: its padded keys and values, written in place."""

    def __init__(self, batch: RaggedDraftBatch, sources: list[RequestKV]) -> None:
        self._batch = batch
        self._sources = sources
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``[rows, heads, n, dim]`` keys and values at the batch's newest positions (those
        of the last :meth:`RaggedDraftBatch.extend`); return every position so far."""
        end = self._batch.end
        if self._keys is None:
            self._keys, self._values = self._buffer(keys), self._buffer(values)
            for row, source in enumerate(self._sources):
                if (cached := source.cached()) is not None:
                    self._keys[row, ..., : source.length, :] = cached[0][0]
                    self._values[row, ..., : source.length, :] = cached[1][0]
        self._keys[..., end - keys.shape[-2] : end, :] = keys
        self._values[..., end - values.shape[-2] : end, :] = values
        return self._keys[..., :end, :], self._values[..., :end, :]

    def rows(self, row: int, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._keys[row : row + 1, ..., start:end, :], self._values[row : row + 1, ..., start:end, :]

    def _buffer(self, like: torch.Tensor) -> torch.Tensor:
        return like.new_zeros((*like.shape[:-2], self._batch.capacity, like.shape[-1]))
