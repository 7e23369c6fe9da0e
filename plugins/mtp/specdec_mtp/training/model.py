"""New MTP layers for a target that has none, their trainable weights, and export in DeepSeek-V3's layout.

A new layer starts as the target's own next-token predictor, as a new Medusa head does: its
block is a copy of the target's last decoder layer with the output projections of its attention
and MLP zeroed (so the block starts as the identity, the usual zero-init of a residual branch,
while its other weights keep the target's features), ``shared_head`` is the target's final norm
and its (frozen, shared) ``lm_head``, ``enorm`` / ``hnorm`` start at ones, and ``eh_proj`` ignores
the embedding and maps the previous state ``h0 = w * rmsnorm(x)`` (``w`` the final norm's weight)
to ``rmsnorm(h0) / w``, a multiple of ``x``, so that ``shared_head`` gives back exactly the target's
logits. Training then teaches it to mix in the next token's embedding and predict one token
further. (A verbatim copy of the block is a poor start: it adds outputs sized for the residual
stream to a unit-scale input, and SmolLM2's first loss is then 24 nats.)

Two export layouts, both DeepSeek-V3's names (``model.layers.{L+k}.*``, ``L = num_hidden_layers``):
a directory holding only the layers and the target's ``config.json`` with
``num_nextn_predict_layers`` (the MTP plugin's ``speculative_model``), and, with
``--into-target-copy``, a full copy of the target whose checkpoint holds them in a shard of their
own, as DeepSeek ships them (loaded with no ``speculative_model``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from specdec import ConfigError, ModelLoadError
from specdec_mtp.checkpoint import INDEX_FILE, load_mtp_layers, mtp_layer_tensors
from specdec_mtp.layer import MTPLayer

WEIGHTS_FILE = "model.safetensors"
#: The shard a target copy's MTP layers go into, beside the target's own.
MTP_SHARD = "model-mtp.safetensors"


def new_layers(target: Any, count: int) -> nn.ModuleList:
    """``count`` float32 MTP layers for ``target`` (a ``*ForCausalLM``), sharing one frozen float32
    copy of its ``lm_head``."""
    config, decoder = target.config, target.get_decoder()
    first = int(config.num_hidden_layers)
    lm_head = nn.Parameter(target.get_output_embeddings().weight.detach().float().clone(), requires_grad=False)
    hidden = int(config.hidden_size)
    layers = nn.ModuleList()
    for k in range(count):
        layer = MTPLayer(config, first + k)
        with torch.no_grad():
            layer.block.load_state_dict({n: t.float() for n, t in decoder.layers[-1].state_dict().items()})
            for name, param in layer.block.named_parameters():
                if name.startswith("self_attn.o_proj.") or "down_proj" in name:  # experts' too
                    param.zero_()
            norm = decoder.norm.weight.detach().float()
            layer.shared_head.norm.weight.copy_(norm)
            layer.enorm.weight.fill_(1.0)
            layer.hnorm.weight.fill_(1.0)
            layer.eh_proj.weight.zero_()
            layer.eh_proj.weight[:, hidden:].copy_(torch.diag(1 / _away_from_zero(norm)))
        layer.shared_head.head.weight = lm_head
        layers.append(layer.float())
    return layers


def start_from(layers: nn.ModuleList, directory: str | Path, config: Any) -> None:
    """Set the trainable weights of ``layers`` to the first ``len(layers)`` MTP layers stored in
    ``directory`` (DeepSeek-V3's layout: an earlier run's export, or a DeepSeek checkpoint); the
    shared ``lm_head`` stays the target's."""
    try:
        stored = load_mtp_layers(directory, config, len(layers))
    except ModelLoadError as error:
        raise ConfigError(f"--init-from: {error}") from None
    for layer, source in zip(layers, stored):  # load_mtp_layers checked every tensor is there
        wanted = {name for name, p in layer.named_parameters() if p.requires_grad}
        layer.load_state_dict({name: t for name, t in source.state_dict().items() if name in wanted}, strict=False)


def _away_from_zero(weight: torch.Tensor, least: float = 1e-3) -> torch.Tensor:
    """``weight`` with entries closer to 0 than ``least`` set to ``+-least`` (it is inverted)."""
    return torch.where(weight.abs() < least, torch.where(weight < 0, -least, least), weight)


def trainable_state(layers: nn.ModuleList) -> dict[str, torch.Tensor]:
    """The weights training changes (everything but the shared, frozen ``lm_head``), by name."""
    return {name: p for name, p in layers.named_parameters() if p.requires_grad}


def deepseek_tensors(layers: nn.ModuleList, first: int, dtype: torch.dtype, with_head: bool = True) -> dict[str, torch.Tensor]:
    """Every layer's tensors as ``model.layers.{first + k}.*``, cast to ``dtype`` (each a tensor of
    its own: the shared ``lm_head`` is written once per layer, as DeepSeek ships it, unless
    ``with_head`` is false: then ``shared_head.head`` is left out and the plugin uses the target's)."""
    return {name: t.to(dtype).clone() for k, layer in enumerate(layers)
            for name, t in mtp_layer_tensors(layer, first + k).items()
            if with_head or not name.endswith(".shared_head.head.weight")}


def export(layers: nn.ModuleList, target_config: Any, output: str | Path, dtype: torch.dtype, base_model: str,
           with_head: bool = True) -> None:
    """Write ``model.safetensors`` (the layers only; ``with_head``: :func:`deepseek_tensors`) and the
    target's ``config.json`` with ``num_nextn_predict_layers`` and ``base_model_name_or_path`` to ``output``."""
    directory = Path(output)
    directory.mkdir(parents=True, exist_ok=True)
    first = int(target_config.num_hidden_layers)
    save_file(deepseek_tensors(layers, first, dtype, with_head), str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    config = {**target_config.to_dict(), "num_nextn_predict_layers": len(layers), "base_model_name_or_path": base_model}
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def export_into_target_copy(layers: nn.ModuleList, target: Any, tokenizer: Any, output: str | Path,
                            dtype: torch.dtype) -> None:
    """A full copy of ``target`` (safetensors, in the dtype it was loaded in) in ``output`` whose
    checkpoint also holds the layers (``dtype``) in :data:`MTP_SHARD`, named by
    ``model.safetensors.index.json``, and whose ``config.json`` sets ``num_nextn_predict_layers``."""
    directory = Path(output)
    target.save_pretrained(directory)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
    index_path = directory / INDEX_FILE
    if index_path.is_file():
        index = json.loads(index_path.read_text())
    else:
        # One file: name its tensors in an index, which the MTP shard then joins.
        single = directory / WEIGHTS_FILE
        main = "model-main.safetensors"
        single.rename(directory / main)
        with safe_open(str(directory / main), framework="pt") as handle:
            index = {"metadata": {}, "weight_map": {name: main for name in handle.keys()}}
    mtp = deepseek_tensors(layers, int(target.config.num_hidden_layers), dtype)
    save_file(mtp, str(directory / MTP_SHARD), metadata={"format": "pt"})
    index["weight_map"].update({name: MTP_SHARD for name in mtp})
    index_path.write_text(json.dumps(index, indent=2) + "\n")
    config = json.loads((directory / "config.json").read_text())
    config["num_nextn_predict_layers"] = len(layers)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
