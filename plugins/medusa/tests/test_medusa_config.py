"""Users select Medusa with TensorRT-LLM's or vLLM's spelling; medusa_choices reads both of
TensorRT-LLM's forms; bad options are errors naming the field."""

from __future__ import annotations

import pytest

from specdec.config_loader import parse_speculative_config
from specdec.errors import ConfigError
from specdec.trees import parents_of_paths
from specdec_medusa import MC_SIM_7B_63, MedusaDecodingConfig, expand_choices

#: TensorRT-LLM's example: the four unique paths, and the nine candidates they stand for.
TRTLLM_PATHS = [[0, 0, 0, 0], [0, 1, 0], [1, 0], [1, 1]]
TRTLLM_CANDIDATES = [[0], [0, 0], [0, 0, 0], [0, 0, 0, 0], [0, 1], [0, 1, 0], [1], [1, 0], [1, 1]]


def test_unique_paths_expand_to_the_nine_candidates_trtllm_lists() -> None:
    nodes = expand_choices(TRTLLM_PATHS)
    assert len(nodes) == 9
    assert sorted(nodes) == sorted(tuple(c) for c in TRTLLM_CANDIDATES)
    assert expand_choices(TRTLLM_CANDIDATES) == [tuple(c) for c in TRTLLM_CANDIDATES]


def test_expanded_nodes_come_after_their_parents() -> None:
    for choices in (TRTLLM_PATHS, TRTLLM_CANDIDATES, [[1, 1], [0]], MC_SIM_7B_63):
        parents = parents_of_paths(expand_choices(choices))
        assert all(-1 <= p < i for i, p in enumerate(parents))


def test_default_tree_is_mc_sim_7b_63_cut_to_the_heads() -> None:
    assert len(MC_SIM_7B_63) == 63 and len(set(MC_SIM_7B_63)) == 63
    assert max(len(c) for c in MC_SIM_7B_63) == 4
    full = MedusaDecodingConfig(speculative_model="/h")
    assert (full.max_draft_len, full.max_draft_tokens, full.tree()) == (4, 63, list(MC_SIM_7B_63))
    two = MedusaDecodingConfig(speculative_model="/h", num_medusa_heads=2)
    assert two.max_draft_len == 2
    assert two.tree() == [c for c in MC_SIM_7B_63 if len(c) <= 2]


def test_max_draft_len_cuts_the_tree_depth() -> None:
    config = MedusaDecodingConfig(speculative_model="/h", medusa_choices=TRTLLM_PATHS, max_draft_len=2)
    assert config.tree() == [(0,), (0, 0), (0, 1), (1,), (1, 0), (1, 1)]
    assert config.max_draft_tokens == 6


@pytest.mark.parametrize(
    "raw",
    [
        {"decoding_type": "Medusa", "speculative_model": "/heads/h", "num_medusa_heads": 3, "medusa_choices": TRTLLM_PATHS},
        {"method": "medusa", "model": "/heads/h", "num_speculative_tokens": 3, "medusa_choices": TRTLLM_PATHS},
    ],
)
def test_trtllm_and_vllm_spellings(raw: dict) -> None:
    config = parse_speculative_config(raw)
    assert isinstance(config, MedusaDecodingConfig)
    assert (config.decoding_type, config.speculative_model, config.depth) == ("medusa", "/heads/h", 3)
    assert (config.posterior_threshold, config.posterior_alpha, config.acceptance) == (0.09, 0.3, "lossless")
    assert config.lossless


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"medusa_choices": [[0, -1]]}, "medusa_choices"),
        ({"medusa_choices": [[]]}, "medusa_choices"),
        ({"medusa_choices": []}, "medusa_choices"),
        ({"num_medusa_heads": 0}, "num_medusa_heads"),
        ({"posterior_threshold": 0}, "posterior_threshold"),
        ({"posterior_alpha": 1.5}, "posterior_alpha"),
        ({"acceptance": "greedy"}, "acceptance"),
        ({"max_draft_len": 0}, "max_draft_len"),
    ],
)
def test_invalid_options_name_the_field(options: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        parse_speculative_config({"decoding_type": "Medusa", "speculative_model": "/h", **options})
