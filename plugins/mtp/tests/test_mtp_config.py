"""MTP's options: TensorRT-LLM's and vLLM's spellings, relaxed acceptance's defaults and bounds."""

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


def test_relaxed_acceptance_defaults_are_trtllms_and_off_is_lossless() -> None:
    """TensorRT-LLM's defaults (off, top-1, delta 0); turning it on makes the method lossy."""
    config = parse_speculative_config({"decoding_type": "MTP"})
    assert (config.use_relaxed_acceptance_for_thinking, config.relaxed_topk, config.relaxed_delta) == (False, 1, 0.0)
    assert config.begin_thinking_phase_token is None and config.end_thinking_phase_token is None
    assert config.lossless
    relaxed = parse_speculative_config({"decoding_type": "MTP", "use_relaxed_acceptance_for_thinking": True,
                                        "relaxed_topk": 10, "relaxed_delta": 0.6, "begin_thinking_phase_token": 7,
                                        "end_thinking_phase_token": 8})
    assert not relaxed.lossless and (relaxed.relaxed_topk, relaxed.relaxed_delta) == (10, 0.6)


@pytest.mark.parametrize(
    ("option", "field"),
    [({"relaxed_topk": 0}, "relaxed_topk"), ({"relaxed_delta": -0.1}, "relaxed_delta"),
     ({"begin_thinking_phase_token": -1}, "begin_thinking_phase_token"),
     ({"begin_thinking_phase_token": 7, "end_thinking_phase_token": 7}, "end_thinking_phase_token")],
)
def test_bad_relaxed_options_name_the_field(option: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        parse_speculative_config({"decoding_type": "MTP", **option})


def test_bad_layer_count_names_the_field() -> None:
    with pytest.raises(ConfigError, match="num_nextn_predict_layers"):
        parse_speculative_config({"decoding_type": "MTP", "num_nextn_predict_layers": 0})
