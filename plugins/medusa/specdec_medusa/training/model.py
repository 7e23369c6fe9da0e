"""New heads for a target, their trainable weights, and export in FasterDecoding's layout.

A new head starts as the target's own next-token predictor, as in Medusa: each residual block
starts at zero (``x + SiLU(0) = x``) and, with ``own`` projections, each head's projection is a
copy of the target's ``lm_head``. Training then moves it from predicting token ``t + 1`` toward
token ``t + k + 2``, a far better start than random weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from specdec_medusa.heads import MedusaHeads

WEIGHTS_FILE = "medusa_lm_head.safetensors"
#: config.json's key for heads without projections of their own (see :mod:`specdec_medusa.checkpoint`).
SHARED_KEY = "medusa_shared_lm_head"


def new_heads(num_heads: int, num_layers: int, target_lm_head: torch.Tensor, share_lm_head: bool) -> MedusaHeads:
    """Float32 heads for a target whose output weight is ``target_lm_head`` ``[vocab, hidden]``:
    sharing it (frozen) or each with a trainable copy."""
    vocab, hidden = target_lm_head.shape
    lm_head = target_lm_head.detach().float()
    heads = MedusaHeads(num_heads, num_layers, hidden, vocab, shared_lm_head=lm_head if share_lm_head else None)
    with torch.no_grad():
        for block in heads.blocks:
            for layer in block:
                layer.linear.weight.zero_()
                layer.linear.bias.zero_()
        if not share_lm_head:
            for projection in heads.lm_heads:
                projection.weight.copy_(lm_head)
    return heads


def trainable_state(heads: MedusaHeads) -> dict[str, torch.Tensor]:
    """The weights training changes (everything but a shared, frozen ``lm_head``), by name."""
    return {name: p for name, p in heads.named_parameters(remove_duplicate=False) if p.requires_grad}


def fasterdecoding_tensors(heads: MedusaHeads, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """``{i}.{j}.linear.weight/bias`` and, unless the heads use the target's ``lm_head``,
    ``{i}.{num_layers}.weight``, cast to ``dtype``."""
    tensors = {}
    for i, (block, projection) in enumerate(zip(heads.blocks, heads.lm_heads)):
        for j, layer in enumerate(block):
            tensors[f"{i}.{j}.linear.weight"] = layer.linear.weight.detach().to(dtype).contiguous()
            tensors[f"{i}.{j}.linear.bias"] = layer.linear.bias.detach().to(dtype).contiguous()
        if not heads.uses_target_lm_head:
            tensors[f"{i}.{len(block)}.weight"] = projection.weight.detach().to(dtype).contiguous()
    return tensors


def export(heads: MedusaHeads, output: str | Path, dtype: torch.dtype, base_model: str) -> None:
    """Write ``config.json`` and ``medusa_lm_head.safetensors`` in FasterDecoding's layout to
    ``output``; ``"medusa_shared_lm_head": true`` marks heads that use the target's ``lm_head``."""
    directory = Path(output)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(fasterdecoding_tensors(heads, dtype), str(directory / WEIGHTS_FILE))
    config = {"medusa_num_heads": heads.num_heads, "medusa_num_layers": len(heads.blocks[0]),
              "base_model_name_or_path": base_model, SHARED_KEY: heads.uses_target_lm_head,
              "hidden_size": heads.lm_heads[0].in_features, "vocab_size": heads.lm_heads[0].out_features,
              "torch_dtype": str(dtype).removeprefix("torch.")}
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
