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
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig

from specdec.errors import ConfigError, ModelLoadError
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


def detect_layout(config: dict[str, Any]) -> Layout:
    return "speculators" if "speculators_model_type" in config else "safeailab"


def load_head(path: str | Path) -> Eagle3Head:
    """Load an EAGLE-3 head from a checkpoint directory in either layout (float32, on CPU)."""
    directory = Path(path)
    raw = _read_config(directory)
    layout = detect_layout(raw)
    config = _head_config(raw, layout, directory)
    tensors = _read_tensors(directory)
    if layout == "speculators":
        tensors = {_from_speculators(name): t for name, t in tensors.items()}
    elif any(n.startswith(_SPECULATORS_LAYER) for n in tensors) and not any(n.startswith(_MIDLAYER) for n in tensors):
        raise _fail(directory, "tensors named layers.0.* without a speculators config: an EAGLE-1/2 head, not EAGLE-3")
    tensors = {n: t for n, t in tensors.items() if not n.startswith(_IGNORED_PREFIXES)}
    config.fc_bias = "fc.bias" in tensors
    _infer_fused_layers(config, tensors)
    _default_vocab_maps(tensors, config, directory)
    head = Eagle3Head(config, with_embedding="embed_tokens.weight" in tensors)
    _check_tensors(head, tensors, directory, _to_speculators if layout == "speculators" else str)
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
    missing = [f for f in _REQUIRED_LLAMA_FIELDS if not isinstance(fields.get(f), int)]
    if missing:
        where = "transformer_layer_config" if layout == "speculators" else "config.json"
        raise _fail(directory, f"{where} lacks the integer field {missing[0]!r}")
    num_layers = fields.get("num_hidden_layers", 1) if layout == "speculators" else 1
    if not isinstance(num_layers, int) or isinstance(num_layers, bool) or num_layers < 1:
        raise _fail(directory, f"transformer_layer_config.num_hidden_layers must be a positive integer, got {num_layers!r}")
    if layers is not None and not (isinstance(layers, list) and layers and all(isinstance(i, int) for i in layers)):
        raise _fail(directory, f"eagle_aux_hidden_state_layer_ids must be a list of layer numbers, got {layers!r}")
    llama = LlamaConfig(**{k: v for k, v in fields.items() if k not in ("architectures", "auto_map")})
    hidden = int(fields["hidden_size"])
    return Eagle3HeadConfig(
        llama=llama,
        draft_vocab_size=int(raw.get("draft_vocab_size") or fields["vocab_size"]),
        target_hidden_size=int(raw.get("target_hidden_size") or hidden),
        num_fused_layers=len(layers) if layers else 3,
        norm_before_residual=bool(raw.get("norm_before_residual", False)),
        norm_before_fc=bool(raw.get("norm_before_fc", False)),
        layers_to_capture=tuple(sorted(layers)) if layers else None,
        num_layers=num_layers,
    )


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


def _check_tensors(head: Eagle3Head, tensors: dict[str, torch.Tensor], directory: Path, shown: Callable[[str], str]) -> None:
    """Shapes and names against the config; ``shown`` gives a tensor's name as the checkpoint spells it."""
    expected = head.state_dict()
    for name, want in expected.items():
        got = tensors.get(name)
        if got is not None and tuple(got.shape) != tuple(want.shape):
            raise _fail(
                directory,
                f"tensor {shown(name)!r} has shape {list(got.shape)} but config.json implies {list(want.shape)} "
                f"(hidden_size {head.config.hidden_size}, target_hidden_size {head.config.target_hidden_size}, "
                f"{head.config.num_fused_layers} fused layers, draft_vocab_size {head.config.draft_vocab_size})",
            )
    missing = sorted(set(expected) - set(tensors))
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise _fail(directory, f"missing tensor {shown(missing[0])!r}{more}")
    unexpected = sorted(set(tensors) - set(expected))
    if unexpected:
        layers = head.config.num_layers
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
