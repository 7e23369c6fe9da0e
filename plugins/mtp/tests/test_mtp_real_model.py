"""MTP on the embedded default model (SmolLM2-135M-Instruct, a Llama-style target with no MTP
layers of its own), float32: a new layer for it (as `specdec train mtp` starts one, in
DeepSeek-V3's layout) drafts every step, and greedy output, alone and batched, stays exactly
plain decoding's."""

from __future__ import annotations

import pytest
import torch

from specdec import SamplingParams
from specdec.testing.real_model import default_model_llm, outputs_alone_and_batched
from specdec_mtp.training.model import export, new_layers

pytestmark = pytest.mark.real_model


def test_a_new_layer_keeps_greedy_output_on_the_default_model(tmp_path) -> None:
    with default_model_llm("float32") as plain:
        torch.manual_seed(0)
        layers = new_layers(plain.model, 1)
        with torch.no_grad():  # away from the pass-through start
            for param in (p for p in layers.parameters() if p.requires_grad):
                param.add_(1e-3 * torch.randn_like(param))
        export(layers, plain.model.config, tmp_path, torch.float32, "default", with_head=False)
        config = {"method": "mtp", "speculative_model": str(tmp_path), "max_draft_len": 3, "adaptive_draft_len": False}
        expected, alone, batched = outputs_alone_and_batched(plain, config, ["writing", "math"], max_tokens=24,
                                                             sampling=SamplingParams())
    assert [o.token_ids for o in alone] == expected
    assert [o.token_ids for o in batched] == expected
    assert all(o.metrics.num_draft_tokens > 0 for o in alone)
