"""The draft model's forwards on the static-shape path (captured CUDA graphs on CUDA; the same
bucketed forwards uncaptured elsewhere): drafts, and so outputs and acceptance, equal the eager
path's, greedy and seeded, batched with requests joining and leaving."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specdec import LLM, SamplingParams
from specdec.static_cache import StaticKVCache

PROMPTS = ["hello world, hello", "abc abd abe ab", "one two three, one two", "the cat sat on the mat. the cat"]


@pytest.fixture(scope="module")
def pard_draft_dir(tiny, small_draft_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small draft as a PARD draft (drafting every token of a step in one wider forward)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(small_draft_dir)
    model.config.pard_token = 3
    path = tmp_path_factory.mktemp("pard_draft")
    model.save_pretrained(path)
    tiny.tokenizer.save_pretrained(path)
    return path


@pytest.mark.parametrize("draft", ["chain", "parallel"])
def test_draft_model_on_the_static_path_drafts_as_eagerly(tiny, small_draft_dir: Path, pard_draft_dir: Path, draft: str,
                                                          device: torch.device) -> None:
    directory = small_draft_dir if draft == "chain" else pard_draft_dir
    config = {"method": "draft_target", "speculative_model": str(directory), "max_draft_len": 3,
              "adaptive_draft_len": False}
    prompts = [{"prompt_token_ids": tiny.encode(p)} for p in PROMPTS]
    modes = ["static", "cuda_graph"] if device.type == "cuda" else ["static"]
    for params in (SamplingParams(max_tokens=20, ignore_eos=True), SamplingParams(max_tokens=20, temperature=0.8, seed=3)):
        with LLM(tiny.model, config, tokenizer=tiny.tokenizer, max_batch_size=2, execution="eager") as eager:
            want = eager.generate(prompts, params)
        for mode in modes:
            with LLM(tiny.model, config, tokenizer=tiny.tokenizer, max_batch_size=2, execution=mode) as llm:
                assert isinstance(llm.engine.resource_manager.drafter.cache, StaticKVCache)
                got = llm.generate(prompts, params)
            assert [o.token_ids for o in got] == [o.token_ids for o in want]
            assert [o.metrics.num_accepted_tokens for o in got] == [o.metrics.num_accepted_tokens for o in want]
