"""MTP layers for targets other than DeepSeek-V3: the block is the target's own decoder-layer class
(grouped-query attention, sliding-window configs, experts), and its per-depth cache gives exactly
the outputs of a whole-sequence forward."""

from __future__ import annotations

import pytest
import torch
from mtp_tiny import initialized

from specdec.testing.architectures import make_tiny_model
from specdec_mtp import MTPLayer
from specdec_mtp.layer import LatentCache

SUPPORTED = ("llama", "qwen2", "qwen3", "mistral", "mistral_sliding", "phi3", "olmo2", "granite", "gemma2", "gpt_oss",
             "deepseek_v3")


@pytest.mark.parametrize("name", SUPPORTED)
def test_block_is_the_targets_own_and_caches_exactly(name: str) -> None:
    target = make_tiny_model(name)
    config = target.model.config
    torch.manual_seed(0)
    layer = initialized(MTPLayer(config, config.num_hidden_layers)).eval()
    assert type(layer.block) is type(target.model.get_decoder().layers[-1])
    rotary = target.model.get_decoder().rotary_emb
    embeds, previous = torch.randn(1, 9, config.hidden_size), torch.randn(1, 9, config.hidden_size)
    positions = torch.arange(9)[None]

    def run(start: int, end: int, cache: LatentCache | None) -> torch.Tensor:
        span = positions[:, start:end]
        return layer(embeds[:, start:end], previous[:, start:end], span, rotary(embeds[:, start:end], span), cache)

    with torch.no_grad():
        whole = run(0, 9, None)
        cache = LatentCache()
        pieces = torch.cat([run(0, 5, cache), run(5, 6, cache), run(6, 9, cache)], dim=1)
    assert cache.length == 9
    assert torch.allclose(pieces, whole, atol=1e-5)
