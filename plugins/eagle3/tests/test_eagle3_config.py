"""Users select EAGLE-3 with TensorRT-LLM's or vLLM's spelling; bad options are one-line errors."""

from __future__ import annotations

import pytest

from specdec import LLM
from specdec.config_loader import parse_speculative_config
from specdec.errors import ConfigError, SpecdecError
from specdec.testing import make_tiny_target
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


@pytest.mark.parametrize(
    ("raw", "depth", "topk", "nodes"),
    [
        ({"max_draft_len": 5}, 5, 1, 5),
        ({"max_draft_len": 4, "eagle_topk": 4}, 4, 4, 16),
        ({"max_draft_len": 2, "eagle_topk": 8}, 2, 8, 16),
        ({"max_draft_len": 3, "eagle_topk": 4, "num_draft_tokens": 10}, 3, 4, 10),
        ({"max_draft_len": 3, "eagle_topk": 4, "max_total_draft_tokens": 10}, 3, 4, 10),
        ({"speculative_num_steps": 3, "speculative_eagle_topk": 4, "speculative_num_draft_tokens": 11}, 3, 4, 10),
        ({"speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}, 3, 1, 3),
    ],
)
def test_tree_options_and_their_spellings(raw: dict, depth: int, topk: int, nodes: int) -> None:
    """Depth, top-k and kept nodes in EAGLE/SGLang/TensorRT-LLM spellings. SGLang's
    speculative_num_draft_tokens counts the root token; the engine budgets the kept nodes."""
    config = parse_speculative_config({"decoding_type": "Eagle3", "model": "/h", **raw})
    assert (config.max_draft_len, config.eagle_topk, config.max_draft_tokens) == (depth, topk, nodes)
    assert config.is_tree == (topk > 1)
    assert config.draft_len_for_batch(1) == nodes


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"eagle_topk": 0}, "eagle_topk: .*greater than or equal to 1"),
        ({"max_draft_len": 4, "num_draft_tokens": 6}, "num_draft_tokens: with eagle_topk 1 the draft is a chain of max_draft_len"),
        ({"max_draft_len": 4, "eagle_topk": 2, "num_draft_tokens": 3}, "num_draft_tokens: 3 nodes cannot reach the tree depth"),
        ({"max_draft_len": 2, "eagle_topk": 2, "num_draft_tokens": 7}, "num_draft_tokens: a tree of depth 2 with eagle_topk 2 has at most 6"),
        ({"eagle_topk": 2, "speculative_num_draft_tokens": 1}, "speculative_num_draft_tokens: must be an integer >= 2"),
        ({"eagle_topk": 2, "speculative_num_draft_tokens": 5, "num_draft_tokens": 4}, "speculative_num_draft_tokens: give it or num_draft_tokens"),
        ({"max_draft_len": 3, "eagle_topk": 2, "draft_len_schedule": {4: 11}}, r"draft_len_schedule: \{4: 11\} .* \[0, 6\]"),
    ],
)
def test_bad_tree_options(raw: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        parse_speculative_config({"decoding_type": "Eagle3", "model": "/h", **raw})
    assert "\n" not in str(info.value)


def test_head_required_for_other_targets() -> None:
    """A head ships only for the default target; any other target must name one."""
    assert parse_speculative_config({"decoding_type": "Eagle3"}).speculative_model is None
    with pytest.raises(SpecdecError, match="speculative_model: required; an EAGLE-3 head ships only for the default"):
        tiny = make_tiny_target()
        LLM(tiny.model, {"method": "eagle3"}, tokenizer=tiny.tokenizer)
