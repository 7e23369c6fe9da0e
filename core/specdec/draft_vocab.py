"""A frequency-ranked draft vocabulary: a drafter proposes only the target's most used tokens.

Every drafter that ends in a projection onto the vocabulary (a draft model's output layer, Medusa
heads, MTP layers) pays for all of its rows on every drafted token, and with tens of thousands of
tokens that projection dominates a small drafter: SmolLM2's 49,152 x 576 output layer is 28M of the
target's 135M parameters, about a fifth of a target step per drafted token. As FR-Spec and
TensorRT Model Optimizer's draft vocabulary compression do (EAGLE-3's ``d2t`` is the same idea,
built into the head), the projection can keep only the rows of the ``draft_vocab_size`` tokens the
target's replies use most; the rest of the drafter is unchanged.

Output stays lossless: greedy verification checks every draft against the target's own choice,
and a sampled draft carries the drafter's distribution over the kept tokens (zero elsewhere),
which rejection sampling corrects to the target's exactly. What it costs is the occasional token
outside the kept set, which the drafter can no longer propose.

The ranking comes from training conversations (``specdec train draft-vocab``): a safetensors file
holding ``token_ids``, every target token most used first. One ships for the default target.
"""

from __future__ import annotations

from pathlib import Path

import torch
from pydantic import BaseModel, Field
from torch import nn

from specdec.errors import ConfigError, ModelLoadError
from specdec.prepacked_linear import prepack_linears
from specdec.resources import TargetContext

RANKING = "token_ids"
#: The default target's ranking, from the replies of ``training-data/smollm2/`` (the data every
#: drafter shipped for it trained on).
SHIPPED_RANKING = Path(__file__).resolve().parent / "data" / "smollm2-draft-vocab.safetensors"
#: What a drafter shipped for the default target keeps when ``draft_vocab_size`` is unset: 97.9%
#: of the training replies' tokens, and a projection 6x smaller than the full one.
SHIPPED_DRAFT_VOCAB_SIZE = 8192


class DraftVocabularyConfig(BaseModel):
    """The options of a method whose drafter projects onto the vocabulary (a config mixin)."""

    draft_vocab_size: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Draft over only this many target tokens, those the target's replies use most (ranked in "
            "`draft_vocab`): the drafter's projection onto the vocabulary keeps only their rows, which makes "
            f"each drafted token cheaper. Unset: the full vocabulary, except for a drafter shipped for the "
            f"default target, which keeps {SHIPPED_DRAFT_VOCAB_SIZE} tokens of the shipped ranking."
        ),
    )
    draft_vocab: str | None = Field(
        default=None,
        description=(
            "The token ranking for `draft_vocab_size`: a safetensors file from `specdec train draft-vocab`. "
            "Unset with a shipped drafter: the ranking shipped for the default target."
        ),
    )


def draft_ranking(
    config: DraftVocabularyConfig, target: TargetContext, shipped: bool, shipped_size: int | None = SHIPPED_DRAFT_VOCAB_SIZE
) -> tuple[torch.Tensor, int, str] | None:
    """``(ranking, draft_vocab_size, where the ranking came from)`` the options ask for, or ``None``
    for the full vocabulary.

    ``shipped``: the drafter is one a plugin ships for the default target; it may use the shipped
    ranking, and uses ``shipped_size`` tokens of it unless told otherwise (as a published EAGLE-3
    head comes with its draft vocabulary).
    """
    size = config.draft_vocab_size
    if size is None and shipped and config.draft_vocab is None:
        size = shipped_size
    if size is None:
        return None
    if config.draft_vocab is not None:
        path = Path(config.draft_vocab)
    elif shipped:
        path = SHIPPED_RANKING
    else:
        raise ConfigError("draft_vocab: required with draft_vocab_size for a drafter of your own "
                          "(a token ranking written by `specdec train draft-vocab`)")
    return load_ranking(path, target.vocab_size), size, str(path)


def draft_vocabulary(config: DraftVocabularyConfig, target: TargetContext, shipped: bool) -> torch.Tensor | None:
    """The token ids the drafter may propose (in id order), or ``None`` for all of them (see
    :func:`draft_ranking` for ``shipped``)."""
    ranked = draft_ranking(config, target, shipped)
    return None if ranked is None else kept_tokens(*ranked)


def kept_rows(ranking: torch.Tensor, row_ids: torch.Tensor, draft_vocab_size: int) -> torch.Tensor:
    """For a projection whose rows already stand for target ids ``row_ids`` (EAGLE-3's ``d2t``
    draft vocabulary), the ``draft_vocab_size`` rows whose tokens rank highest, in row order."""
    if draft_vocab_size > row_ids.numel():
        raise ConfigError(f"draft_vocab_size: {draft_vocab_size} exceeds the drafter's own vocabulary of {row_ids.numel()} tokens")
    rank = torch.empty(ranking.numel(), dtype=torch.long)
    rank[ranking] = torch.arange(ranking.numel())
    return rank[row_ids.cpu()].argsort(stable=True)[:draft_vocab_size].sort().values


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


def compact_token_ids(tensors: dict[str, torch.Tensor], draft_vocab_size: int, vocab_size: int, where: object) -> torch.Tensor:
    """The ``token_ids`` tensor of a compact checkpoint (a drafter trained over a draft vocabulary,
    whose output rows stand for these target ids), checked: ``draft_vocab_size`` ascending ids
    below ``vocab_size``. A missing or bad one is a one-line error naming ``token_ids`` and ``where``."""
    ids = tensors.get("token_ids")
    if ids is None:
        raise ModelLoadError(f"token_ids: missing from the weights in {where} (draft_vocab_size is set)")
    ids = ids.long()
    if ids.shape != (draft_vocab_size,) or not bool((ids[1:] > ids[:-1]).all()) or \
            int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise ModelLoadError(f"token_ids: must be {draft_vocab_size} ascending token ids below {vocab_size} in {where}")
    return ids


def trimmed_projection(full: nn.Linear, kept: torch.Tensor) -> nn.Linear:
    """A copy of the projection ``full`` with only the rows of ``kept`` (its outputs index into
    ``kept``), frozen, on ``full``'s device and dtype, prepacked where that pays."""
    if int(kept.max()) >= full.out_features:
        raise ConfigError(f"draft_vocab_size: keeps token id {int(kept.max())}, past the drafter's {full.out_features} output rows")
    rows = kept.to(full.weight.device)
    trimmed = nn.Linear(full.in_features, len(kept), bias=full.bias is not None,
                        device=full.weight.device, dtype=full.weight.dtype)
    with torch.no_grad():
        trimmed.weight.copy_(full.weight[rows])
        if full.bias is not None:
            trimmed.bias.copy_(full.bias[rows])
    trimmed.requires_grad_(False)
    prepack_linears(trimmed)
    return trimmed


def trim_output_layer(model: nn.Module, kept: torch.Tensor) -> None:
    """Give ``model`` an output layer with only the rows of ``kept``: its logits index into ``kept``.

    The input embedding is left whole (tied or not), so the draft still reads every token.
    """
    model.set_output_embeddings(trimmed_projection(model.get_output_embeddings(), kept))


def full_logits(logits: torch.Tensor, kept: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """Logits over ``kept`` placed at their target ids, ``-inf`` elsewhere (unchanged without ``kept``)."""
    if kept is None:
        return logits
    full = logits.new_full((*logits.shape[:-1], vocab_size), float("-inf"))
    full[..., kept] = logits
    return full
