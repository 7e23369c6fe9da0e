"""Read and write EAGLE-3 heads in the two published layouts.

**SafeAILab / yuhuili** (the EAGLE-3 authors' checkpoints, also what SGLang SpecForge writes): a
Llama ``config.json`` with ``num_hidden_layers: 1`` and ``draft_vocab_size`` (optionally
``target_hidden_size`` and ``eagle_config.eagle_aux_hidden_state_layer_ids``); tensors
``midlayer.self_attn.{q,k,v,o}_proj.weight``, ``midlayer.mlp.{gate,up,down}_proj.weight``,
``midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight``, ``fc.weight``,
``norm.weight``, ``lm_head.weight``, ``d2t``, ``t2d``; in ``model.safetensors`` or
``pytorch_model.bin``. The authors' code builds exactly one ``midlayer`` whatever
``num_hidden_layers`` says (EAGLE3-Vicuna1.3-13B's config says 40), so this layout is always one
layer.

**vLLM speculators**: ``config.json`` with ``speculators_model_type: eagle3``, the layer's Llama
fields under ``transformer_layer_config``, ``draft_vocab_size``, ``norm_before_residual``,
``eagle_aux_hidden_state_layer_ids`` and a ``speculators_config`` (algorithm, proposal methods,
verifier); the same tensors with ``layers.0.`` in place of ``midlayer.``. Its
``transformer_layer_config.num_hidden_layers`` may exceed 1 (vLLM reads such heads): layers
``layers.1.`` on are plain Llama layers (``later_layers.{i - 1}.`` here).

Either may carry ``embed_tokens.weight``; without it the head uses the target's embedding.

Loading checks everything before the head's weights are allocated: config.json's size fields, the
tensors' values, their names and shapes against the head the config implies (built on the meta
device, which allocates nothing), and, given the target's sizes, the head against the target. So
a config whose sizes its tensors do not have (``intermediate_size: 4000000000``) is an error
naming the field, not an attempt to allocate a terabyte.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig

from specdec import ConfigError, ModelLoadError
from specdec_eagle3.compat import check_target
from specdec_eagle3.head import Eagle3Head, Eagle3HeadConfig

Layout = Literal["safeailab", "speculators"]
LAYOUTS: tuple[str, ...] = ("safeailab", "speculators")
_SPECULATORS_LAYER = "layers.0."
_SPECULATORS_LAYERS = re.compile(r"layers\.(\d+)\.")
_MIDLAYER = "midlayer."
_LATER_LAYERS = re.compile(r"later_layers\.(\d+)\.")
#: Tensors some checkpoints carry that inference does not use.
_IGNORED_PREFIXES = ("verifier_norm.", "verifier_lm_head.")
_REQUIRED_LLAMA_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")
#: Size fields that may be absent (or null) in the decoder layer's config.
_OPTIONAL_LLAMA_FIELDS = ("num_key_value_heads", "head_dim", "max_position_embeddings")
#: Tensors a checkpoint may omit: :func:`_default_vocab_maps` derives them.
_DERIVED_TENSORS = ("d2t", "t2d")
#: No tokenizer comes near this many tokens (the largest in use have about 256k). The vocabulary
#: is the one size no tensor may pin (``t2d`` is optional), so a larger ``vocab_size`` is refused
#: as it stands, before the vocabulary map is allocated.
MAX_VOCAB_SIZE = 1 << 24


def detect_layout(config: dict[str, Any]) -> Layout:
    return "speculators" if "speculators_model_type" in config else "safeailab"


def load_head(
    path: str | Path, *, target_hidden_size: int | None = None, target_vocab_size: int | None = None
) -> Eagle3Head:
    """Load an EAGLE-3 head from a checkpoint directory in either layout (float32, on CPU).

    Given both of the target's sizes, a head built for another target is refused before its
    weights are allocated (:func:`specdec_eagle3.compat.check_target`).
    """
    directory = Path(path)
    raw = _read_config(directory)
    layout = detect_layout(raw)
    config = _head_config(raw, layout, directory)
    tensors = _read_tensors(directory)
    if layout == "speculators":
        tensors = {_from_speculators(name): t for name, t in tensors.items()}
    elif any(n.startswith(_SPECULATORS_LAYER) for n in tensors) and not any(n.startswith(_MIDLAYER) for n in tensors):
        raise _fail(directory, "tensors named layers.0.* without a speculators config: an EAGLE-1/2 head, not EAGLE-3")
    shown = _to_speculators if layout == "speculators" else str
    tensors = {n: t for n, t in tensors.items() if not n.startswith(_IGNORED_PREFIXES)}
    _check_finite(tensors, directory, shown)
    with_embedding = "embed_tokens.weight" in tensors
    if target_hidden_size is not None and target_vocab_size is not None:
        check_target(config, with_embedding, target_hidden_size, target_vocab_size, str(directory))
    config.fc_bias = "fc.bias" in tensors
    _infer_fused_layers(config, tensors)
    _check_layer_count(config, tensors, directory)
    _check_tensors(config, _implied_tensors(config, with_embedding), tensors, directory, shown)
    _default_vocab_maps(tensors, config, directory)
    head = Eagle3Head(config, with_embedding=with_embedding)
    head.load_state_dict(tensors)
    _check_vocab_maps(head, directory)
    return head.eval()


def save_head(
    head: Eagle3Head,
    path: str | Path,
    layout: Layout = "safeailab",
    *,
    weights_format: Literal["safetensors", "bin"] = "safetensors",
    verifier: str | None = None,
    verifier_architectures: tuple[str, ...] = (),
    speculative_tokens: int = 3,
) -> Path:
    """Write ``head`` to ``path`` in a published layout; returns the directory.

    ``verifier`` (the target's id or path), ``verifier_architectures`` and ``speculative_tokens``
    fill the speculators ``speculators_config``; the SafeAILab layout has no place for them.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout: must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    if layout == "safeailab" and head.config.num_layers != 1:
        raise ConfigError(
            f"layout: the SafeAILab layout holds one decoder layer; this head has {head.config.num_layers}, "
            "so write it in the speculators layout"
        )
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    state = {name: t.detach().cpu().contiguous() for name, t in head.state_dict().items()}
    if layout == "speculators":
        state = {_to_speculators(name): t for name, t in state.items()}
        config = _speculators_config(head, verifier, verifier_architectures, speculative_tokens)
    else:
        config = _safeailab_config(head)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if weights_format == "safetensors":
        save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    else:
        torch.save(state, directory / "pytorch_model.bin")
    return directory


# -- reading -------------------------------------------------------------------------------------


def _fail(directory: Path, reason: str) -> ModelLoadError:
    return ModelLoadError(f"EAGLE-3 checkpoint {str(directory)!r}: {reason}")


def _read_config(directory: Path) -> dict[str, Any]:
    if not directory.is_dir():
        raise _fail(directory, "not a directory (speculative_model must be a local checkpoint directory)")
    try:
        config = json.loads((directory / "config.json").read_text())
    except FileNotFoundError:
        raise _fail(directory, "no config.json") from None
    except (OSError, ValueError) as exc:
        raise _fail(directory, f"config.json is unreadable: {exc}") from None
    if not isinstance(config, dict):
        raise _fail(directory, "config.json must hold an object")
    return config


def _head_config(raw: dict[str, Any], layout: Layout, directory: Path) -> Eagle3HeadConfig:
    if layout == "speculators":
        if raw.get("speculators_model_type") != "eagle3":
            raise _fail(directory, f"speculators_model_type is {raw.get('speculators_model_type')!r}, not 'eagle3'")
        fields = raw.get("transformer_layer_config")
        if not isinstance(fields, dict):
            raise _fail(directory, "speculators config.json has no transformer_layer_config object")
        layers = raw.get("eagle_aux_hidden_state_layer_ids")
    else:
        fields = raw
        eagle_config = raw.get("eagle_config") if isinstance(raw.get("eagle_config"), dict) else {}
        layers = eagle_config.get("eagle_aux_hidden_state_layer_ids", raw.get("eagle_aux_hidden_state_layer_ids"))
    where = "transformer_layer_config" if layout == "speculators" else "config.json"
    prefix = "transformer_layer_config." if layout == "speculators" else ""
    missing = [f for f in _REQUIRED_LLAMA_FIELDS if fields.get(f) is None]
    if missing:
        raise _fail(directory, f"{where} lacks the integer field {missing[0]!r}")
    sizes = {f: _positive_int(fields[f], prefix + f, directory) for f in _REQUIRED_LLAMA_FIELDS}
    for name in _OPTIONAL_LLAMA_FIELDS:
        if fields.get(name) is not None:
            _positive_int(fields[name], prefix + name, directory)
    num_layers = 1
    if layout == "speculators":
        num_layers = _positive_int(fields.get("num_hidden_layers", 1), prefix + "num_hidden_layers", directory)
    draft_vocab = _positive_int(raw.get("draft_vocab_size") or sizes["vocab_size"], "draft_vocab_size", directory)
    target_hidden = _positive_int(raw.get("target_hidden_size") or sizes["hidden_size"], "target_hidden_size", directory)
    _check_sizes(fields, sizes, draft_vocab, prefix, directory)
    if layers is not None and not (isinstance(layers, list) and layers and all(isinstance(i, int) for i in layers)):
        raise _fail(directory, f"eagle_aux_hidden_state_layer_ids must be a list of layer numbers, got {layers!r}")
    try:
        llama = LlamaConfig(**{k: v for k, v in fields.items() if k not in ("architectures", "auto_map")})
    except Exception as exc:  # transformers' strict config validation raises several types
        raise _fail(directory, f"not a valid Llama config: {' '.join(str(exc).split())}") from None
    return Eagle3HeadConfig(
        llama=llama,
        draft_vocab_size=draft_vocab,
        target_hidden_size=target_hidden,
        num_fused_layers=len(layers) if layers else 3,
        norm_before_residual=bool(raw.get("norm_before_residual", False)),
        norm_before_fc=bool(raw.get("norm_before_fc", False)),
        layers_to_capture=tuple(sorted(layers)) if layers else None,
        num_layers=num_layers,
    )


def _positive_int(value: Any, field: str, directory: Path) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _fail(directory, f"{field} must be a positive integer, got {value!r}")
    return value


def _check_sizes(fields: dict[str, Any], sizes: dict[str, int], draft_vocab: int, prefix: str, directory: Path) -> None:
    """A vocabulary of a real size, and sizes that must agree: the two vocabularies, and the
    attention heads with each other and with the width."""
    vocab, heads = sizes["vocab_size"], sizes["num_attention_heads"]
    if vocab > MAX_VOCAB_SIZE:
        raise _fail(directory, f"{prefix}vocab_size {vocab} is not a real vocabulary (the limit is {MAX_VOCAB_SIZE})")
    if draft_vocab > vocab:
        raise _fail(directory, f"draft_vocab_size {draft_vocab} exceeds the target vocabulary ({prefix}vocab_size {vocab})")
    kv_heads = fields.get("num_key_value_heads") or heads
    if heads % kv_heads:
        raise _fail(directory, f"{prefix}num_key_value_heads {kv_heads} does not divide num_attention_heads {heads}")
    hidden = sizes["hidden_size"]
    if fields.get("head_dim") is None and hidden % heads:
        raise _fail(directory, f"{prefix}num_attention_heads {heads} does not divide hidden_size {hidden} (and no head_dim)")


def _read_tensors(directory: Path) -> dict[str, torch.Tensor]:
    shards = sorted(directory.glob("*.safetensors"))
    bins = sorted(directory.glob("pytorch_model*.bin"))
    if not shards and not bins:
        raise _fail(directory, "no model.safetensors or pytorch_model.bin")
    tensors: dict[str, torch.Tensor] = {}
    try:
        for file in shards:
            tensors.update(load_file(str(file)))
        if not shards:
            for file in bins:
                tensors.update(torch.load(file, map_location="cpu", weights_only=True))
    except Exception as exc:  # safetensors and pickle raise many types for a damaged file
        raise _fail(directory, f"cannot read weights: {type(exc).__name__}: {exc}") from None
    return tensors


def _from_speculators(name: str) -> str:
    """``layers.0.x`` -> ``midlayer.x``; ``layers.i.x`` -> ``later_layers.{i - 1}.x``."""
    match = _SPECULATORS_LAYERS.match(name)
    if match is None:
        return name
    index, rest = int(match.group(1)), name[match.end() :]
    return _MIDLAYER + rest if index == 0 else f"later_layers.{index - 1}.{rest}"


def _to_speculators(name: str) -> str:
    if name.startswith(_MIDLAYER):
        return _SPECULATORS_LAYER + name[len(_MIDLAYER) :]
    match = _LATER_LAYERS.match(name)
    return f"layers.{int(match.group(1)) + 1}.{name[match.end():]}" if match else name


def _infer_fused_layers(config: Eagle3HeadConfig, tensors: dict[str, torch.Tensor]) -> None:
    """Without recorded layers, ``fc.weight``'s width tells how many target layers it fuses (usually 3)."""
    fc = tensors.get("fc.weight")
    if config.layers_to_capture is None and fc is not None and fc.dim() == 2:
        count, rest = divmod(int(fc.shape[1]), config.target_hidden_size)
        if count and not rest:
            config.num_fused_layers = count


def _check_finite(tensors: dict[str, torch.Tensor], directory: Path, shown: Callable[[str], str]) -> None:
    """NaN or infinite weights would not fail anywhere: they would only draft garbage. The minimum
    and maximum are non-finite exactly when some value is, and cost a fraction of ``isfinite``."""
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and tensor.numel() and not all(map(math.isfinite, torch.aminmax(tensor))):
            bad = int((~torch.isfinite(tensor)).sum())
            raise _fail(directory, f"tensor {shown(name)!r} holds {bad} NaN or infinite value(s)")


def _check_layer_count(config: Eagle3HeadConfig, tensors: dict[str, torch.Tensor], directory: Path) -> None:
    """More decoder layers than the checkpoint has tensors for is refused before any is built."""
    held = 1 + max((int(m.group(1)) + 1 for n in tensors if (m := _LATER_LAYERS.match(n))), default=0)
    if config.num_layers > held:
        raise _fail(
            directory,
            f"transformer_layer_config.num_hidden_layers is {config.num_layers} but the checkpoint holds tensors "
            f"of {held} decoder layer{'s' if held > 1 else ''} (layers.0-{held - 1})",
        )


def _implied_tensors(config: Eagle3HeadConfig, with_embedding: bool) -> dict[str, torch.Tensor]:
    """The tensors config.json implies: the head's state built on the meta device (shapes, no memory)."""
    with torch.device("meta"):
        return Eagle3Head(config, with_embedding=with_embedding).state_dict()


def _sized_by(name: str, config: Eagle3HeadConfig) -> str:
    """The config.json fields that set tensor ``name``'s shape, with their values."""
    llama, hidden = config.llama, f"hidden_size {config.hidden_size}"
    if name.startswith(("fc.", "input_norm.")):
        fields = [hidden, f"target_hidden_size {config.target_hidden_size}", f"{config.num_fused_layers} fused layers"]
    elif ".mlp." in name:
        fields = [hidden, f"intermediate_size {llama.intermediate_size}"]
    elif ".self_attn." in name:
        kv_heads = llama.num_key_value_heads or llama.num_attention_heads
        fields = [hidden, f"num_attention_heads {llama.num_attention_heads}", f"num_key_value_heads {kv_heads}",
                  f"head_dim {config.head_dim}"]
    elif name.startswith("lm_head."):
        fields = [hidden, f"draft_vocab_size {config.draft_vocab_size}"]
    elif name.startswith("embed_tokens."):
        fields = [hidden, f"vocab_size {config.vocab_size}"]
    elif name in _DERIVED_TENSORS:
        fields = [f"draft_vocab_size {config.draft_vocab_size}" if name == "d2t" else f"vocab_size {config.vocab_size}"]
    else:  # the norms
        fields = [hidden]
    return ", ".join(fields)


def _default_vocab_maps(tensors: dict[str, torch.Tensor], config: Eagle3HeadConfig, directory: Path) -> None:
    """A head over the full target vocabulary may omit ``d2t``/``t2d``; a compressed one may not."""
    if "d2t" not in tensors:
        if config.draft_vocab_size != config.vocab_size:
            raise _fail(
                directory,
                f"missing tensor 'd2t' (needed to map the {config.draft_vocab_size}-token draft vocabulary "
                f"to the {config.vocab_size}-token target vocabulary)",
            )
        tensors["d2t"] = torch.zeros(config.draft_vocab_size, dtype=torch.long)
    if "t2d" not in tensors and tensors["d2t"].shape == (config.draft_vocab_size,):
        t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
        targets = torch.arange(config.draft_vocab_size) + tensors["d2t"].long()
        t2d[targets.clamp(0, config.vocab_size - 1)] = True
        tensors["t2d"] = t2d


def _check_tensors(
    config: Eagle3HeadConfig,
    expected: dict[str, torch.Tensor],
    tensors: dict[str, torch.Tensor],
    directory: Path,
    shown: Callable[[str], str],
) -> None:
    """Shapes and names against what the config implies (``expected``), so the head allocates
    exactly what the checkpoint holds; ``shown`` gives a tensor's name as the checkpoint spells it."""
    for name, want in expected.items():
        got = tensors.get(name)
        if got is not None and tuple(got.shape) != tuple(want.shape):
            raise _fail(
                directory,
                f"tensor {shown(name)!r} has shape {list(got.shape)} but config.json implies {list(want.shape)} "
                f"({_sized_by(name, config)})",
            )
    missing = sorted(set(expected) - set(tensors) - set(_DERIVED_TENSORS))
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise _fail(directory, f"missing tensor {shown(missing[0])!r}{more}")
    unexpected = sorted(set(tensors) - set(expected))
    if unexpected:
        layers = config.num_layers
        raise _fail(directory, f"unexpected tensor {shown(unexpected[0])!r}: not part of a {layers}-layer EAGLE-3 head")


def _check_vocab_maps(head: Eagle3Head, directory: Path) -> None:
    targets = head.draft_to_target()
    vocab = head.config.vocab_size
    if bool((targets < 0).any() or (targets >= vocab).any()):
        raise _fail(directory, f"d2t maps draft ids outside the target vocabulary [0, {vocab})")
    if targets.unique().numel() != targets.numel():
        raise _fail(directory, "d2t maps two draft ids to the same target id")


# -- writing -------------------------------------------------------------------------------------


def _llama_fields(config: Eagle3HeadConfig) -> dict[str, Any]:
    """The decoder layer's Llama config with the classic field names every reader understands."""
    llama = config.llama
    rope = dict(getattr(llama, "rope_parameters", None) or {})
    rope_theta = rope.pop("rope_theta", getattr(llama, "rope_theta", 10000.0))
    rope_scaling = rope if rope.get("rope_type", "default") != "default" else None
    return {
        "model_type": "llama",
        "hidden_size": config.hidden_size,
        "intermediate_size": int(llama.intermediate_size),
        "num_attention_heads": int(llama.num_attention_heads),
        "num_key_value_heads": int(llama.num_key_value_heads or llama.num_attention_heads),
        "head_dim": config.head_dim,
        "num_hidden_layers": config.num_layers,
        "hidden_act": llama.hidden_act,
        "rms_norm_eps": float(llama.rms_norm_eps),
        "max_position_embeddings": int(llama.max_position_embeddings),
        "rope_theta": float(rope_theta),
        "rope_scaling": rope_scaling,
        "attention_bias": bool(getattr(llama, "attention_bias", False)),
        "mlp_bias": bool(getattr(llama, "mlp_bias", False)),
        "vocab_size": config.vocab_size,
        "tie_word_embeddings": False,
        "bos_token_id": llama.bos_token_id,
        "eos_token_id": llama.eos_token_id,
        "pad_token_id": llama.pad_token_id,
    }


def _dtype_name(head: Eagle3Head) -> str:
    return str(head.fc.weight.dtype).removeprefix("torch.")


def _safeailab_config(head: Eagle3Head) -> dict[str, Any]:
    c = head.config
    config = {"architectures": ["LlamaForCausalLM"], **_llama_fields(c), "draft_vocab_size": c.draft_vocab_size}
    if c.target_hidden_size != c.hidden_size:
        config["target_hidden_size"] = c.target_hidden_size
    if c.norm_before_residual:
        config["norm_before_residual"] = True
    if c.layers_to_capture is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(c.layers_to_capture)}
    config["torch_dtype"] = _dtype_name(head)
    return config


def _speculators_config(
    head: Eagle3Head, verifier: str | None, verifier_architectures: tuple[str, ...], speculative_tokens: int
) -> dict[str, Any]:
    c = head.config
    config: dict[str, Any] = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "draft_vocab_size": c.draft_vocab_size,
        "norm_before_residual": c.norm_before_residual,
        "target_hidden_size": c.target_hidden_size if c.target_hidden_size != c.hidden_size else None,
        "eagle_aux_hidden_state_layer_ids": list(c.layers_to_capture) if c.layers_to_capture is not None else None,
        "transformer_layer_config": _llama_fields(c),
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {"proposal_type": "greedy", "speculative_tokens": speculative_tokens, "verifier_accept_k": 1, "accept_tolerance": 0.0}
            ],
            "verifier": {"name_or_path": verifier, "architectures": list(verifier_architectures)},
        },
        "torch_dtype": _dtype_name(head),
    }
    if c.norm_before_fc:
        config["norm_before_fc"] = True
    return config
