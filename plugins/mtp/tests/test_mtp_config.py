"""MTP's options: TensorRT-LLM's and vLLM's spellings; relaxed acceptance refused until it exists."""

from __future__ import annotations

import pytest

from specdec.config_loader import parse_speculative_config
from specdec.errors import ConfigError
from specdec_mtp import MTPDecodingConfig


@pytest.mark.parametrize(
    "raw",
    [
        {"decoding_type": "MTP", "max_draft_len": 3, "num_nextn_predict_layers": 3},
        {"method": "mtp", "num_speculative_tokens": 3},
        {"method": "deepseek_mtp", "num_speculative_tokens": 3, "model": "/ckpt"},
    ],
)
def test_trtllm_and_vllm_spellings(raw: dict) -> None:
    config = parse_speculative_config(raw)
    assert isinstance(config, MTPDecodingConfig)
    assert config.max_draft_len == 3


def test_defaults() -> None:
    config = parse_speculative_config({"decoding_type": "MTP"})
    assert config.max_draft_len == 1 and config.num_nextn_predict_layers is None and config.speculative_model is None


@pytest.mark.parametrize(
    "option",
    [{"use_relaxed_acceptance_for_thinking": True}, {"relaxed_topk": 10}, {"relaxed_delta": 0.6},
     {"begin_thinking_phase_token": 7}, {"end_thinking_phase_token": 8}],
)
def test_relaxed_acceptance_is_refused_as_not_implemented(option: dict) -> None:
    with pytest.raises(ConfigError, match="not implemented yet"):
        parse_speculative_config({"decoding_type": "MTP", **option})


def test_relaxed_acceptance_off_is_accepted() -> None:
    config = parse_speculative_config({"decoding_type": "MTP", "use_relaxed_acceptance_for_thinking": False})
    assert not config.use_relaxed_acceptance_for_thinking


def test_bad_layer_count_names_the_field() -> None:
    with pytest.raises(ConfigError, match="num_nextn_predict_layers"):
        parse_speculative_config({"decoding_type": "MTP", "num_nextn_predict_layers": 0})
