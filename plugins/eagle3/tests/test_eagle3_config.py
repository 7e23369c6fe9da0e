"""Users select EAGLE-3 with TensorRT-LLM's or vLLM's spelling; bad options are one-line errors."""

from __future__ import annotations

import pytest

from specdec.config_loader import parse_speculative_config
from specdec.errors import ConfigError
from specdec_eagle3 import Eagle3DecodingConfig


@pytest.mark.parametrize(
    "raw",
    [
        {"decoding_type": "Eagle3", "max_draft_len": 3, "speculative_model": "/heads/h"},
        {"decoding_type": "Eagle", "max_draft_len": 3, "speculative_model_dir": "/heads/h"},
        {"speculative_config": {"decoding_type": "Eagle3", "max_draft_len": 3, "speculative_model": "/heads/h"}},
        {"method": "eagle3", "num_speculative_tokens": 3, "model": "/heads/h"},
    ],
)
def test_trtllm_and_vllm_spellings(raw: dict) -> None:
    config = parse_speculative_config(raw)
    assert isinstance(config, Eagle3DecodingConfig)
    assert (config.decoding_type, config.max_draft_len, config.speculative_model) == ("eagle3", 3, "/heads/h")
    assert config.eagle3_layers_to_capture is None


def test_layers_are_kept_in_ascending_order() -> None:
    """The fused states are concatenated in ascending layer order, whatever order the user wrote."""
    config = parse_speculative_config({"decoding_type": "Eagle3", "model": "/h", "eagle3_layers_to_capture": [29, 2, 16]})
    assert config.eagle3_layers_to_capture == [2, 16, 29]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"decoding_type": "Eagle3"}, "speculative_model is required"),
        ({"decoding_type": "Eagle3", "model": "/h", "eagle3_layers_to_capture": []}, "eagle3_layers_to_capture: .*at least one"),
        ({"decoding_type": "Eagle3", "model": "/h", "eagle3_layers_to_capture": [2, 2, 5]}, "eagle3_layers_to_capture: .*distinct"),
        ({"decoding_type": "Eagle3", "model": "/h", "eagle3_layers_to_capture": [-1, 2, 5]}, "eagle3_layers_to_capture: .*>= 0"),
        ({"decoding_type": "Eagle3", "model": "/h", "max_draft_len": 0}, "max_draft_len"),
        ({"decoding_type": "Eagle3", "model": "/h", "eagle3_layer": [1]}, "eagle3_layer"),
    ],
)
def test_bad_options(raw: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        parse_speculative_config(raw)
    assert "\n" not in str(info.value)
