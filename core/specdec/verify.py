"""The core's lossless verification of a step's requests, batched onto :mod:`specdec.kernels`.

Each request has a *target pick* at every position when it is greedy or seeded:

- greedy: the target's argmax;
- sampled with a seed: the exponential race ``argmax(p / E_t)`` with the position's own noise
  (:class:`~specdec.sampling.PositionNoise`), a draw from the target's distribution ``p``.

Chains keep drafts while they equal the pick (the next token is the pick after the last kept
draft); trees (``DraftProposal.parents``) keep the longest root-down path whose every node is the
pick at its parent. The output is then exactly what plain decoding picks, token for token, for
any drafter: lossless, and a seeded request's output does not depend on the batch, the draft
length or the drafts.

Sampled requests without a seed use rejection sampling (Leviathan et al. 2023; Chen et al.
2023) against the target distribution shaped by each request's own params, which keeps a
stochastic draft more often than matching a pick does; a proposal without ``probs`` (n-gram) has
a one-hot ``q``. Output follows the target distribution. A tree of deterministic drafts (no
``probs``: n-gram pools, suffix trees, lookahead windows) is verified by multi-candidate
rejection sampling (SpecInfer, Miao et al. 2024): at each node the children are tried in order,
each kept with its probability under the residual distribution, a rejected child's token
removed from the residual; the token after the kept path is drawn from the last residual.

Greedy and seeded requests compare their drafts with the picks on the host, after one transfer
of the batch's picks: a few comparisons per draft, where a kernel would cost its launch and the
copies of its inputs. Sampled chains run as one padded batch through the verify kernels.
"""

from __future__ import annotations

from types import ModuleType

import torch

from specdec import kernels
from specdec.errors import VerifyInputError
from specdec.kernels.reference import accepted_path
from specdec.requests import DraftProposal, Request, VerifyResult
from specdec.sampling import exponential_noise, greedy_tokens, logits_to_probs, race


def verify_requests(
    requests: list[Request], proposals: list[DraftProposal], target_logits: list[torch.Tensor]
) -> list[VerifyResult]:
    """One :class:`VerifyResult` per request (``target_logits[i]``: ``[len(proposals[i]) + 1, V]``)."""
    results: list[VerifyResult | None] = [None] * len(requests)
    has_picks = [r.params.greedy or r.noise is not None for r in requests]
    picked = [i for i, p in enumerate(has_picks) if p]
    sampled = [i for i, p in enumerate(has_picks) if not p]
    sampled_trees = [i for i in sampled if proposals[i].parents is not None]
    sampled = [i for i in sampled if proposals[i].parents is None]
    if any(proposals[i].probs is not None for i in sampled_trees):
        raise VerifyInputError(
            "DraftProposal.parents: the core verifies trees with draft probs for greedy or seeded requests only; "
            "propose a chain, or a tree of deterministic drafts (probs=None), for a sampled request without a "
            "seed, or verify such trees in your plugin's specdec_verify"
        )
    groups = ((picked, _verify_picked), (sampled, _verify_sampled), (sampled_trees, _verify_sampled_trees))
    for group, verify in groups:
        if group:
            outcome = verify([requests[i] for i in group], [proposals[i] for i in group], [target_logits[i] for i in group])
            for i, result in zip(group, outcome):
                results[i] = result
    return results  # type: ignore[return-value]  # every slot is filled by one group


def target_picks(request: Request, logits: torch.Tensor, depths: list[int] | None = None) -> torch.Tensor:
    """The target's pick after each row of ``logits`` (``[rows, V]``) for a greedy or seeded request.

    Row ``r`` predicts sequence position ``len(request.token_ids) + depths[r]`` (default: ``r``,
    a chain): a seeded request draws it with that position's noise.
    """
    if request.params.greedy:
        return greedy_tokens(logits)
    start = len(request.token_ids)
    positions = range(start, start + logits.shape[0]) if depths is None else [start + d for d in depths]
    noise = torch.stack([request.noise.at(p) for p in positions]).to(logits.device)
    return race(logits_to_probs(logits, request.params), noise)


def _padded_drafts(proposals: list[DraftProposal], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    k = max(len(p) for p in proposals)
    draft_ids = torch.zeros(len(proposals), k, dtype=torch.long)
    for row, proposal in enumerate(proposals):
        draft_ids[row, : len(proposal)] = torch.tensor(proposal.token_ids, dtype=torch.long)
    num_drafts = torch.tensor([len(p) for p in proposals], dtype=torch.long)
    return draft_ids.to(device), num_drafts.to(device)


def _results(acceptance: kernels.Acceptance) -> list[VerifyResult]:
    """The step's outcome on the host, in one transfer from the device."""
    next_tokens = acceptance.output_ids.gather(1, acceptance.num_accepted[:, None])[:, 0]
    num_accepted, next_tokens = torch.stack([acceptance.num_accepted, next_tokens]).tolist()
    return [VerifyResult(n, t) for n, t in zip(num_accepted, next_tokens)]


def _operations(device: torch.device) -> ModuleType:
    """The verify operations for ``device``, without the public functions' checks of the inputs'
    contents: each check reads the device (a host sync), and these inputs are built here from
    proposals already checked on the host (``specdec.proposal_checks``)."""
    return kernels.implementation(device)


def _verify_picked(requests: list[Request], proposals: list[DraftProposal], logits: list[torch.Tensor]) -> list[VerifyResult]:
    """Greedy and seeded requests, chains and trees: a draft is kept when it is the target's pick
    at its parent, which takes a few comparisons per draft once the picks are on the host. So the
    picks come over in one transfer for the batch (the step's one read of the device), and the
    drafts, already on the host, are compared there."""
    depths = [None if p.parents is None else _depths(p.parents) for p in proposals]
    picks = [target_picks(r, lg, d) for r, lg, d in zip(requests, logits, depths, strict=True)]
    rows = (picks[0][None] if len(picks) == 1 else _stack_padded(picks, max(len(p) for p in proposals) + 1)).tolist()
    results = []
    for proposal, row in zip(proposals, rows):
        if proposal.parents is None:
            kept = 0
            while kept < len(proposal) and proposal.token_ids[kept] == row[kept]:
                kept += 1
            results.append(VerifyResult(kept, row[kept]))
        else:
            path, token = accepted_path(proposal.token_ids, proposal.parents, row)
            results.append(VerifyResult(len(path), token, path))
    return results


def _verify_sampled(requests: list[Request], proposals: list[DraftProposal], logits: list[torch.Tensor]) -> list[VerifyResult]:
    device = logits[0].device
    vocab = logits[0].shape[-1]
    draft_ids, num_drafts = _padded_drafts(proposals, device)
    k = draft_ids.shape[1]
    target_probs = _stack_padded([logits_to_probs(lg, r.params) for r, lg in zip(requests, logits)], k + 1)
    draft_probs = _draft_probs(proposals, len(requests), k, vocab, device)
    draws = [_random_numbers(len(p), vocab, device) for p in proposals]
    uniform = _stack_padded([u for u, _ in draws], k)
    exponential = torch.stack([e for _, e in draws])
    return _results(_operations(device).rejection_accept(draft_ids, num_drafts, draft_probs, target_probs, uniform, exponential))


def _verify_sampled_trees(requests: list[Request], proposals: list[DraftProposal],
                          logits: list[torch.Tensor]) -> list[VerifyResult]:
    """Multi-candidate rejection sampling down each request's tree of deterministic drafts.

    At a node whose target distribution is ``p``, child ``c`` is kept with probability
    ``r(c) / sum(r)``, ``r`` the residual: ``p`` without the tokens of the children rejected before
    it. A kept child's row gives the next node's ``p``; when every child is rejected, the next
    token is drawn from ``r``. By induction over the children, the token emitted at each position
    is distributed as ``p``: lossless, whatever the tree (a duplicate child is always rejected).
    """
    results = []
    for request, proposal, rows in zip(requests, proposals, logits):
        probs = logits_to_probs(rows, request.params).float()
        children: list[list[int]] = [[] for _ in range(len(proposal) + 1)]
        for node, parent in enumerate(proposal.parents):
            children[parent + 1].append(node)
        row, path = 0, []
        while True:
            residual = probs[row]
            for node in children[row]:
                token = proposal.token_ids[node]
                mass, kept = torch.stack([residual.sum(), residual[token]]).tolist()
                if kept > 0 and float(torch.rand(())) * mass < kept:
                    path.append(node)
                    row = node + 1
                    break
                if kept > 0:
                    residual = residual.clone()
                    residual[token] = 0.0
            else:
                next_token = int(race(residual, exponential_noise(residual.shape[-1], None, residual.device)))
                results.append(VerifyResult(len(path), next_token, path))
                break
    return results


def _random_numbers(k: int, vocab: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """One request's draws: ``k`` uniforms, then ``vocab`` Exp(1) variates."""
    return torch.rand(k, device=device), exponential_noise(vocab, None, device)


def _depths(parents: list[int]) -> list[int]:
    """Depth of each row of a tree's forward: the root (the last committed token) is 0, a node one
    more than its parent."""
    depths = [0]
    for parent in parents:
        depths.append(depths[parent + 1] + 1)
    return depths


def _stack_padded(tensors: list[torch.Tensor], rows: int) -> torch.Tensor:
    """``[B, rows, ...]``: each tensor's rows first, zeros after (no copy beyond ``stack`` when full)."""
    if all(t.shape[0] == rows for t in tensors):
        return torch.stack(tensors)
    out = tensors[0].new_zeros(len(tensors), rows, *tensors[0].shape[1:])
    for row, tensor in enumerate(tensors):
        out[row, : tensor.shape[0]] = tensor
    return out


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
            draft_probs[row, :n].scatter_(1, torch.tensor(proposal.token_ids, device=device)[:, None], 1.0)
    return draft_probs
