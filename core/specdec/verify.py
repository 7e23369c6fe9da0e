"""The core's lossless verification of a step's requests, batched onto :mod:`specdec.kernels`.

- Greedy requests (temperature 0): keep drafts while they equal the target's argmax; the next
  token is the argmax after the last kept draft. Output equals plain greedy decoding.
- Sampled requests: rejection sampling (Leviathan et al. 2023; Chen et al. 2023) against the
  target distribution shaped by each request's own params; a proposal without ``probs``
  (n-gram) has a one-hot ``q``. Output follows the target distribution.

Each group runs as one padded batch. A request's random numbers come from its own generator in a
fixed order (``K`` uniforms, then ``V`` exponentials), so a seeded request gives the same tokens
whatever else is in the batch, and on either backend.
"""

from __future__ import annotations

import torch

from specdec import kernels
from specdec.errors import VerifyInputError
from specdec.requests import DraftProposal, Request, VerifyResult
from specdec.sampling import logits_to_probs


def verify_requests(
    requests: list[Request], proposals: list[DraftProposal], target_logits: list[torch.Tensor]
) -> list[VerifyResult]:
    """One :class:`VerifyResult` per request (``target_logits[i]``: ``[len(proposals[i]) + 1, V]``)."""
    results: list[VerifyResult | None] = [None] * len(requests)
    greedy = [i for i, request in enumerate(requests) if request.params.greedy]
    sampled = [i for i, request in enumerate(requests) if not request.params.greedy]
    for group, verify in ((greedy, _verify_greedy), (sampled, _verify_sampled)):
        if group:
            picked = verify([requests[i] for i in group], [proposals[i] for i in group], [target_logits[i] for i in group])
            for i, result in zip(group, picked):
                results[i] = result
    return results  # type: ignore[return-value]  # every slot is filled by one group


def _padded_drafts(proposals: list[DraftProposal], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    k = max(len(p) for p in proposals)
    draft_ids = torch.zeros(len(proposals), k, dtype=torch.long)
    for row, proposal in enumerate(proposals):
        draft_ids[row, : len(proposal)] = torch.tensor(proposal.token_ids, dtype=torch.long)
    num_drafts = torch.tensor([len(p) for p in proposals], dtype=torch.long)
    return draft_ids.to(device), num_drafts.to(device)


def _results(acceptance: kernels.Acceptance) -> list[VerifyResult]:
    num_accepted = acceptance.num_accepted.tolist()
    next_tokens = acceptance.output_ids.gather(1, acceptance.num_accepted[:, None])[:, 0].tolist()
    return [VerifyResult(n, t) for n, t in zip(num_accepted, next_tokens)]


def _verify_greedy(requests: list[Request], proposals: list[DraftProposal], logits: list[torch.Tensor]) -> list[VerifyResult]:
    device = logits[0].device
    draft_ids, num_drafts = _padded_drafts(proposals, device)
    target_argmax = torch.zeros(len(requests), draft_ids.shape[1] + 1, dtype=torch.long, device=device)
    for row, rows_logits in enumerate(logits):
        target_argmax[row, : rows_logits.shape[0]] = rows_logits.argmax(-1)
    return _results(kernels.greedy_accept(draft_ids, num_drafts, target_argmax))


def _verify_sampled(requests: list[Request], proposals: list[DraftProposal], logits: list[torch.Tensor]) -> list[VerifyResult]:
    device = logits[0].device
    batch, vocab = len(requests), logits[0].shape[-1]
    draft_ids, num_drafts = _padded_drafts(proposals, device)
    k = draft_ids.shape[1]
    target_probs = torch.zeros(batch, k + 1, vocab, device=device)
    for row, (request, rows_logits) in enumerate(zip(requests, logits)):
        target_probs[row, : rows_logits.shape[0]] = logits_to_probs(rows_logits, request.params)
    draft_probs = _draft_probs(proposals, batch, k, vocab, device)
    uniform = torch.zeros(batch, k, device=device)
    exponential = torch.empty(batch, vocab, device=device)
    for row, (request, proposal) in enumerate(zip(requests, proposals)):
        generator = request.generator
        draw_device = generator.device if generator is not None else device
        uniform[row, : len(proposal)] = torch.rand(len(proposal), generator=generator, device=draw_device)
        exponential[row] = torch.empty(vocab, device=draw_device).exponential_(generator=generator)
    return _results(kernels.rejection_accept(draft_ids, num_drafts, draft_probs, target_probs, uniform, exponential))


def _draft_probs(proposals: list[DraftProposal], batch: int, k: int, vocab: int, device: torch.device) -> torch.Tensor | None:
    """``[B, K, V]`` draft distributions; ``None`` when every proposal is deterministic.

    In a mixed batch a deterministic proposal gets one-hot rows, which rejection sampling treats
    exactly as it treats ``q = None``.
    """
    given = [p.probs for p in proposals if p.probs is not None and len(p)]
    if not given:
        return None
    dtype = given[0].dtype
    for probs in given[1:]:
        dtype = torch.promote_types(dtype, probs.dtype)
    if dtype not in kernels.inputs.PROB_DTYPES:
        dtype = torch.float32
    draft_probs = torch.zeros(batch, k, vocab, dtype=dtype, device=device)
    for row, proposal in enumerate(proposals):
        n = len(proposal)
        if proposal.probs is not None:
            if proposal.probs.dim() != 2 or proposal.probs.shape[0] < n or proposal.probs.shape[1] != vocab:
                raise VerifyInputError(
                    f"DraftProposal.probs: expected shape [{n}, {vocab}] for {n} drafts, got {list(proposal.probs.shape)}"
                )
            draft_probs[row, :n] = proposal.probs[:n]
        elif n:
            draft_probs[row, torch.arange(n), torch.tensor(proposal.token_ids)] = 1.0
    return draft_probs
