"""`specdec_hf_generate_kwargs` gives transformers' assisted generation the same draft, with the
same fixed draft length, and it runs (greedy: same tokens as plain generate)."""

from __future__ import annotations

from pathlib import Path

import torch

from specdec import LLM
from specdec.plugins import get_registry
from specdec_draft_target import DraftTargetDecodingConfig


def test_assistant_model_is_the_configured_draft(tiny, small_draft_dir: Path) -> None:
    config = DraftTargetDecodingConfig(max_draft_len=3, speculative_model=str(small_draft_dir))
    llm = LLM(tiny.model, config, tokenizer=tiny.tokenizer)
    try:
        kwargs = get_registry().hook.specdec_hf_generate_kwargs(config=llm.speculative_config, target=llm.engine.target)
    finally:
        llm.close()
    assistant = kwargs["assistant_model"]
    assert Path(assistant.name_or_path) == small_draft_dir
    assert assistant.generation_config.num_assistant_tokens == 3
    assert assistant.generation_config.num_assistant_tokens_schedule == "constant"
    ids = torch.tensor([tiny.encode("the cat sat on the mat. the cat")])
    plain = tiny.model.generate(ids, max_new_tokens=12, do_sample=False)
    assisted = tiny.model.generate(ids, max_new_tokens=12, do_sample=False, **kwargs)
    assert torch.equal(plain, assisted)


def test_other_methods_get_no_kwargs(tiny) -> None:
    llm = LLM(tiny.model, {"method": "ngram"}, tokenizer=tiny.tokenizer)
    try:
        result = get_registry().hook.specdec_hf_generate_kwargs(config=llm.speculative_config, target=llm.engine.target)
    finally:
        llm.close()
    assert "assistant_model" not in (result or {})
