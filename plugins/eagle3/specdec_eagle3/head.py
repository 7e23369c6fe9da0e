"""The EAGLE-3 draft head: one Llama decoder layer over ``[token embedding ; fused target features]``.

The computation follows SafeAILab's reference (``eagle/model/cnets.py``, ``LlamaDecoderLayeremb``)
and vLLM speculators' ``LlamaDecoderEagle3FirstLayer``. For the pair (features of position ``t``,
token ``t + 1``)::

    g = fc(cat(h[l_1], h[l_2], h[l_3]))          target states at t, ascending layer order
    x = cat(input_layernorm(embed(token)), hidden_norm(g))                  [2 * hidden]
    h = g + o_proj(attention(q_proj(x), k_proj(x), v_proj(x)))      residual: g itself
    h = h + mlp(post_attention_layernorm(h))
    logits = lm_head(norm(h))                          over the draft vocabulary: predicts t + 2

A head may stack further decoder layers after that first one (vLLM's multi-layer EAGLE-3 heads,
``num_hidden_layers`` > 1 in the speculators layout): each is a plain pre-norm Llama layer over
``h`` alone, ``h = h + o_proj(attention(input_layernorm(h)))``, then the MLP as above; ``norm``
and ``lm_head`` read the last one's ``h``, and ``h`` is what the next draft step feeds back.

A chained draft step feeds the head's own output ``h`` back in place of ``g`` (no ``fc``). Draft id
``d`` is target id ``d + d2t[d]``. speculators' ``norm_before_residual`` makes the residual
``hidden_norm(g)``; its ``norm_before_fc`` (gpt-oss heads) applies ``input_norm`` before ``fc``.

The head keeps no embedding of its own unless the checkpoint ships one: callers pass embeddings
(normally the target's input embedding, as EAGLE-3 checkpoints expect).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

from specdec import RequestKV, grouped_query_attention


@dataclass
class Eagle3HeadConfig:
    """Shape and options of one EAGLE-3 head.

    ``llama`` describes the decoder layer (``hidden_size``, heads, ``intermediate_size``,
    ``rms_norm_eps``, RoPE) and the target vocabulary (``vocab_size``).
    ``layers_to_capture`` is what the checkpoint records (``None`` if it does not).
    ``num_layers`` counts decoder layers: the first reads ``[embedding ; features]``, the rest
    only the previous layer's output.
    """

    llama: LlamaConfig
    draft_vocab_size: int
    target_hidden_size: int
    num_fused_layers: int = 3
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    fc_bias: bool = False
    layers_to_capture: tuple[int, ...] | None = None
    num_layers: int = 1

    @property
    def hidden_size(self) -> int:
        return int(self.llama.hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.llama.vocab_size)

    @property
    def head_dim(self) -> int:
        return int(getattr(self.llama, "head_dim", None) or self.hidden_size // self.llama.num_attention_heads)


class HeadCache:
    """The head's KV cache for one request: a ``layer_cache`` per decoder layer (training passes
    one that concatenates out of place, so autograd keeps every unrolled step's keys)."""

    def __init__(self, layer_cache: type = RequestKV) -> None:
        self._make = layer_cache
        self._layers: list[Any] = []

    def layer(self, index: int) -> Any:
        while len(self._layers) <= index:
            self._layers.append(self._make())
        return self._layers[index]

    @property
    def length(self) -> int:
        """Positions cached (every layer holds the same after a head forward)."""
        return self._layers[0].length if self._layers else 0

    def crop(self, length: int) -> None:
        """Keep the first ``length`` positions."""
        for layer in self._layers:
            layer.length = min(layer.length, max(length, 0))


def _layer_cache(cache: HeadCache | None, index: int) -> RequestKV | None:
    return cache.layer(index) if cache is not None else None


def causal_mask(num_new: int, num_cached: int, device: torch.device) -> torch.Tensor | None:
    """Boolean ``[num_new, num_cached + num_new]`` mask (True = attend); ``None`` for one new token."""
    if num_new == 1:
        return None
    cols = torch.arange(num_cached + num_new, device=device)
    rows = torch.arange(num_new, device=device) + num_cached
    return cols[None, :] <= rows[:, None]


class Eagle3Attention(nn.Module):
    """Llama attention whose q/k/v read ``width`` inputs (``2 * hidden`` in the first layer)."""

    def __init__(self, config: Eagle3HeadConfig, width: int) -> None:
        super().__init__()
        c = config.llama
        self.num_heads = int(c.num_attention_heads)
        self.num_kv_heads = int(c.num_key_value_heads or c.num_attention_heads)
        self.head_dim = config.head_dim
        bias = bool(getattr(c, "attention_bias", False))
        self.q_proj = nn.Linear(width, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(width, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(width, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=bias)

    def forward(
        self,
        x: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        cache: RequestKV | None,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        batch, length, _ = x.shape
        q = self.q_proj(x).view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, *position_embeddings)
        if cache is not None:
            k, v = cache.append(k, v)
        out = grouped_query_attention(q, k, v, mask)
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, -1))


class Eagle3DecoderLayer(nn.Module):
    """The head's single decoder layer (SafeAILab's ``midlayer``, speculators' ``layers.0``)."""

    def __init__(self, config: Eagle3HeadConfig) -> None:
        super().__init__()
        eps = float(config.llama.rms_norm_eps)
        self.norm_before_residual = config.norm_before_residual
        self.self_attn = Eagle3Attention(config, 2 * config.hidden_size)
        self.mlp = LlamaMLP(config.llama)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=eps)
        self.hidden_norm = LlamaRMSNorm(config.hidden_size, eps=eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=eps)

    def forward(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        cache: RequestKV | None,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        residual = hidden
        hidden = self.hidden_norm(hidden)
        if self.norm_before_residual:
            residual = hidden
        x = torch.cat((self.input_layernorm(embeds), hidden), dim=-1)
        h = residual + self.self_attn(x, position_embeddings, cache, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3LaterLayer(nn.Module):
    """A decoder layer after the first (speculators' ``layers.1`` on): a plain pre-norm Llama layer."""

    def __init__(self, config: Eagle3HeadConfig) -> None:
        super().__init__()
        eps = float(config.llama.rms_norm_eps)
        self.self_attn = Eagle3Attention(config, config.hidden_size)
        self.mlp = LlamaMLP(config.llama)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=eps)

    def forward(
        self,
        hidden: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        cache: RequestKV | None,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        h = hidden + self.self_attn(self.input_layernorm(hidden), position_embeddings, cache, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Head(nn.Module):
    """An EAGLE-3 draft head. Parameter names follow SafeAILab's layout (``midlayer.*``); layers
    after the first are ``later_layers.{i}.*`` (speculators' ``layers.{i + 1}.*``)."""

    def __init__(self, config: Eagle3HeadConfig, with_embedding: bool = False) -> None:
        super().__init__()
        self.config = config
        hidden, fused = config.hidden_size, config.num_fused_layers * config.target_hidden_size
        eps = float(config.llama.rms_norm_eps)
        self.embed_tokens = nn.Embedding(config.vocab_size, hidden) if with_embedding else None
        self.input_norm = LlamaRMSNorm(fused, eps=eps) if config.norm_before_fc else None
        self.fc = nn.Linear(fused, hidden, bias=config.fc_bias)
        self.midlayer = Eagle3DecoderLayer(config)
        self.later_layers = nn.ModuleList(Eagle3LaterLayer(config) for _ in range(config.num_layers - 1))
        self.norm = LlamaRMSNorm(hidden, eps=eps)
        self.lm_head = nn.Linear(hidden, config.draft_vocab_size, bias=False)
        self.rotary_emb = LlamaRotaryEmbedding(config.llama)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """Target features ``[..., num_fused_layers * target_hidden]`` -> ``[..., hidden]``."""
        if self.input_norm is not None:
            features = self.input_norm(features)
        return self.fc(features)

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        hidden: torch.Tensor,
        position_ids: torch.Tensor,
        cache: HeadCache | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One decoder-layer pass over ``[B, T]`` (embedding, feature) pairs; returns ``[B, T, hidden]``.

        ``hidden`` is ``fuse(target features)`` or the head's own previous output.
        ``attention_mask`` (boolean, True = attend, broadcastable to ``[B, heads, T, cached + T]``)
        defaults to causal over ``cache`` (a :class:`HeadCache`); a draft tree and a
        :class:`~specdec.kv_cache.RaggedDraftBatch` pass their own.
        """
        if attention_mask is None and hidden.shape[1] > 1:
            cached = cache.length if cache is not None else 0
            attention_mask = causal_mask(hidden.shape[1], cached, hidden.device)
        position_embeddings = self.rotary_emb(hidden, position_ids)
        hidden = self.midlayer(inputs_embeds, hidden, position_embeddings, _layer_cache(cache, 0), attention_mask)
        for index, layer in enumerate(self.later_layers, start=1):
            hidden = layer(hidden, position_embeddings, _layer_cache(cache, index), attention_mask)
        return hidden

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits for the head's output states."""
        return self.lm_head(self.norm(hidden))

    def draft_to_target(self) -> torch.Tensor:
        """Target id of each draft id: ``arange(draft_vocab) + d2t``."""
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

    def place(self, device: torch.device, dtype: torch.dtype) -> Eagle3Head:
        """Move to ``device`` and cast the weights to ``dtype``; RoPE frequencies stay float32."""
        self.to(device)
        for param in self.parameters():
            param.data = param.data.to(dtype)
        return self
