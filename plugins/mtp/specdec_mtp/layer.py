"""One DeepSeek-V3 multi-token prediction (MTP) module and the KV cache of its attention.

For position ``i``, MTP module ``k`` reads module ``k - 1``'s state there (the target's final
hidden state for ``k = 1``) and the embedding of token ``i + k``, and predicts token ``i + k + 1``
(DeepSeek-V3 technical report, section 2.2; vLLM's ``deepseek_mtp.py``)::

    x = eh_proj(cat(enorm(embed(token)), hnorm(previous)))            [2 * hidden] -> hidden
    h = decoder_block(x)                          transformers' DeepseekV3DecoderLayer
    logits = shared_head.head(shared_head.norm(h))

``h`` is what module ``k + 1`` reads. As vLLM does, the embedding at sequence position 0 is zeroed.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import DeepseekV3Config
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer, DeepseekV3RMSNorm

from specdec.kv_cache import RequestKV


class LatentCache(RequestKV):
    """One request's keys/values for one MTP block, taking transformers' ``Cache.update`` call.

    Keys and values differ in size (multi-head latent attention caches a compressed latent and
    the rotary key); the core's :class:`~specdec.kv_cache.RequestKV` holds them either way.
    """

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        return self.append(keys, values)


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

    def __init__(self, config: DeepseekV3Config, index: int, with_embedding: bool = False) -> None:
        super().__init__()
        hidden, eps = int(config.hidden_size), float(config.rms_norm_eps)
        self.enorm = DeepseekV3RMSNorm(hidden, eps=eps)
        self.hnorm = DeepseekV3RMSNorm(hidden, eps=eps)
        self.eh_proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.block = DeepseekV3DecoderLayer(config, index)
        # Every draft depth gives the block a cache of its own, which it addresses as layer 0.
        self.block.self_attn.layer_idx = 0
        self.shared_head = nn.Module()
        self.shared_head.norm = DeepseekV3RMSNorm(hidden, eps=eps)
        self.shared_head.head = nn.Linear(hidden, int(config.vocab_size), bias=False)
        self.embed_tokens = nn.Embedding(int(config.vocab_size), hidden) if with_embedding else None

    def forward(
        self,
        embeds: torch.Tensor,
        previous: torch.Tensor,
        position_ids: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        cache: LatentCache,
    ) -> torch.Tensor:
        """Token embeddings ``[1, T, hidden]`` at ``position_ids`` ``[1, T]`` with ``previous``
        ``[1, T, hidden]``; returns ``h``. ``cache`` gains the ``T`` positions."""
        embeds = embeds.masked_fill((position_ids == 0)[..., None], 0.0)
        x = self.eh_proj(torch.cat((self.enorm(embeds), self.hnorm(previous)), dim=-1))
        mask = additive_causal_mask(x.shape[1], cache.length, x.dtype, x.device)
        return self.block(x, attention_mask=mask, position_ids=position_ids, cache=cache, position_embeddings=position_embeddings)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.shared_head.head(self.shared_head.norm(hidden))
