"""Config parsing: TensorRT-LLM and vLLM shapes, name matching, and errors that name the field."""

from __future__ import annotations

import pytest
from specdec_ngram import NGramDecodingConfig

from specdec import (
    ConfigError,
    PlainDecodingConfig,
    SpeculativeConfig,
    UnknownMethodError,
    UserProvidedDecodingConfig,
)
from specdec.config_loader import load_config_file, parse_speculative_config
from specdec.plugins import get_registry, normalize_method_name

TRTLLM_YAML = """\
# A TensorRT-LLM extra-llm-api-options file: only speculative_config matters to specdec.
backend: pytorch
kv_cache_config:
  free_gpu_memory_fraction: 0.8
speculative_config:
  decoding_type: NGram
  max_draft_len: 3
  max_matching_ngram_size: 2
  is_keep_all: false
  is_use_oldest: false
  is_public_pool: true
"""


@pytest.fixture
def registry(fresh_registry):
    return get_registry()


def test_trtllm_yaml_file_with_speculative_config_nesting(tmp_path, registry):
    """A TensorRT-LLM YAML file (``speculative_config:`` nested among other options) parses into
    the n-gram config, every option carried over; the file works as str and as Path."""
    path = tmp_path / "extra_llm_api_options.yaml"
    path.write_text(TRTLLM_YAML)
    for value in (path, str(path)):
        config = parse_speculative_config(value, registry)
        assert type(config) is NGramDecodingConfig
        assert config.decoding_type == "ngram"
        assert config.max_draft_len == 3
        assert config.max_matching_ngram_size == 2
        assert (config.is_keep_all, config.is_use_oldest, config.is_public_pool) == (False, False, True)


def test_trtllm_flat_dict_and_speculative_model_dir_alias(registry):
    """A flat TensorRT-LLM dict parses; ``speculative_model_dir`` (TensorRT-LLM) and ``model``
    (vLLM) both fill ``speculative_model``."""
    config = parse_speculative_config({"decoding_type": "NGram", "speculative_model_dir": "/models/draft"}, registry)
    assert config.speculative_model == "/models/draft"
    config = parse_speculative_config({"method": "ngram", "model": "org/draft"}, registry)
    assert config.speculative_model == "org/draft"
    assert NGramDecodingConfig(speculative_model_dir="/d").speculative_model == "/d"


@pytest.mark.parametrize("name", ["ngram", "NGram", "NGRAM", "n_gram", "N-Gram", "n gram", "Prompt_Lookup", "prompt-lookup", "ngram_proposer"])
def test_method_names_ignore_case_dash_underscore(name, registry):
    """Method names and aliases match ignoring case, ``-``, ``_`` (and spaces)."""
    config = parse_speculative_config({"decoding_type": name}, registry)
    assert type(config) is NGramDecodingConfig
    assert config.decoding_type == "ngram"


def test_normalize_method_name():
    """normalize_method_name drops case, ``-``, ``_`` and whitespace, nothing else."""
    assert normalize_method_name("Draft_Target-Model") == "drafttargetmodel"
    assert normalize_method_name("N_Gram") == normalize_method_name("ngram") == "ngram"
    assert normalize_method_name("eagle3") != normalize_method_name("eagle")


def test_vllm_dict(registry):
    """A vLLM speculative_config dict (``method``, ``num_speculative_tokens``,
    ``prompt_lookup_max/min``) maps onto the n-gram config."""
    config = parse_speculative_config(
        {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2}, registry
    )
    assert type(config) is NGramDecodingConfig
    assert (config.max_draft_len, config.max_matching_ngram_size, config.prompt_lookup_min) == (5, 4, 2)


def test_both_method_keys_must_agree(registry):
    """``decoding_type`` and ``method`` together are fine when they name the same method (by any
    alias), and an error when they differ."""
    config = parse_speculative_config({"decoding_type": "NGram", "method": "prompt_lookup"}, registry)
    assert type(config) is NGramDecodingConfig
    with pytest.raises(ConfigError, match="`decoding_type` and `method` name different methods"):
        parse_speculative_config({"decoding_type": "ngram", "method": "none"}, registry)


def test_unknown_method_lists_installed_methods(registry):
    """An unknown method raises UnknownMethodError (a ConfigError) listing the installed methods."""
    with pytest.raises(UnknownMethodError) as info:
        parse_speculative_config({"decoding_type": "Eagle7"}, registry)
    message = str(info.value)
    assert "'Eagle7'" in message
    assert "installed: " in message
    for name in registry.method_names():
        assert name in message
    assert isinstance(info.value, ConfigError)


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"speculative_config": {"decoding_type": "ngram", "max_draft_len": -1}}, "speculative_config.max_draft_len"),
        ({"decoding_type": "ngram", "max_draft_len": 65}, "speculative_config.max_draft_len"),
        ({"decoding_type": "ngram", "max_draft_len": "four"}, "speculative_config.max_draft_len"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "speculative_config.num_speculative_tokens"),
        ({"decoding_type": "ngram", "is_public_pool": "maybe"}, "speculative_config.is_public_pool"),
        ({"decoding_type": "none", "max_draft_len": 2}, "speculative_config.max_draft_len"),
        ({"method": "ngram", "use_sa_spec": True, "sa_spec_threshold": 0}, "speculative_config.sa_spec_threshold"),
    ],
)
def test_bad_field_value_names_the_field(value, field, registry):
    """A bad value raises ConfigError (not pydantic's ValidationError) whose message names the
    field with its ``speculative_config.`` path."""
    with pytest.raises(ConfigError) as info:
        parse_speculative_config(value, registry)
    assert str(info.value).startswith(f"{field}: ")
    assert "pydantic" not in str(info.value).lower()


def test_cross_field_check_is_a_config_error(registry):
    """A model-level check (prompt_lookup_min > prompt_lookup_max) is also a ConfigError."""
    with pytest.raises(ConfigError, match="^speculative_config: .*prompt_lookup_min must not exceed"):
        parse_speculative_config({"method": "ngram", "prompt_lookup_min": 5, "prompt_lookup_max": 2}, registry)


def test_suffix_drafts_need_a_method_that_drafts(registry):
    """``use_sa_spec`` on plain decoding is refused by name, pointing to the suffix method."""
    with pytest.raises(ConfigError, match="^speculative_config: .*use_sa_spec: needs a method that drafts.*'suffix'"):
        parse_speculative_config({"method": "none", "use_sa_spec": True}, registry)


def test_unknown_extra_field_is_refused_by_name(registry):
    """A field the method does not have is refused, naming it (typos do not pass silently)."""
    with pytest.raises(ConfigError, match=r"^speculative_config\.max_draft_length: Extra inputs are not permitted"):
        parse_speculative_config({"decoding_type": "ngram", "max_draft_length": 3}, registry)
    with pytest.raises(ConfigError, match=r"speculative_config\.prompt_lookup_max"):
        parse_speculative_config({"decoding_type": "none", "prompt_lookup_max": 3}, registry)


def test_missing_method_names_the_field(registry):
    """A config naming no method says ``speculative_config.decoding_type: missing`` and lists
    the methods to choose from."""
    for value in ({"max_draft_len": 3}, {"speculative_config": {"max_draft_len": 3}}, {"decoding_type": None}):
        with pytest.raises(ConfigError, match=r"^speculative_config\.decoding_type: missing \(name a method: .*ngram"):
            parse_speculative_config(value, registry)


def test_config_object_is_passed_through(registry):
    """A config object is returned as is (same object), after checking its method is installed."""
    config = NGramDecodingConfig(max_draft_len=2)
    assert parse_speculative_config(config, registry) is config
    plain = PlainDecodingConfig()
    assert parse_speculative_config(plain, registry) is plain

    class Unregistered(SpeculativeConfig):
        pass

    with pytest.raises(UnknownMethodError, match="Unregistered is not the config class of any installed method"):
        parse_speculative_config(Unregistered(), registry)


def test_none_means_plain_decoding(registry, tmp_path):
    """``None``, ``"none"`` and an empty ``speculative_config:`` all mean plain decoding."""
    assert type(parse_speculative_config(None, registry)) is PlainDecodingConfig
    assert type(parse_speculative_config("None", registry)) is PlainDecodingConfig
    assert type(parse_speculative_config({"speculative_config": None}, registry)) is PlainDecodingConfig
    path = tmp_path / "plain.yaml"
    path.write_text("backend: pytorch\nspeculative_config:\n")
    assert type(parse_speculative_config(path, registry)) is PlainDecodingConfig
    assert PlainDecodingConfig().decoding_type == "none" and PlainDecodingConfig().max_draft_len == 0


def test_decoding_type_filled_in_for_config_objects():
    """A config built directly gets ``decoding_type`` from its class."""
    assert NGramDecodingConfig().decoding_type == "ngram"
    assert UserProvidedDecodingConfig(drafter=_Drafter()).decoding_type == "user_provided"


class _Drafter:
    def prepare_draft_tokens(self, requests, resource_manager):
        return [[] for _ in requests]


def test_invalid_yaml_is_a_config_error(tmp_path, registry):
    """Malformed YAML raises ConfigError naming the file, not a yaml traceback."""
    path = tmp_path / "bad.yaml"
    path.write_text("speculative_config:\n  decoding_type: [ngram\n  max_draft_len: 3\n")
    with pytest.raises(ConfigError, match="bad.yaml.*is not valid YAML") as info:
        parse_speculative_config(path, registry)
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_missing_file_is_a_config_error(tmp_path, registry):
    """A missing config file (or a directory) raises ConfigError naming it, not OSError."""
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="cannot read config file .*nope.yaml") as info:
        parse_speculative_config(missing, registry)
    assert not isinstance(info.value, OSError)
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config_file(tmp_path)


def test_non_mapping_file_and_values_are_config_errors(tmp_path, registry):
    """A file holding a list, a non-mapping ``speculative_config`` and other types are refused."""
    path = tmp_path / "list.yaml"
    path.write_text("- ngram\n- 3\n")
    with pytest.raises(ConfigError, match="must hold a mapping, got list"):
        parse_speculative_config(path, registry)
    with pytest.raises(ConfigError, match="speculative_config must be a mapping"):
        parse_speculative_config({"speculative_config": "ngram"}, registry)
    with pytest.raises(ConfigError, match="not int"):
        parse_speculative_config(3, registry)


def test_json_file_parses(tmp_path, registry):
    """A JSON file (YAML's subset) works the same."""
    path = tmp_path / "spec.json"
    path.write_text('{"method": "ngram", "num_speculative_tokens": 2}')
    assert parse_speculative_config(path, registry).max_draft_len == 2


@pytest.mark.parametrize(("value", "method"), [("NGram", "ngram"), ("prompt-lookup", "ngram"), ("none", "none"), ("Plain", "none")])
def test_string_names_a_method(value, method, registry):
    """A string that is not a file names a method (any alias, any spelling)."""
    config = parse_speculative_config(value, registry)
    assert registry.method_for_config(config).name == method
    assert config.decoding_type == method


def test_unknown_method_string_lists_installed(registry):
    """A string naming no method (and no file) is an UnknownMethodError listing the methods."""
    with pytest.raises(UnknownMethodError, match=r"unknown speculative method 'medusa9'; installed: .*ngram"):
        parse_speculative_config("medusa9", registry)


def test_config_object_with_mismatched_decoding_type(registry):
    """A config object whose ``decoding_type`` names another method is refused, naming the field;
    a matching alias is fine."""
    assert parse_speculative_config(NGramDecodingConfig(decoding_type="Prompt_Lookup"), registry).max_draft_len == 4
    with pytest.raises(ConfigError, match=r"^speculative_config\.decoding_type: 'none' does not match NGramDecodingConfig"):
        parse_speculative_config(NGramDecodingConfig(decoding_type="none"), registry)
