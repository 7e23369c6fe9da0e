"""Tiny Medusa heads for tests, fitted to the tiny target and written in each published layout.

Random heads' drafts are almost never accepted, which would leave the conformance suite nothing
to check. :func:`fitted_heads` trains heads the way Medusa-1 does (frozen target: head ``k`` at
position ``t`` learns the target's distribution ``k + 1`` positions further) on text the tiny
target writes itself, so drafts are right often but not always. The writers lay the tensors out
exactly as FasterDecoding and vLLM publish them. Fitted heads are memoized per target weights.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from specdec.testing.tiny import target_text
from specdec_medusa.heads import MedusaHeads


def fitted_heads(target_model: torch.nn.Module, num_heads: int = 3, num_layers: int = 1, steps: int = 120, seed: int = 0) -> MedusaHeads:
    """Heads trained on the target's own text; fitted on the CPU whatever the target's device."""
    model = copy.deepcopy(target_model).cpu().float()
    fingerprint = tuple(round(float(p.detach().double().sum()), 6) for p in model.parameters())
    key = (fingerprint, num_heads, num_layers, steps, seed)
    if key not in _FITTED:
        _FITTED[key] = _fit(model, num_heads, num_layers, steps, seed)
    return copy.deepcopy(_FITTED[key])


_FITTED: dict[tuple, MedusaHeads] = {}


def _fit(model: torch.nn.Module, num_heads: int, num_layers: int, steps: int, seed: int) -> MedusaHeads:
    generator = torch.Generator().manual_seed(seed)
    ids = target_text(model, num=16, length=40, generator=generator)
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
        hidden = out.hidden_states[-1]
        target_probs = out.logits.softmax(-1)
    torch.manual_seed(seed)
    config = model.config
    heads = MedusaHeads(num_heads, num_layers, config.hidden_size, config.vocab_size)
    optimizer = torch.optim.Adam(heads.parameters(), lr=1e-2)
    span = ids.shape[1] - num_heads
    for _ in range(steps):
        logits = heads(hidden[:, :span].reshape(-1, config.hidden_size))
        loss = 0.0
        for k in range(num_heads):
            want = target_probs[:, 1 + k : 1 + k + span].reshape(-1, config.vocab_size)
            loss = loss - (want * logits[k].log_softmax(-1)).sum(-1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return heads.eval()


def fasterdecoding_tensors(heads: MedusaHeads) -> dict[str, torch.Tensor]:
    """``{i}.{j}.linear.weight/bias`` and ``{i}.{num_layers}.weight``, as FasterDecoding saves them."""
    tensors = {}
    for i, (block, lm_head) in enumerate(zip(heads.blocks, heads.lm_heads)):
        for j, layer in enumerate(block):
            tensors[f"{i}.{j}.linear.weight"] = layer.linear.weight.detach().clone()
            tensors[f"{i}.{j}.linear.bias"] = layer.linear.bias.detach().clone()
        tensors[f"{i}.{len(block)}.weight"] = lm_head.weight.detach().clone()
    return tensors


def save_fasterdecoding(heads: MedusaHeads, directory: Path, weights_format: str = "safetensors") -> Path:
    """``config.json`` and ``medusa_lm_head.safetensors`` (or ``.pt``) in FasterDecoding's layout."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {"medusa_num_heads": heads.num_heads, "medusa_num_layers": len(heads.blocks[0]),
              "base_model_name_or_path": "tiny-target"}
    (directory / "config.json").write_text(json.dumps(config))
    tensors = fasterdecoding_tensors(heads)
    if weights_format == "pt":
        torch.save(tensors, directory / "medusa_lm_head.pt")
    else:
        save_file(tensors, str(directory / "medusa_lm_head.safetensors"))
    return directory


def save_vllm(heads: MedusaHeads, directory: Path, token_map: torch.Tensor | None = None) -> Path:
    """``config.json`` and ``model.safetensors`` in vLLM's layout (``medusa_fc_bias`` true, since
    these heads have biases); with ``token_map``, the projections are cut to those tokens."""
    directory.mkdir(parents=True, exist_ok=True)
    hidden = heads.lm_heads[0].in_features
    vocab = heads.lm_heads[0].out_features
    config = {"model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": hidden, "vocab_size": vocab,
              "num_heads": heads.num_heads, "num_hidden_layers": len(heads.blocks[0]), "medusa_fc_bias": True,
              "truncated_vocab_size": vocab if token_map is None else len(token_map)}
    (directory / "config.json").write_text(json.dumps(config))
    tensors = {}
    for h, (block, lm_head) in enumerate(zip(heads.blocks, heads.lm_heads)):
        for layer_index, layer in enumerate(block):
            tensors[f"blocks.{h}.layers.{layer_index}.weight"] = layer.linear.weight.detach().clone()
            tensors[f"blocks.{h}.layers.{layer_index}.bias"] = layer.linear.bias.detach().clone()
        weight = lm_head.weight.detach()
        tensors[f"lm_heads.{h}.weight"] = (weight if token_map is None else weight[token_map]).clone()
    if token_map is not None:
        tensors["token_map"] = token_map.clone()
    save_file(tensors, str(directory / "model.safetensors"))
    return directory
