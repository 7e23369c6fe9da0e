"""EAGLE-3 on the embedded default model (SmolLM2-135M-Instruct, 30 layers, grouped-query attention).

No trained head for it ships yet, so this uses an untrained head of the right shape: it proves the
default layers, the shapes and the head's cache on a real target, and that greedy output stays
exact, not that drafts are accepted (the tiny-model conformance suite proves that part).
"""

from __future__ import annotations

import pytest
import torch
from eagle3_tiny import head_config

from specdec import LLM, SamplingParams
from specdec.testing.real_model import default_model_llm
from specdec_eagle3 import Eagle3Head, save_head

pytestmark = pytest.mark.real_model


@pytest.fixture(scope="module")
def plain() -> LLM:
    with default_model_llm("float32") as llm:
        yield llm


def test_untrained_head_keeps_greedy_output_on_the_default_model(plain: LLM, tmp_path) -> None:
    torch.manual_seed(0)
    head = Eagle3Head(head_config(plain.model, None, draft_vocab_size=2048))
    with torch.no_grad():
        head.d2t.copy_(torch.arange(2048) * 7 % plain.model.config.vocab_size - torch.arange(2048))
    path = save_head(head, tmp_path / "head", "speculators")
    llm = LLM(plain.model, {"method": "eagle3", "model": str(path), "num_speculative_tokens": 3,
                            "adaptive_draft_len": False}, tokenizer=plain.tokenizer)
    try:
        assert llm.engine.resource_manager.layers == (2, 15, 27)
        messages = [{"role": "user", "content": "Name three primary colors."}]
        params = SamplingParams(max_tokens=24)
        got = llm.chat(messages, params)[0]
        assert got.token_ids == plain.chat(messages, params)[0].token_ids
        assert got.metrics.num_draft_tokens > 0
    finally:
        llm.close()
