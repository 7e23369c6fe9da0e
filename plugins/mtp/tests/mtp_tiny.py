"""Tiny targets (DeepSeek-V3, or Llama for MTP on other architectures) saved with MTP layers in
DeepSeek-V3's published layout, for tests.

Random MTP layers almost never draft the target's tokens, which would leave the conformance
suite nothing to check, so :func:`fitted_layers` fits them briefly the way DeepSeek trains them:
depth ``k`` at position ``i`` reads depth ``k - 1``'s output (the target's final state for
``k = 1``) and token ``i + k``, and learns the target's own distribution of token ``i + k + 1``,
on text the target writes itself. Saved targets are memoized per layer count and architecture.
"""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch.nn import functional as F
from transformers import AutoModelForCausalLM

from specdec.testing.architectures import make_tiny_model
from specdec.testing.device import device_under_test
from specdec.testing.tiny import TinyTarget, tiny_tokenizer
from specdec.testing.tiny import target_text as tiny_target_text
from specdec_mtp import MTPLayer, mtp_layer_tensors
from specdec_mtp.layer import LatentCache


def target_text(model: torch.nn.Module, num: int = 16, length: int = 20, seed: int = 0) -> torch.Tensor:
    """``num`` sequences the target writes from random 4-token prompts (see :func:`specdec.testing.tiny.target_text`)."""
    return tiny_target_text(model, num, length, torch.Generator().manual_seed(seed), prompt_len=4)


def run_layer(layer: MTPLayer, embed: torch.nn.Module, rotary: torch.nn.Module, previous: torch.Tensor,
              tokens: torch.Tensor) -> torch.Tensor:
    """One depth over whole sequences (no cache kept): ``previous`` ``[B, T, H]``, ``tokens`` ``[B, T]``."""
    positions = torch.arange(tokens.shape[1])[None]
    embeds = (layer.embed_tokens or embed)(tokens)
    return layer(embeds, previous, positions, rotary(embeds, positions), LatentCache())


def _silence_block(layer: MTPLayer, scale: float) -> None:
    """Scale the block's output projections (attention, dense or shared and routed experts) by ``scale``."""
    block = layer.block
    outputs = [block.self_attn.o_proj.weight]
    mlp = block.mlp
    if hasattr(mlp, "experts"):
        outputs += [mlp.experts.down_proj, mlp.shared_experts.down_proj.weight]
    else:
        outputs.append(mlp.down_proj.weight)
    for weight in outputs:
        weight.mul_(scale)


@torch.no_grad()
def initialized(layer: MTPLayer) -> MTPLayer:
    """Random weights as transformers initializes them (fused experts and the router start uninitialized)."""
    for name, param in layer.named_parameters():
        if param.dim() == 1:
            param.fill_(1.0)
        else:
            param.normal_(0.0, 0.02)
    for buffer in layer.buffers():
        buffer.zero_()
    return layer


def fitted_layers(model: torch.nn.Module, count: int, steps: int = 100, seed: int = 0) -> list[MTPLayer]:
    """``count`` MTP layers fitted in turn to ``model``'s own next-``k + 1`` distributions.

    Fitting whole decoder blocks takes minutes on a CPU, so the block's outputs are zeroed while
    ``eh_proj`` and the head are fitted (the block is then the identity), and set back to a small
    fraction of their random values afterwards: the block's attention (and its cache) and experts
    still change every output a little, and drafts stay right often but not always.
    """
    torch.manual_seed(seed)
    config, first = model.config, model.config.num_hidden_layers
    text = target_text(model)
    with torch.no_grad():
        out = model(text, output_hidden_states=True)
    target_logprobs = F.log_softmax(out.logits, dim=-1)
    previous = out.hidden_states[-1]
    embed, rotary = model.get_input_embeddings(), model.get_decoder().rotary_emb
    layers = []
    for k in range(1, count + 1):
        layer = initialized(MTPLayer(config, first + k - 1))
        span = text.shape[1] - k  # positions i whose token i + k exists
        with torch.no_grad():
            layer.shared_head.head.weight.copy_(model.get_output_embeddings().weight)
            saved = [p.detach().clone() for p in layer.block.parameters()]
            _silence_block(layer, 0.0)
            embeds = embed(text[:, k : k + span - 1])
        trained = [layer.enorm.weight, layer.hnorm.weight, layer.eh_proj.weight, layer.shared_head.norm.weight,
                   layer.shared_head.head.weight]
        optimizer = torch.optim.Adam(trained, lr=2e-2)
        for _ in range(steps):
            x = layer.eh_proj(torch.cat((layer.enorm(embeds), layer.hnorm(previous[:, : span - 1])), dim=-1))
            logprobs = F.log_softmax(layer.logits(x), dim=-1)
            loss = F.kl_div(logprobs, target_logprobs[:, k : k + span - 1], log_target=True, reduction="batchmean")
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            for param, value in zip(layer.block.parameters(), saved):
                param.copy_(value)
            _silence_block(layer, 0.05)
            layer.eval()
            previous = run_layer(layer, embed, rotary, previous[:, :span], text[:, k : k + span])
        layers.append(layer)
    return layers


def save_with_mtp(target: TinyTarget, layers: list[MTPLayer], directory: Path, sharded: bool) -> None:
    """Save ``target`` with ``layers`` as DeepSeek-V3 publishes them: MTP layers ``model.layers.{L}``..
    in the same file, or (``sharded``) in a second shard named by ``model.safetensors.index.json``."""
    target.model.save_pretrained(directory)
    target.tokenizer.save_pretrained(directory)
    first = target.model.config.num_hidden_layers
    mtp = {name: t for i, layer in enumerate(layers) for name, t in mtp_layer_tensors(layer, first + i).items()}
    main = load_file(directory / "model.safetensors")
    if sharded:
        (directory / "model.safetensors").unlink()
        files = {"model-00001-of-00002.safetensors": main, "model-00002-of-00002.safetensors": mtp}
        for name, tensors in files.items():
            save_file(tensors, directory / name, metadata={"format": "pt"})
        weight_map = {tensor: name for name, tensors in files.items() for tensor in tensors}
        (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    else:
        save_file({**main, **mtp}, directory / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((directory / "config.json").read_text())
    config["num_nextn_predict_layers"] = len(layers)
    (directory / "config.json").write_text(json.dumps(config))


@functools.cache
def saved_target(count: int, architecture: str = "deepseek_v3") -> Path:
    """A directory holding a tiny target with ``count`` fitted MTP layers (sharded when ``count > 1``)."""
    target = make_tiny_model(architecture)
    directory = Path(tempfile.mkdtemp(prefix=f"mtp{count}-{architecture}-"))
    save_with_mtp(target, fitted_layers(target.model, count), directory, sharded=count > 1)
    return directory


def load_target(count: int, device: str | torch.device | None = None, architecture: str = "deepseek_v3") -> TinyTarget:
    """The saved target loaded back as specdec loads a checkpoint (MTP layers dropped by
    transformers), on ``device`` (default: the device under test)."""
    model = AutoModelForCausalLM.from_pretrained(saved_target(count, architecture), dtype=torch.float32).eval()
    model.to(device or device_under_test())
    return TinyTarget(model, tiny_tokenizer())
