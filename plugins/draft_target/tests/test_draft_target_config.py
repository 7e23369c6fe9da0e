"""Users' config shapes select the method; a missing or mismatched draft is a one-line error."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdec import LLM, ConfigError, SpecdecError
from specdec.config_loader import parse_speculative_config
from specdec.plugins import get_registry
from specdec_draft_target import DraftTargetDecodingConfig


@pytest.mark.parametrize("raw", [
    {"decoding_type": "DraftTarget", "max_draft_len": 3, "speculative_model": "some/draft"},
    {"decoding_type": "Draft_Target", "max_draft_len": 3, "speculative_model_dir": "some/draft"},
    {"method": "draft_model", "num_speculative_tokens": 3, "model": "some/draft"},
    {"method": "draft_target", "num_speculative_tokens": 3, "speculative_model": "some/draft"},
])
def test_aliases_select_the_method(raw: dict) -> None:
    """TensorRT-LLM's DraftTarget/Draft_Target and vLLM's draft_model all give the same config."""
    config = parse_speculative_config(raw, get_registry())
    assert isinstance(config, DraftTargetDecodingConfig)
    assert (config.max_draft_len, config.speculative_model, config.decoding_type) == (3, "some/draft", "draft_target")


def test_zero_draft_len_refused() -> None:
    with pytest.raises(ConfigError, match="num_speculative_tokens: Input should be greater than or equal to 1"):
        parse_speculative_config({"method": "draft_model", "num_speculative_tokens": 0}, get_registry())


def test_mismatched_tokenizer_refused(tiny, mismatched_draft_dir: Path) -> None:
    """A draft with another vocabulary is refused with the reason, before any generation."""
    config = DraftTargetDecodingConfig(speculative_model=str(mismatched_draft_dir))
    with pytest.raises(SpecdecError) as info:
        LLM(tiny.model, config, tokenizer=tiny.tokenizer)
    message = str(info.value)
    assert "\n" not in message
    assert "tokenizer differs from the target's" in message and "slower than plain decoding" in message


def test_same_tokenizer_accepted(tiny, small_draft_dir: Path) -> None:
    """The check passes a draft that shares the tokenizer (so the refusal above is specific)."""
    llm = LLM(tiny.model, DraftTargetDecodingConfig(speculative_model=str(small_draft_dir)), tokenizer=tiny.tokenizer)
    llm.close()


def test_draft_required_for_other_targets(tiny) -> None:
    """Only the default target has a shipped draft; others must name one."""
    with pytest.raises(SpecdecError, match="speculative_model: required"):
        LLM(tiny.model, {"method": "draft_model"}, tokenizer=tiny.tokenizer)
