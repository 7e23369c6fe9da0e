"""Load Medusa heads as they are published, in either layout.

- FasterDecoding (the Medusa repository): ``config.json`` with ``medusa_num_heads``,
  ``medusa_num_layers`` and ``base_model_name_or_path``; ``medusa_lm_head.safetensors`` or
  ``medusa_lm_head.pt`` with ``{i}.{j}.linear.weight`` / ``{i}.{j}.linear.bias`` (block ``j`` of
  head ``i``) and ``{i}.{num_layers}.weight`` (the head's vocabulary projection, no bias). specdec's
  own extension: with ``"medusa_shared_lm_head": true`` in ``config.json`` (``specdec train medusa
  --share-lm-head``) the projections are absent and every head projects through the target's
  own output layer, which the caller passes as ``target_lm_head``.
- vLLM: ``config.json`` with ``num_heads``, ``num_hidden_layers``, ``hidden_size``,
  ``vocab_size`` and optionally ``truncated_vocab_size``, ``medusa_fc_bias`` and
  ``original_lm_head``; weights ``blocks.{h}.layers.{l}.weight`` (``.bias`` with
  ``medusa_fc_bias``), ``lm_heads.{h}.weight`` (only ``lm_heads.0.weight``, shared, with
  ``original_lm_head``) and ``token_map`` when the vocabulary is truncated. A ``medusa_heads.``
  prefix is ignored, as vLLM does.

``.pt`` / ``.bin`` files load with ``torch.load(weights_only=True)``. Every expected tensor must
be present with the shape the target implies; the error names the tensor.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specdec import ConfigError, ModelLoadError
from specdec_medusa.heads import MedusaHeads

WEIGHT_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt", "model.safetensors", "pytorch_model.bin")
_PREFIXES = ("medusa_heads.", "medusa_head.")


@dataclass
class HeadSpec:
    """What a checkpoint's config declares, in one shape for both layouts."""

    layout: str
    num_heads: int
    num_layers: int
    bias: bool
    #: vLLM's ``original_lm_head``: one projection in the file, used by every head.
    shared_lm_head: bool
    #: specdec's ``medusa_shared_lm_head``: no projection in the file; the heads use the target's.
    target_lm_head: bool
    head_vocab_size: int | None
    hidden_size: int | None
    vocab_size: int | None


def load_heads(source: str | Path, hidden_size: int, vocab_size: int, num_heads: int | None = None,
               target_lm_head: torch.Tensor | None = None) -> MedusaHeads:
    """The first ``num_heads`` heads (all by default) of the checkpoint in directory ``source``,
    checked against a target of ``hidden_size`` and ``vocab_size``.

    :param target_lm_head: the target's output weight ``[vocab_size, hidden_size]``, which heads
        saved with ``"medusa_shared_lm_head": true`` project through (shared, not copied).
    """
    directory = Path(source)
    spec = _read_spec(directory)
    if spec.target_lm_head and target_lm_head is None:
        raise _fail(directory, "config.json: medusa_shared_lm_head is true, so the heads need the target's lm_head")
    if spec.target_lm_head and tuple(target_lm_head.shape) != (vocab_size, hidden_size):
        raise _fail(directory, f"the target's lm_head has shape {list(target_lm_head.shape)}, expected {[vocab_size, hidden_size]}")
    if num_heads is not None and num_heads > spec.num_heads:
        raise ConfigError(f"num_medusa_heads: {num_heads} requested, the checkpoint {str(directory)!r} has {spec.num_heads} heads")
    for field, declared, actual in (("hidden_size", spec.hidden_size, hidden_size), ("vocab_size", spec.vocab_size, vocab_size)):
        if declared is not None and declared != actual:
            raise _fail(directory, f"config.json: {field} is {declared}, the target's is {actual}")
    tensors = {_strip(name): tensor for name, tensor in _read_tensors(directory).items()}
    used = num_heads or spec.num_heads
    token_map = _token_map(tensors, spec, vocab_size, directory)
    head_vocab = spec.head_vocab_size or vocab_size
    shared = target_lm_head if spec.target_lm_head else None
    heads = MedusaHeads(used, spec.num_layers, hidden_size, head_vocab, spec.bias, token_map, shared)
    for h in range(used):
        for layer in range(spec.num_layers):
            linear = heads.blocks[h][layer].linear
            weight, bias = _block_names(spec, h, layer)
            linear.weight.data = _tensor(tensors, weight, (hidden_size, hidden_size), directory)
            if spec.bias:
                linear.bias.data = _tensor(tensors, bias, (hidden_size,), directory)
        if not spec.target_lm_head:
            lm_head = _lm_head_name(spec, h)
            heads.lm_heads[h].weight.data = _tensor(tensors, lm_head, (head_vocab, hidden_size), directory, vocab=True)
    return heads.eval()


def _read_spec(directory: Path) -> HeadSpec:
    path = directory / "config.json"
    if not path.is_file():
        raise _fail(directory, "no config.json (expected a Medusa heads directory, FasterDecoding or vLLM layout)")
    try:
        raw: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise _fail(directory, f"config.json does not read as JSON: {exc}") from exc
    if "medusa_num_heads" in raw:
        return HeadSpec(
            "fasterdecoding", _positive(raw, "medusa_num_heads", directory), _positive(raw, "medusa_num_layers", directory, 1),
            bias=True, shared_lm_head=False, target_lm_head=_flag(raw, "medusa_shared_lm_head", directory),
            head_vocab_size=None, hidden_size=None, vocab_size=None,
        )
    if "num_heads" in raw:
        vocab = _positive(raw, "vocab_size", directory)
        return HeadSpec(
            "vllm", _positive(raw, "num_heads", directory), _positive(raw, "num_hidden_layers", directory, 1),
            bias=bool(raw.get("medusa_fc_bias", False)), shared_lm_head=bool(raw.get("original_lm_head", False)), target_lm_head=False,
            head_vocab_size=_positive(raw, "truncated_vocab_size", directory, vocab), hidden_size=_positive(raw, "hidden_size", directory),
            vocab_size=vocab,
        )
    raise _fail(directory, "config.json has neither medusa_num_heads (FasterDecoding) nor num_heads (vLLM)")


def _flag(raw: dict[str, Any], field: str, directory: Path) -> bool:
    value = raw.get(field, False)
    if not isinstance(value, bool):
        raise _fail(directory, f"config.json: {field} must be true or false, got {value!r}")
    return value


def _positive(raw: dict[str, Any], field: str, directory: Path, default: int | None = None) -> int:
    value = raw.get(field)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _fail(directory, f"config.json: {field} must be a positive integer, got {value!r}")
    return value


def _read_tensors(directory: Path) -> dict[str, torch.Tensor]:
    for name in WEIGHT_FILES:
        file = directory / name
        if not file.is_file():
            continue
        try:
            if file.suffix == ".safetensors":
                from safetensors.torch import load_file

                return load_file(str(file))
            return torch.load(file, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise _fail(directory, f"{name} does not load: {type(exc).__name__}: {exc}") from exc
    raise _fail(directory, f"no weights file; expected one of {', '.join(WEIGHT_FILES)}")


def _strip(name: str) -> str:
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def _block_names(spec: HeadSpec, head: int, layer: int) -> tuple[str, str]:
    if spec.layout == "fasterdecoding":
        return f"{head}.{layer}.linear.weight", f"{head}.{layer}.linear.bias"
    return f"blocks.{head}.layers.{layer}.weight", f"blocks.{head}.layers.{layer}.bias"


def _lm_head_name(spec: HeadSpec, head: int) -> str:
    if spec.layout == "fasterdecoding":
        return f"{head}.{spec.num_layers}.weight"
    return f"lm_heads.{0 if spec.shared_lm_head else head}.weight"


def _token_map(tensors: dict[str, torch.Tensor], spec: HeadSpec, vocab_size: int, directory: Path) -> torch.Tensor | None:
    """vLLM's map from a truncated head vocabulary to target ids, when the vocabulary is truncated."""
    if spec.head_vocab_size is None or spec.head_vocab_size == vocab_size:
        return None
    if spec.head_vocab_size > vocab_size:
        raise _fail(directory, f"config.json: truncated_vocab_size {spec.head_vocab_size} exceeds vocab_size {vocab_size}")
    token_map = _tensor(tensors, "token_map", (spec.head_vocab_size,), directory)
    if token_map.is_floating_point() or int(token_map.min()) < 0 or int(token_map.max()) >= vocab_size:
        raise _fail(directory, f"tensor 'token_map': expected integer token ids in [0, {vocab_size})")
    return token_map.long()


def _tensor(
    tensors: dict[str, torch.Tensor], name: str, shape: tuple[int, ...], directory: Path, vocab: bool = False
) -> torch.Tensor:
    if name not in tensors:
        hint = (" (a head's vocabulary projection; heads trained to use the target's lm_head say so with "
                '"medusa_shared_lm_head": true in config.json)') if vocab and name[0].isdigit() else ""
        raise _fail(directory, f"tensor {name!r} is missing{hint}")
    tensor = tensors[name]
    if tuple(tensor.shape) != shape:
        what = "the target's hidden size and the heads' vocabulary" if vocab else "the target's hidden size"
        raise _fail(directory, f"tensor {name!r} has shape {list(tensor.shape)}, expected {list(shape)} ({what})")
    if tensor.is_floating_point() and not bool(tensor.isfinite().all()):
        raise _fail(directory, f"tensor {name!r} is not finite")
    return tensor


def _fail(directory: Path, reason: str) -> ModelLoadError:
    return ModelLoadError(f"Medusa heads {str(directory)!r}: {reason}")
