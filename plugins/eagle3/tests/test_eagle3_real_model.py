"""EAGLE-3 on the embedded default model (SmolLM2-135M-Instruct, 30 layers, grouped-query attention),
float32.

The shipped head (trained for this target, used when no ``speculative_model`` is given) keeps
greedy output exact for chains, trees and batches while its drafts are accepted, and sampled
output follows the target's exact distribution. An untrained head in vLLM's speculators layout
proves the default fused layers.
"""

from __future__ import annotations

import pytest
import torch
from eagle3_tiny import head_config

from specdec import LLM, SamplingParams
from specdec.testing.conformance import P_VALUE_FLOOR
from specdec.testing.real_model import outputs_alone_and_batched, plain, sampled_distribution_p_value  # noqa: F401 (plain: a fixture)
from specdec_eagle3 import Eagle3Head, save_head

pytestmark = pytest.mark.real_model


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


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.7, top_p=0.95, seed=0)],
                         ids=["greedy", "seeded"])
@pytest.mark.parametrize("tree", [{}, {"eagle_topk": 4, "num_draft_tokens": 12}], ids=["chain", "tree"])
def test_shipped_head_is_lossless(plain: LLM, tree: dict, sampling: SamplingParams) -> None:
    """Two Spec-Bench prompts, alone and batched: exactly plain decoding's output while drafts
    are accepted, greedy and sampled with a seed."""
    config = {"method": "eagle3", "num_speculative_tokens": 4, "adaptive_draft_len": False, **tree}
    expected, alone, batched = outputs_alone_and_batched(plain, config, ["math", "roleplay"], sampling=sampling)
    assert [o.token_ids for o in alone] == expected
    assert [o.token_ids for o in batched] == expected
    assert sum(o.metrics.num_accepted_tokens for o in alone) > 0


def test_shipped_head_sampling_follows_target(plain: LLM) -> None:
    """Unseeded requests (a chain, rejection sampling): the reply's first three sampled tokens
    (top-k 2) match the exact joint distribution (chi-square). Seeded ones equal plain seeded
    decoding, for chains and trees (above). A chat prompt: the head was trained on chat replies."""
    config = {"method": "eagle3", "num_speculative_tokens": 4, "adaptive_draft_len": False}
    p_value, accepted = sampled_distribution_p_value(plain, config, "Name the three primary colors.", chat=True)
    assert accepted > 0
    assert p_value > P_VALUE_FLOOR
