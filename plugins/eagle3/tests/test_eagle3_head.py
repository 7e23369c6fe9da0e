"""The head computes EAGLE-3's layer as published, and its KV cache gives the same states as a full pass."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from eagle3_tiny import head_config
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding, rotate_half

from specdec.testing import make_tiny_target
from specdec_eagle3 import Eagle3Head, HeadCache


def _random_head(num_layers: int) -> Eagle3Head:
    target = make_tiny_target(seed=1)
    torch.manual_seed(3)
    head = Eagle3Head(head_config(target.model, None, draft_vocab_size=20, num_layers=num_layers)).eval()
    with torch.no_grad():  # non-trivial norms, so swapping a norm or the concat order would show
        for name, param in head.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
    return head


@pytest.fixture(scope="module")
def head() -> Eagle3Head:
    return _random_head(1)


@pytest.fixture(scope="module")
def deep_head() -> Eagle3Head:
    """Three decoder layers, as vLLM's multi-layer EAGLE-3 heads."""
    return _random_head(3)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def reference_forward(
    head: Eagle3Head, embeds: torch.Tensor, fused: torch.Tensor, norm_before_residual: bool = False
) -> torch.Tensor:
    """SafeAILab's ``LlamaDecoderLayeremb`` written out: residual g, q/k/v over cat(norm(emb), norm(g)).

    With speculators' ``norm_before_residual`` the residual is hidden_norm(g) instead.
    """
    layer, eps = head.midlayer, head.config.llama.rms_norm_eps
    attn = layer.self_attn
    length = embeds.shape[0]
    normed_fused = _rms(fused, layer.hidden_norm.weight, eps)
    x = torch.cat((_rms(embeds, layer.input_layernorm.weight, eps), normed_fused), -1)
    q = (x @ attn.q_proj.weight.T).view(length, attn.num_heads, attn.head_dim).transpose(0, 1)
    k = (x @ attn.k_proj.weight.T).view(length, attn.num_kv_heads, attn.head_dim).transpose(0, 1)
    v = (x @ attn.v_proj.weight.T).view(length, attn.num_kv_heads, attn.head_dim).transpose(0, 1)
    theta = head.config.llama.rope_parameters["rope_theta"]
    inv_freq = 1.0 / theta ** (torch.arange(0, attn.head_dim, 2).float() / attn.head_dim)
    angles = torch.arange(length).float()[:, None] * inv_freq[None]
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    groups = attn.num_heads // attn.num_kv_heads
    k, v = k.repeat_interleave(groups, 0), v.repeat_interleave(groups, 0)
    scores = q @ k.transpose(1, 2) / math.sqrt(attn.head_dim)
    scores = scores.masked_fill(torch.ones(length, length).triu(1).bool(), float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(0, 1).reshape(length, -1) @ attn.o_proj.weight.T
    h = (normed_fused if norm_before_residual else fused) + out
    mlp = layer.mlp
    normed = _rms(h, layer.post_attention_layernorm.weight, eps)
    return h + (torch.nn.functional.silu(normed @ mlp.gate_proj.weight.T) * (normed @ mlp.up_proj.weight.T)) @ mlp.down_proj.weight.T


def _inputs(head: Eagle3Head, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(5)
    embeds = torch.randn(1, length, head.config.hidden_size, generator=generator)
    features = torch.randn(1, length, 3 * head.config.target_hidden_size, generator=generator)
    return embeds, features


@torch.no_grad()
def test_forward_matches_the_published_formulation(head: Eagle3Head) -> None:
    """Same numbers as SafeAILab's layer written out by hand (embedding first, fused state as residual)."""
    embeds, features = _inputs(head, 7)
    fused = head.fuse(features)
    got = head(embeds, fused, torch.arange(7)[None])[0]
    assert torch.allclose(got, reference_forward(head, embeds[0], fused[0]), atol=1e-5)


@torch.no_grad()
def test_later_layers_are_llama_decoder_layers(deep_head: Eagle3Head) -> None:
    """Layers after the first compute what transformers' own LlamaDecoderLayer computes with their
    weights, in order, over the first layer's output (vLLM's multi-layer EAGLE-3 formulation)."""
    embeds, features = _inputs(deep_head, 7)
    fused = deep_head.fuse(features)
    expected = reference_forward(deep_head, embeds[0], fused[0])[None]
    config = copy.deepcopy(deep_head.config.llama)
    config._attn_implementation = "eager"
    position_ids = torch.arange(7)[None]
    position_embeddings = LlamaRotaryEmbedding(config)(expected, position_ids)
    causal = torch.full((7, 7), float("-inf")).triu(1)[None, None]
    for later in deep_head.later_layers:
        reference = LlamaDecoderLayer(config, layer_idx=0).eval()
        reference.load_state_dict(later.state_dict())
        expected = reference(expected, attention_mask=causal, position_ids=position_ids,
                             position_embeddings=position_embeddings)
        expected = expected[0] if isinstance(expected, tuple) else expected
    got = deep_head(embeds, fused, position_ids)
    assert torch.allclose(got, expected, atol=1e-5)
    assert not torch.allclose(got[0], reference_forward(deep_head, embeds[0], fused[0]), atol=1e-3)


@torch.no_grad()
@pytest.mark.parametrize("layers", [1, 3])
def test_cached_steps_and_rollback_equal_one_full_pass(head: Eagle3Head, deep_head: Eagle3Head, layers: int) -> None:
    """A prefix pass, then single cached steps, equal one causal pass; cropping and redoing changes
    nothing. Every layer keeps its own cache, cropped together."""
    head = head if layers == 1 else deep_head
    embeds, features = _inputs(head, 9)
    fused = head.fuse(features)
    full = head(embeds, fused, torch.arange(9)[None])
    cache = HeadCache()
    parts = [head(embeds[:, :5], fused[:, :5], torch.arange(5)[None], cache)]
    for t in range(5, 9):
        parts.append(head(embeds[:, t : t + 1], fused[:, t : t + 1], torch.tensor([[t]]), cache))
    assert cache.length == 9
    assert torch.allclose(torch.cat(parts, 1), full, atol=1e-5)
    cache.crop(6)
    redo = head(embeds[:, 6:], fused[:, 6:], torch.arange(6, 9)[None], cache)
    assert torch.allclose(redo, full[:, 6:], atol=1e-5)


@torch.no_grad()
def test_norm_before_residual_uses_the_normed_state_as_residual(head: Eagle3Head) -> None:
    """speculators' ``norm_before_residual`` makes hidden_norm(g) the residual, as its reference does."""
    embeds, features = _inputs(head, 4)
    fused = head.fuse(features)
    head.midlayer.norm_before_residual = True
    try:
        got = head(embeds, fused, torch.arange(4)[None])[0]
    finally:
        head.midlayer.norm_before_residual = False
    assert torch.allclose(got, reference_forward(head, embeds[0], fused[0], norm_before_residual=True), atol=1e-5)
    assert not torch.allclose(got, reference_forward(head, embeds[0], fused[0]), atol=1e-3)
