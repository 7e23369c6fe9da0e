"""Read MTP layers from safetensors files in DeepSeek-V3's published layout, for any target.

For ``num_nextn_predict_layers = n`` the layers are ``model.layers.{L}`` .. ``model.layers.{L+n-1}``
(``L = num_hidden_layers``), beside the main weights: transformers drops them when it loads the
model, so they are read here, honoring ``model.safetensors.index.json`` when the checkpoint is
sharded. Each holds ``enorm``, ``hnorm``, ``eh_proj``, a decoder block of the target's own kind
under the block's own tensor names (its ``self_attn``, ``mlp``, ``input_layernorm``,
``post_attention_layernorm``; DeepSeek's routed experts one by one as
``mlp.experts.{e}.{gate,up,down}_proj``), ``shared_head.norm``, ``shared_head.head`` and
optionally ``embed_tokens`` (else the target's is used). A Llama target's layers (``specdec
train mtp``) are stored the same way, with ``shared_head.head`` left out when the trainer was told
to (it is the target's frozen ``lm_head``; the target's is then used, as for ``embed_tokens``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import PretrainedConfig

from specdec import ModelLoadError
from specdec_mtp.layer import MTPLayer

INDEX_FILE = "model.safetensors.index.json"
_OWN = ("enorm.", "hnorm.", "eh_proj.", "shared_head.", "embed_tokens.")


def _tensor_files(directory: Path, prefixes: list[str]) -> dict[str, Path]:
    """Checkpoint tensor name -> file, for every tensor under one of ``prefixes``."""
    index = directory / INDEX_FILE
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: directory / file for name, file in weight_map.items() if name.startswith(tuple(prefixes))}
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"MTP layers: no safetensors files in {directory}")
    found: dict[str, Path] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            found.update({name: file for name in handle.keys() if name.startswith(tuple(prefixes))})
    return found


def _read(files: dict[str, Path]) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(set(files.values())):
        with safe_open(str(file), framework="pt") as handle:
            for name in (n for n, f in files.items() if f == file):
                tensors[name] = handle.get_tensor(name)
    return tensors


def mtp_tensor_names(layer: MTPLayer, index: int) -> dict[str, str]:
    """Checkpoint name -> parameter name of ``layer`` (stored as MTP layer ``index``), fused experts excluded."""
    names = {}
    for param in layer.state_dict():
        if param.startswith("block.mlp.experts."):
            continue
        stored = param.removeprefix("block.") if not param.startswith(_OWN) else param
        names[f"model.layers.{index}.{stored}"] = param
    return names


def _fuse_experts(tensors: dict[str, torch.Tensor], prefix: str, count: int, source: str) -> dict[str, torch.Tensor]:
    """Per-expert ``gate/up/down_proj`` -> transformers' fused ``gate_up_proj`` / ``down_proj``."""
    def get(name: str) -> torch.Tensor:
        if name not in tensors:
            raise ModelLoadError(f"MTP layers in {source}: missing tensor {name}")
        return tensors[name]

    experts = [f"{prefix}mlp.experts.{e}." for e in range(count)]
    gate_up = [torch.cat((get(e + "gate_proj.weight"), get(e + "up_proj.weight"))) for e in experts]
    down = [get(e + "down_proj.weight") for e in experts]
    return {"block.mlp.experts.gate_up_proj": torch.stack(gate_up), "block.mlp.experts.down_proj": torch.stack(down)}


def load_mtp_layers(directory: str | Path, config: PretrainedConfig, count: int) -> list[MTPLayer]:
    """The ``count`` MTP layers stored in ``directory`` for a target of ``config``, float32 on the CPU."""
    directory = Path(directory)
    first = int(config.num_hidden_layers)
    indices = range(first, first + count)
    files = _tensor_files(directory, [f"model.layers.{i}." for i in indices])
    tensors = _read(files)
    layers = []
    for index in indices:
        prefix = f"model.layers.{index}."
        layer = MTPLayer(config, index, with_embedding=f"{prefix}embed_tokens.weight" in tensors,
                         with_head=f"{prefix}shared_head.head.weight" in tensors)
        wanted = layer.state_dict()
        state: dict[str, torch.Tensor] = {}
        for stored, param in mtp_tensor_names(layer, index).items():
            if stored not in tensors:
                raise ModelLoadError(f"MTP layers in {directory}: missing tensor {stored} (MTP layer {index - first} of {count})")
            state[param] = tensors[stored]
        if "block.mlp.experts.gate_up_proj" in wanted:
            state.update(_fuse_experts(tensors, prefix, int(config.n_routed_experts), str(directory)))
        for param, tensor in state.items():
            if tuple(tensor.shape) != tuple(wanted[param].shape):
                stored = prefix + (param.removeprefix("block.") if param.startswith("block.") else param)
                raise ModelLoadError(
                    f"MTP layers in {directory}: tensor {stored} has shape {list(tensor.shape)}, "
                    f"expected {list(wanted[param].shape)}"
                )
        layer.load_state_dict({k: v.float() for k, v in state.items()})
        layers.append(layer.eval())
    return layers


def mtp_layer_tensors(layer: MTPLayer, index: int) -> dict[str, torch.Tensor]:
    """``layer``'s tensors as DeepSeek-V3 stores MTP layer ``index`` (the inverse of loading), routed
    experts split one by one."""
    state = layer.state_dict()
    tensors = {stored: state[param].detach().contiguous() for stored, param in mtp_tensor_names(layer, index).items()}
    if "block.mlp.experts.gate_up_proj" in state:
        gate_up, down = state["block.mlp.experts.gate_up_proj"], state["block.mlp.experts.down_proj"]
        half = gate_up.shape[1] // 2
        for e in range(gate_up.shape[0]):
            prefix = f"model.layers.{index}.mlp.experts.{e}."
            tensors[prefix + "gate_proj.weight"] = gate_up[e, :half].contiguous()
            tensors[prefix + "up_proj.weight"] = gate_up[e, half:].contiguous()
            tensors[prefix + "down_proj.weight"] = down[e].contiguous()
    return tensors
