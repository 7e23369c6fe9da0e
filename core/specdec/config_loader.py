"""Turn what users already write into a validated method config.

Accepted shapes:

- a config object, e.g. ``NGramDecodingConfig(max_draft_len=3)``;
- a TensorRT-LLM dict or YAML file, ``{decoding_type: NGram, max_draft_len: 3, ...}``, optionally
  nested under ``speculative_config:`` (the rest of such a file is ignored here;
  :func:`split_llm_api_options` gives it to ``specdec serve``);
- a vLLM dict, ``{method: ngram, num_speculative_tokens: 5, prompt_lookup_max: 4}``;
- ``None`` or ``"none"``: plain decoding.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from specdec.config import PlainDecodingConfig, SpeculativeConfig
from specdec.errors import ConfigError
from specdec.plugins import PluginRegistry, get_registry

_METHOD_KEYS = ("decoding_type", "method")


def format_validation_error(exc: ValidationError, prefix: str) -> str:
    """One line per problem, each naming the field: ``speculative_config.max_draft_len: ...``."""
    problems = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        where = f"{prefix}.{loc}" if loc else prefix
        problems.append(f"{where}: {err['msg']}")
    return "; ".join(problems)


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML (or JSON) config file; a clear error if it is missing or malformed."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {str(path)!r} is not UTF-8 text") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping, got {type(data).__name__}")
    return data


def split_llm_api_options(data: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """Split a TensorRT-LLM LLM API options file (``trtllm-serve --extra_llm_api_options``) into
    its speculative config and the LLM API options beside it (``max_batch_size``,
    ``kv_cache_config``, ...).

    A file with ``speculative_config:`` holds the method there (``None``: plain decoding) and
    options beside it; a file naming a method at its top level is a speculative config alone;
    any other mapping holds options only, for plain decoding.
    """
    if "speculative_config" in data:
        return data["speculative_config"], {k: v for k, v in data.items() if k != "speculative_config"}
    if any(data.get(key) is not None for key in _METHOD_KEYS):
        return data, {}
    return None, dict(data)


def _looks_like_file(value: str | Path) -> bool:
    """A string names a method (``"ngram"``) unless it is a path or has a config file suffix."""
    text = str(value)
    return isinstance(value, Path) or "/" in text or "\\" in text or text.endswith((".yaml", ".yml", ".json"))


def parse_speculative_config(
    value: SpeculativeConfig | dict[str, Any] | str | Path | None,
    registry: PluginRegistry | None = None,
) -> SpeculativeConfig:
    """Validate ``value`` into the config class of the method it names."""
    registry = registry or get_registry()
    if value is None:
        return PlainDecodingConfig()
    if isinstance(value, SpeculativeConfig):
        info = registry.method_for_config(value)
        if value.decoding_type is not None and registry.lookup(value.decoding_type).name != info.name:
            raise ConfigError(
                f"speculative_config.decoding_type: {value.decoding_type!r} does not match "
                f"{type(value).__name__} (method {info.name!r})"
            )
        return value
    if isinstance(value, (str, Path)):
        if _looks_like_file(value):
            value = load_config_file(value)
        else:
            value = {"decoding_type": value}
    if not isinstance(value, dict):
        raise ConfigError(f"speculative_config must be a config object, a mapping or a file, not {type(value).__name__}")
    if "speculative_config" in value:
        value = value["speculative_config"]
        if value is None:
            return PlainDecodingConfig()
        if not isinstance(value, dict):
            raise ConfigError("speculative_config must be a mapping")
    data = dict(value)
    names = [k for k in _METHOD_KEYS if data.get(k) is not None]
    for key in names:
        if not isinstance(data[key], str):
            raise ConfigError(f"speculative_config.{key}: must be a method name, got {data[key]!r}")
    if not names:
        raise ConfigError(
            "speculative_config.decoding_type: missing (name a method: "
            f"{', '.join(registry.method_names())})"
        )
    if len(names) == 2 and registry.lookup(data["decoding_type"]).name != registry.lookup(data["method"]).name:
        raise ConfigError("speculative_config: `decoding_type` and `method` name different methods")
    requested = data.pop(names[0])
    data.pop("method", None)
    data.pop("decoding_type", None)
    info = registry.lookup(requested)
    try:
        return info.config_class.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, "speculative_config")) from None
