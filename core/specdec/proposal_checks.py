"""What the engine checks in a drafter's proposal before the target verifies it.

Verification is lossless only for what it is told: a token id outside the vocabulary, a tree
whose parents come after their children, or draft probabilities that are not a distribution
(rejection sampling would accept drafts with ``q = -1`` every time) silently break the output.
Every check names the method and what was expected, as a :class:`~specdec.errors.PluginError`.
"""

from __future__ import annotations

import numbers
from typing import Any

import torch

from specdec.errors import PluginError
from specdec.requests import DraftProposal

#: How far a draft distribution's row may sum from 1 (a bf16 distribution over 50k tokens
#: rounds each entry to about 0.4% and still sums within a fraction of that).
SUM_TOLERANCE = 1e-2


def checked_proposal(proposal: Any, method: str, vocab_size: int, budget: int) -> DraftProposal:
    """``proposal`` cut to ``budget`` drafts, its token ids and parents as Python ints; raises
    :class:`PluginError` when it is not a valid :class:`DraftProposal` for a ``vocab_size`` target."""
    if not isinstance(proposal, DraftProposal):
        raise PluginError(f"method {method!r} proposed {described(proposal)} for a request; expected a DraftProposal")
    token_ids = _integers(proposal.token_ids, method, "token_ids")
    parents = None if proposal.parents is None else _integers(proposal.parents, method, "parents")
    if not all(0 <= t < vocab_size for t in token_ids):
        raise PluginError(f"method {method!r} drafted a token id outside [0, {vocab_size})")
    if parents is not None and (len(parents) != len(token_ids) or not all(-1 <= p < i for i, p in enumerate(parents))):
        raise PluginError(
            f"method {method!r} proposed a tree whose parents do not come before their children "
            f"(DraftProposal.parents: one index per node, -1 or an earlier node)"
        )
    proposal = DraftProposal(token_ids, proposal.probs, parents).truncated(budget)
    if proposal.probs is not None:
        _check_probs(proposal, method, vocab_size)
    return proposal


def described(value: Any) -> str:
    """What a plugin returned, for an error message: ``None``, ``a str``, ``a list of 3``..."""
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {len(value)}"
    return "None" if value is None else f"a {type(value).__name__}"


def _integers(values: Any, method: str, field: str) -> list[int]:
    """``values`` as a list of ints: a list or tuple of integers, or a 1-D integer tensor."""
    expected = f"DraftProposal.{field}: expected a list of int"
    if isinstance(values, torch.Tensor):
        if values.dim() != 1 or values.is_floating_point() or values.is_complex() or values.dtype == torch.bool:
            raise PluginError(f"method {method!r}: {expected}, got a {values.dim()}-D {values.dtype} tensor")
        return [int(v) for v in values.tolist()]
    if not isinstance(values, (list, tuple)):
        raise PluginError(f"method {method!r}: {expected}, got {described(values)}")
    for value in values:
        if isinstance(value, torch.Tensor) and value.dim() == 0 and not value.is_floating_point() and value.dtype != torch.bool:
            continue
        if not isinstance(value, numbers.Integral) or isinstance(value, bool):
            raise PluginError(f"method {method!r}: {expected}, got an item {value!r} ({type(value).__name__})")
    return [int(v) for v in values]


def _check_probs(proposal: DraftProposal, method: str, vocab_size: int) -> None:
    """The draft distributions are ``[n, vocab]`` probabilities, and each drafted token was possible."""
    probs, n = proposal.probs, len(proposal)
    prefix = f"method {method!r}: DraftProposal.probs"
    if not isinstance(probs, torch.Tensor) or not probs.is_floating_point():
        raise PluginError(f"{prefix}: expected a float tensor, got {described(probs)}")
    if probs.dim() != 2 or probs.shape[0] != n or probs.shape[1] != vocab_size:
        raise PluginError(f"{prefix}: expected shape [{n}, {vocab_size}] for {n} drafts, got {list(probs.shape)}")
    if not n:
        return
    rows = probs.float()
    drafted = rows.gather(1, torch.tensor(proposal.token_ids, device=rows.device)[:, None])[:, 0]
    sums = rows.sum(-1)
    finite, non_negative, summed, possible = torch.stack([
        rows.isfinite().all(), (rows >= 0).all(), ((sums - 1).abs() <= SUM_TOLERANCE).all(), (drafted > 0).all()
    ]).tolist()
    if not finite:
        raise PluginError(f"{prefix}: not finite (NaN or inf)")
    if not non_negative:
        raise PluginError(f"{prefix}: negative probabilities")
    if not summed:
        raise PluginError(f"{prefix}: a row sums to {_worst(sums):.4g}, not 1")
    if not possible:
        raise PluginError(f"{prefix}: a drafted token has probability 0 in the distribution it was drawn from")


def _worst(sums: torch.Tensor) -> float:
    return float(sums[(sums - 1).abs().argmax()])
