"""EAGLE-3 on sliding-window targets (Gemma 2, Gemma 3, Mistral with ``sliding_window``, gpt-oss)
and on DeepSeek-V3 (latent attention, mixture-of-experts layers) decodes exactly as transformers'
own greedy ``generate``, with chains and with trees deeper than the window of 4, alone and as a
batch of ragged prompts. The head is a Llama layer of its own: it reads only the target's hidden
states, embeddings and vocabulary."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from eagle3_tiny import fitted_head

from specdec import LLM, SamplingParams
from specdec.testing.architectures import SLIDING_WINDOW, hf_greedy, make_tiny_model
from specdec_eagle3 import save_head

PROMPTS = ("hello world, hello", "abc", "one two three, one two three, one")
NEW_TOKENS = 30


@pytest.mark.parametrize("name", [*SLIDING_WINDOW, "deepseek_v3"])
def test_eagle3_on_sliding_window_and_latent_attention_targets(name: str, device: torch.device, tmp_path: Path) -> None:
    target = make_tiny_model(name, device=device)
    head = save_head(fitted_head(target.model, (0, 1)), tmp_path / "head", "speculators")
    prompts = [target.encode(text) for text in PROMPTS]
    expected = hf_greedy(target, prompts, NEW_TOKENS)
    chain = {"method": "eagle3", "model": str(head), "max_draft_len": 5, "adaptive_draft_len": False}
    tree = {**chain, "eagle_topk": 2, "num_draft_tokens": 8}
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    for config in (chain, tree):
        for batch in (1, len(prompts)):
            with LLM(target.model, config, tokenizer=target.tokenizer, max_batch_size=batch) as llm:
                outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params)
            assert [o.token_ids for o in outputs] == expected, (config, batch)
            assert sum(o.metrics.num_accepted_tokens for o in outputs) > 0, (config, batch)
