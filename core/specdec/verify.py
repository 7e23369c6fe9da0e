"""Lossless acceptance rules, kept apart from drafting.

- Greedy: keep drafts while they equal the target's argmax; the next token is the argmax after
  the last kept draft. Output equals plain greedy decoding.
- Rejection sampling (Leviathan et al. 2023; Chen et al. 2023): keep draft ``x`` with probability
  ``min(1, p(x) / q(x))``; on the first rejection sample from ``norm(max(p - q, 0))``; when every
  draft is kept, sample the bonus token from ``p``. Output follows the target distribution ``p``.
  A draft without probabilities (n-gram) has a one-hot ``q``.
"""

from __future__ import annotations

import torch

from specdec.requests import DraftProposal, VerifyResult
from specdec.sampling import SamplingParams, logits_to_probs, sample


def greedy_verify(draft_ids: list[int], target_logits: torch.Tensor) -> VerifyResult:
    """``target_logits``: ``[len(draft_ids) + 1, vocab]``."""
    predicted = target_logits.argmax(-1).tolist()
    accepted = 0
    for draft, target in zip(draft_ids, predicted):
        if draft != target:
            break
        accepted += 1
    return VerifyResult(accepted, predicted[accepted])


def rejection_sample(
    draft_ids: list[int],
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> VerifyResult:
    """``target_probs``: ``[k + 1, vocab]``; ``draft_probs``: ``[k, vocab]`` or ``None`` (one-hot)."""
    k = len(draft_ids)
    if k:
        index = torch.tensor(draft_ids, device=target_probs.device)
        rows = torch.arange(k, device=target_probs.device)
        p = target_probs[rows, index]
        q = draft_probs[rows, index] if draft_probs is not None else torch.ones_like(p)
        uniform = torch.rand(k, generator=generator, device=generator.device if generator else p.device)
        # Accept iff u < p/q, written as u * q < p to stay exact when q == 1.
        rejected = (uniform.to(p.device) * q >= p).tolist()
    for i in range(k):
        if rejected[i]:
            residual = target_probs[i].clone()
            if draft_probs is None:
                residual[draft_ids[i]] = 0.0
            else:
                residual = (residual - draft_probs[i]).clamp_min_(0.0)
            total = residual.sum()
            # p == q exactly leaves nothing to resample from; then p itself is the right law.
            dist = residual / total if total > 0 else target_probs[i]
            return VerifyResult(i, sample(dist, generator))
    return VerifyResult(k, sample(target_probs[k], generator))


def verify_one(
    proposal: DraftProposal,
    target_logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> VerifyResult:
    """The core's default decision for one request."""
    if params.greedy:
        return greedy_verify(proposal.token_ids, target_logits)
    return rejection_sample(proposal.token_ids, proposal.probs, logits_to_probs(target_logits, params), generator)
