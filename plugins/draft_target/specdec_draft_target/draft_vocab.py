"""A frequency-ranked draft vocabulary: the draft proposes only the target's most used tokens.

A small draft shares its target's output layer, and with a vocabulary of tens of thousands of
tokens that layer is a large share of each draft forward (SmolLM2's 49,152 x 576 is about 40% of
the shipped draft's time on a CPU). As FR-Spec does, the draft's output layer can keep only the
rows of the ``draft_vocab_size`` tokens the target's replies use most; the rest of the draft is
unchanged. Output stays lossless: greedy verification checks every draft against the target's
own choice, and sampled drafts carry the draft's distribution over the kept tokens (zero
elsewhere), which rejection sampling corrects to the target's exactly. What it costs is the
occasional token outside the kept set, which the draft can no longer propose.

The ranking comes from training conversations (``specdec train draft-vocab``): a safetensors
file holding ``token_ids``, every target token most used first.
"""

from __future__ import annotations

from pathlib import Path

import torch

from specdec.errors import ConfigError

RANKING = "token_ids"
SHIPPED_RANKING = Path(__file__).resolve().parent / "weights" / "smollm2-draft-vocab.safetensors"
#: What the shipped draft keeps when ``draft_vocab_size`` is unset: 97.9% of its training
#: replies' tokens, and an output layer 6x smaller than the full one.
SHIPPED_DRAFT_VOCAB_SIZE = 8192


def save_ranking(path: Path, ranking: torch.Tensor, reply_counts: torch.Tensor, metadata: dict[str, str]) -> None:
    """Write ``ranking`` (token ids, most used first) with the reply-token count of each id."""
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {RANKING: ranking.to(torch.int32).contiguous(), "reply_counts": reply_counts.to(torch.int32).contiguous()}
    save_file(tensors, str(path), metadata={"format": "pt", **metadata})


def load_ranking(path: Path, vocab_size: int) -> torch.Tensor:
    """Token ids, most used first, checked against the target's ``vocab_size``."""
    from safetensors import safe_open

    if not path.is_file():
        raise ConfigError(f"draft_vocab: no such file: {path}")
    try:
        with safe_open(str(path), "pt") as f:
            ranking = f.get_tensor(RANKING).long() if RANKING in f.keys() else None
    except Exception as exc:  # safetensors raises its own error types for a file that is not one
        raise ConfigError(f"draft_vocab: {path} is not a safetensors file ({exc})") from None
    if ranking is None:
        raise ConfigError(f"draft_vocab: {path} holds no {RANKING!r} tensor (write one with `specdec train draft-vocab`)")
    if ranking.dim() != 1 or ranking.numel() == 0:
        raise ConfigError(f"draft_vocab: {path}: {RANKING!r} must be a non-empty list of token ids")
    if int(ranking.min()) < 0 or int(ranking.max()) >= vocab_size:
        raise ConfigError(f"draft_vocab: {path} ranks token ids outside the target's vocabulary of {vocab_size}")
    if ranking.unique().numel() != ranking.numel():
        raise ConfigError(f"draft_vocab: {path} ranks some token ids twice")
    return ranking


def kept_tokens(ranking: torch.Tensor, draft_vocab_size: int, source: str) -> torch.Tensor:
    """The ``draft_vocab_size`` top-ranked ids, in id order (so argmax ties resolve as over the full vocabulary)."""
    if draft_vocab_size > ranking.numel():
        raise ConfigError(f"draft_vocab_size: {draft_vocab_size} exceeds the {ranking.numel()} tokens ranked in {source}")
    return ranking[:draft_vocab_size].sort().values


def trim_output_layer(model: torch.nn.Module, kept: torch.Tensor) -> None:
    """Give ``model`` an output layer with only the rows of ``kept``: its logits index into ``kept``.

    The input embedding is left whole (tied or not), so the draft still reads every token.
    """
    full = model.get_output_embeddings()
    if int(kept.max()) >= full.out_features:
        raise ConfigError(f"draft_vocab_size: keeps token id {int(kept.max())}, past the draft's {full.out_features} output rows")
    rows = kept.to(full.weight.device)
    trimmed = torch.nn.Linear(full.in_features, len(kept), bias=full.bias is not None,
                              device=full.weight.device, dtype=full.weight.dtype)
    with torch.no_grad():
        trimmed.weight.copy_(full.weight[rows])
        if full.bias is not None:
            trimmed.bias.copy_(full.bias[rows])
    model.set_output_embeddings(trimmed.requires_grad_(False))
