"""Grouped-query attention that reads each key/value head once.

A verify forward appends several tokens per request and passes an attention mask (per-row cache
lengths, draft trees). For such a forward, transformers' ``sdpa`` attention copies every cached key
and value once per query head that shares it (``repeat_kv``) before calling
``scaled_dot_product_attention``: with SmolLM2's 9 query heads over 3 key/value heads, a copy of
three times the whole KV cache in every layer of every step. On CPU at 1,000 tokens of context and
batch 8, that made a 2-token verify cost 1.7 one-token forwards in bfloat16 and 4.7 in float32.

One query token without a mask (plain decoding, batch 1) fares no better: transformers passes
``enable_gqa=True``, and PyTorch's CPU attention then repeats the keys and values per head itself.
At 800 tokens of context that took 458 us per layer in bfloat16 against 89 us with the heads
folded, about 11 ms of a 47 ms SmolLM2 forward.

:func:`packed_gqa_attention` folds the queries of a group's ``g`` heads into ``g * q`` rows
attending to their one key/value head, the mask repeated to match (once per forward), for any
number of query tokens. Each row's attention is the same computation as before, so the outputs agree to
floating-point summation order. Anything else (several query tokens without a mask, which
transformers runs as causal attention; no grouping; position bias; dropout) goes to
transformers' own ``sdpa`` function unchanged.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

#: The name :func:`use_packed_attention` registers with transformers' ``AttentionInterface``.
PACKED_SDPA = "specdec_sdpa"


def packed_gqa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: ``query`` ``[batch, heads, q, dim]``, ``key``
    ``[batch, kv_heads, kv, dim]`` and ``value`` ``[batch, kv_heads, kv, value_dim]``; returns the
    output as ``[batch, q, heads, value_dim]``.

    The grouping is read from the shapes, not from the module's ``num_key_value_groups``:
    DeepSeek-V3's attention expands its cached latent to one key/value head per query head
    whatever its config's ``num_key_value_heads`` says.
    """
    groups = query.shape[1] // key.shape[1]
    length = query.shape[2]
    plain = (
        groups == 1
        or (attention_mask is None and length > 1)
        or kwargs.get("position_bias") is not None
        or kwargs.get("dropout", 0.0)
        or kwargs.get("softcap") is not None
    )
    if plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    padding = _row_padding(query, groups * length)
    folded = None
    if attention_mask is not None:
        folded = _folded_masks.get(attention_mask, length, key.shape[1], groups, padding)
    out = _attend_folded(query, key, value, folded, kwargs.get("scaling"), padding)
    return out.transpose(1, 2).contiguous(), None


#: The fewest folded query rows any block of PyTorch's CPU flash attention is given. It multiplies
#: a block of 1 to 3 rows by another path than a block of 4 or more: on a 2-core AMD EPYC with
#: AVX512-BF16 (oneDNN without AMX), SmolLM2's plain decoding (3 rows: one token, 3 query heads per
#: key/value head) and a 2-token verify (6 rows) gave the same token other bits in 8 of 30 forwards.
MIN_BLOCK_ROWS = 4


def block_padding(rows: int) -> int:
    """The rows to add to ``rows`` folded query rows so that no block of PyTorch's CPU flash
    attention (32 rows; 64 from 192 rows, 256 from 768) holds fewer than :data:`MIN_BLOCK_ROWS`."""
    padded = rows
    while True:
        split = 256 if padded >= 768 else 64 if padded >= 192 else 32
        if not 0 < padded % split < MIN_BLOCK_ROWS:
            return padded - rows
        padded += 1


def grouped_query_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """``scaled_dot_product_attention`` for grouped queries, reading each key/value head once.

    :param query: ``[batch, heads, q, dim]``; ``heads`` is a multiple of ``kv_heads``.
    :param key: ``[batch, kv_heads, kv, dim]``; ``value`` is ``[batch, kv_heads, kv, value_dim]``.
    :param mask: ``None`` (every query sees every key), or a boolean (True = attend) or additive
        mask broadcastable to ``[batch, heads, q, kv]``.
    :return: ``[batch, heads, q, value_dim]``, as ``scaled_dot_product_attention`` over keys and values
        repeated per head gives, to floating-point summation order.
    """
    kv_heads = key.shape[1]
    groups = query.shape[1] // kv_heads
    padding = _row_padding(query, groups * query.shape[2])
    folded = None if mask is None else _fold_mask(mask, query.shape[2], kv_heads, groups, padding)
    return _attend_folded(query, key, value, folded, scale, padding)


def _row_padding(query: torch.Tensor, rows: int) -> int:
    """The padding rows a CPU forward's folded queries get (:func:`block_padding`); none elsewhere."""
    return block_padding(rows) if query.device.type == "cpu" else 0


def _attend_folded(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, folded: torch.Tensor | None, scale: float | None, padding: int
) -> torch.Tensor:
    """Attention with a group's query heads folded into rows and ``padding`` zero rows after them,
    dropped again (a token's bits never depend on the width); ``folded`` is :func:`_fold_mask`'s."""
    batch, heads, length, dim = query.shape
    kv_heads = key.shape[1]
    rows = heads // kv_heads * length
    query = torch.nn.functional.pad(query.reshape(batch, kv_heads, rows, dim), (0, 0, 0, padding))
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=folded, scale=scale)
    return out[:, :, :rows].reshape(batch, heads, length, value.shape[-1])


def _fold_mask(mask: torch.Tensor, length: int, kv_heads: int, groups: int, padding: int) -> torch.Tensor:
    """A mask over ``[batch, heads, q, kv]`` as rows of the folded queries and ``padding`` rows
    that see every key after them: ``[batch, kv_heads or 1, groups * q + padding, kv]``."""
    mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape)).expand(-1, -1, length, -1)
    if mask.shape[1] == 1:
        folded = mask.repeat(1, 1, groups, 1)
    else:
        folded = mask.expand(-1, kv_heads * groups, -1, -1).reshape(mask.shape[0], kv_heads, groups * length, mask.shape[-1])
    if not padding:
        return folded
    return torch.cat([folded, folded.new_zeros(*folded.shape[:2], padding, folded.shape[-1])], 2)


class _FoldedMaskCache:
    """The masks folded last by :func:`packed_gqa_attention`, so that a model's layers, which all
    get the same mask object in one forward, fold it once (at 400 tokens of context, repeating a
    6-token verify's mask in each of SmolLM2's 30 layers took 1.5 ms of a 37 ms forward). A model
    mixing full and sliding-window layers gets one mask per layer type and alternates between
    them, so an entry is kept per mask of the forward, up to ``size``.

    transformers builds a new mask for every forward. An entry holds its mask weakly and serves
    only that very object; a mask made outside inference mode must also be unchanged since (its
    version counter). The entries are one tuple, replaced whole, so concurrent forwards each see
    complete entries.
    """

    def __init__(self, size: int = 2) -> None:
        self._size = size
        self._entries: tuple[tuple, ...] = ()

    def get(self, mask: torch.Tensor, length: int, kv_heads: int, groups: int, padding: int) -> torch.Tensor:
        if torch.compiler.is_compiling():  # no Python state in a compiled graph, which dedups the folds itself
            return _fold_mask(mask, length, kv_heads, groups, padding)
        version = None if mask.is_inference() else mask._version
        key = (version, length, kv_heads, groups, padding)
        entries = self._entries
        for entry in entries:
            if entry[0]() is mask and entry[1] == key:
                return entry[2]
        folded = _fold_mask(mask, length, kv_heads, groups, padding)
        self._entries = ((weakref.ref(mask), key, folded), *entries[: self._size - 1])
        return folded


_folded_masks = _FoldedMaskCache()


def use_packed_attention(model: PreTrainedModel) -> None:
    """Switch ``model`` from transformers' ``sdpa`` attention to :func:`packed_gqa_attention`.

    A model on another implementation (eager, flash attention, a kernel), or whose class calls its
    attention directly rather than through ``AttentionInterface``, keeps it. The masks stay
    ``sdpa``'s: transformers builds no mask at all for an implementation it has no mask function
    for, and a multi-token forward over a cache needs one.
    """
    if getattr(model.config, "_attn_implementation", None) != "sdpa" or not getattr(model, "_supports_attention_backend", False):
        return
    AttentionInterface.register(PACKED_SDPA, packed_gqa_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(PACKED_SDPA, sdpa_mask)
    model.set_attn_implementation(PACKED_SDPA)
