"""One multi-token prediction (MTP) module and the KV cache of its attention, for any target whose
decoder layers follow transformers' Llama interface (DeepSeek-V3, Llama, Qwen, Mistral, ...).

For position ``i``, MTP module ``k`` reads module ``k - 1``'s state there (the target's final
hidden state for ``k = 1``) and the embedding of token ``i + k``, and predicts token ``i + k + 1``
(DeepSeek-V3 technical report, section 2.2; vLLM's ``deepseek_mtp.py``)::

    x = eh_proj(cat(enorm(embed(token)), hnorm(previous)))            [2 * hidden] -> hidden
    h = decoder_block(x)                  the target's own decoder-layer class, built from its config
    logits = shared_head.head(shared_head.norm(h))

``h`` is what module ``k + 1`` reads. As vLLM does, the embedding at sequence position 0 is zeroed.
The block of a DeepSeek-V3 target is a ``DeepseekV3DecoderLayer`` (multi-head latent attention,
experts), of a Llama target a ``LlamaDecoderLayer``; the norms are the target's RMSNorm class.
"""

from __future__ import annotations

import copy
import sys
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM, PretrainedConfig

from specdec import ModelLoadError, RequestKV, cache_keyword


class LatentCache(RequestKV):
    """One request's keys/values for one MTP block, taking transformers' ``Cache.update`` call.

    Keys and values may differ in size (DeepSeek's multi-head latent attention caches a compressed
    latent and the rotary key) or have fewer heads than the queries (grouped-query attention); the
    core's :class:`~specdec.kv_cache.RequestKV` holds them either way.
    """

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        return self.append(keys, values)


class BlockCache:
    """Several requests' caches of one MTP block side by side, taking transformers'
    ``Cache.update`` call, so a depth drafts for the batch in one forward: one layer of a
    :class:`~specdec.RaggedDraftBatch` (whose :meth:`~specdec.RaggedDraftBatch.extend` gives the
    mask that forward attends with) or of a :class:`~specdec.StaticDraftCache` (fixed shapes)."""

    def __init__(self, layer: Any) -> None:
        self.layer = layer

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        return self.layer.append(keys, values)


class RMSNorm(nn.Module):
    """Root-mean-square norm for a target whose modeling module names no ``<Model>RMSNorm``."""

    def __init__(self, hidden: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)


#: Architectures whose rotary embedding is called with a layer's kind (Gemma 3's local and global
#: RoPE), which MTP blocks do not support yet.
ROTARY_PER_LAYER_KIND = ("gemma3", "gemma3_text")


def block_classes(config: PretrainedConfig) -> tuple[type[nn.Module], type[nn.Module]]:
    """The target's decoder-layer and RMSNorm classes: ``<Model>DecoderLayer`` and ``<Model>RMSNorm``
    (else :class:`RMSNorm`) of the modeling module of its ``<Model>ForCausalLM``."""
    model_type = getattr(config, "model_type", None)
    if model_type in ROTARY_PER_LAYER_KIND:
        raise ModelLoadError(f"MTP: model_type {model_type!r} is not supported yet (its rotary embedding takes each "
                             "layer's kind, which an MTP block does not pass)")
    try:
        causal = AutoModelForCausalLM._model_mapping[type(config)]
    except KeyError:
        causal = None
    prefix = causal.__name__.removesuffix("ForCausalLM") if causal is not None else ""
    module = sys.modules[causal.__module__] if causal is not None else None
    layer = getattr(module, f"{prefix}DecoderLayer", None)
    if layer is None:
        raise ModelLoadError(f"MTP: no decoder-layer class for model_type {getattr(config, 'model_type', None)!r} "
                             "(MTP blocks need a transformers <Model>DecoderLayer, as Llama and DeepSeek-V3 have)")
    return layer, getattr(module, f"{prefix}RMSNorm", RMSNorm)


def _with_layer(config: PretrainedConfig, index: int) -> PretrainedConfig:
    """``config``, or a copy whose ``layer_types`` reaches layer ``index`` as full attention (the
    block attends to every cached position: see :func:`additive_causal_mask`), for architectures
    whose decoder layers look their kind up there (Qwen2, Qwen3, Gemma)."""
    types = getattr(config, "layer_types", None)
    if types is None or index < len(types):
        return config
    config = copy.copy(config)
    config.layer_types = [*types, *["full_attention"] * (index + 1 - len(types))]
    return config


def additive_causal_mask(num_new: int, num_cached: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
    """``[1, 1, num_new, num_cached + num_new]`` additive mask; ``None`` for one new token."""
    if num_new == 1:
        return None
    cols = torch.arange(num_cached + num_new, device=device)
    rows = torch.arange(num_new, device=device) + num_cached
    mask = torch.zeros(num_new, num_cached + num_new, dtype=dtype, device=device)
    return mask.masked_fill(cols[None, :] > rows[:, None], torch.finfo(dtype).min)[None, None]


class MTPLayer(nn.Module):
    """An MTP module; parameter names follow the checkpoint's ``model.layers.{index}.*`` minus the prefix
    (the decoder block's own tensors sit at the top level there, under ``block.`` here)."""

    def __init__(self, config: PretrainedConfig, index: int, with_embedding: bool = False, with_head: bool = True) -> None:
        super().__init__()
        block_class, norm_class = block_classes(config)
        hidden, eps = int(config.hidden_size), float(config.rms_norm_eps)
        self.enorm = norm_class(hidden, eps=eps)
        self.hnorm = norm_class(hidden, eps=eps)
        self.eh_proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.block = block_class(_with_layer(config, index), index)
        # Every draft depth gives the block a cache of its own, which it addresses as layer 0.
        self.block.self_attn.layer_idx = 0
        self._cache_keyword = cache_keyword(self.block)
        self.shared_head = nn.Module()
        self.shared_head.norm = norm_class(hidden, eps=eps)
        # Without a head of its own (a checkpoint that leaves ``shared_head.head`` out), the layer
        # projects through the target's ``lm_head``, which the drafter gives it.
        self.shared_head.head = nn.Linear(hidden, int(config.vocab_size), bias=False) if with_head else None
        self.embed_tokens = nn.Embedding(int(config.vocab_size), hidden) if with_embedding else None

    def forward(
        self,
        embeds: torch.Tensor,
        previous: torch.Tensor,
        position_ids: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        cache: LatentCache | BlockCache | None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Token embeddings ``[B, T, hidden]`` at ``position_ids`` ``[B, T]`` with ``previous``
        ``[B, T, hidden]``; returns ``h``. ``cache`` gains the ``T`` positions (``None``: a whole
        sequence from position 0, as training runs it). Each position attends to every cached one
        and causally to the new ones, unless ``attention_mask`` (additive, ``[B, 1, T, cached + T]``:
        a ragged batch's) says otherwise."""
        embeds = embeds.masked_fill((position_ids == 0)[..., None], 0.0)
        x = self.eh_proj(torch.cat((self.enorm(embeds), self.hnorm(previous)), dim=-1))
        if attention_mask is None and x.shape[1] > 1:
            attention_mask = additive_causal_mask(x.shape[1], cache.length if cache is not None else 0, x.dtype, x.device)
        return self.block(x, attention_mask=attention_mask, position_ids=position_ids,
                          position_embeddings=position_embeddings, **{self._cache_keyword: cache})

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.shared_head.head(self.shared_head.norm(hidden))
