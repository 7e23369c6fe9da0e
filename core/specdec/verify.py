"""The core's lossless verification of a step's requests, batched onto :mod:`specdec.kernels`.

- Greedy requests (temperature 0): keep drafts while they equal the target's argmax; the next
  token is the argmax after the last kept draft. Output equals plain greedy decoding.
- Greedy requests with a tree proposal (``DraftProposal.parents``): the longest root-down path
  whose every node is the target's argmax at its parent; the next token is the argmax after it.
- Sampled requests: rejection sampling (Leviathan et al. 2023; Chen et al. 2023) against the
  target distribution shaped by each request's own params; a proposal without ``probs``
  (n-gram) has a one-hot ``q``. Output follows the target distribution.

Each group runs as one padded batch. A request's random numbers come from its own generator in a
fixed order (one uniform per draft, then one Exp(1) variate per vocabulary entry), so a seeded
request gives the same tokens whatever else is in the batch, and on either backend.
"""

from __future__ import annotations

import torch

from specdec import kernels
from specdec.errors import VerifyInputError
from specdec.requests import DraftProposal, Request, VerifyResult
from specdec.sampling import greedy_tokens, logits_to_probs


def verify_requests(
    requests: list[Request], proposals: list[DraftProposal], target_logits: list[torch.Tensor]
) -> list[VerifyResult]:
    """One :class:`VerifyResult` per request (``target_logits[i]``: ``[len(proposals[i]) + 1, V]``)."""
    results: list[VerifyResult | None] = [None] * len(requests)
    is_tree = [p.parents is not None for p in proposals]
    greedy = [i for i, request in enumerate(requests) if request.params.greedy and not is_tree[i]]
    trees = [i for i, request in enumerate(requests) if request.params.greedy and is_tree[i]]
    sampled = [i for i, request in enumerate(requests) if not request.params.greedy]
    if any(is_tree[i] for i in sampled):
        raise VerifyInputError(
            "DraftProposal.parents: the core verifies draft trees for greedy requests only; propose a chain "
            "for a sampled request, or verify trees in your plugin's specdec_verify"
        )
    for group, verify in ((greedy, _verify_greedy), (trees, _verify_trees), (sampled, _verify_sampled)):
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
    target_argmax = _stack_padded([greedy_tokens(lg) for lg in logits], draft_ids.shape[1] + 1)
    return _results(kernels.greedy_accept(draft_ids, num_drafts, target_argmax))


def _verify_trees(requests: list[Request], proposals: list[DraftProposal], logits: list[torch.Tensor]) -> list[VerifyResult]:
    device = logits[0].device
    node_ids, num_nodes = _padded_drafts(proposals, device)
    n = node_ids.shape[1]
    parents = torch.full((len(proposals), n), -1, dtype=torch.long)
    for row, proposal in enumerate(proposals):
        parents[row, : len(proposal)] = torch.tensor(proposal.parents, dtype=torch.long)
    target_argmax = _stack_padded([greedy_tokens(lg) for lg in logits], n + 1)
    outcome = kernels.tree_accept(node_ids, parents.to(device), num_nodes, target_argmax)
    results = []
    for count, path, token in zip(outcome.num_accepted.tolist(), outcome.accepted_nodes.tolist(), outcome.next_token.tolist()):
        results.append(VerifyResult(count, token, path[:count]))
    return results


def _verify_sampled(requests: list[Request], proposals: list[DraftProposal], logits: list[torch.Tensor]) -> list[VerifyResult]:
    device = logits[0].device
    vocab = logits[0].shape[-1]
    draft_ids, num_drafts = _padded_drafts(proposals, device)
    k = draft_ids.shape[1]
    target_probs = _stack_padded([logits_to_probs(lg, r.params) for r, lg in zip(requests, logits)], k + 1)
    draft_probs = _draft_probs(proposals, len(requests), k, vocab, device)
    draws = [_random_numbers(r.generator, len(p), vocab, device) for r, p in zip(requests, proposals)]
    uniform = _stack_padded([u for u, _ in draws], k)
    exponential = torch.stack([e for _, e in draws])
    return _results(kernels.rejection_accept(draft_ids, num_drafts, draft_probs, target_probs, uniform, exponential))


def _random_numbers(generator: torch.Generator | None, k: int, vocab: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """One request's draws, in a fixed order: ``k`` uniforms, then ``vocab`` Exp(1) variates.

    Exp(1) as ``-log(1 - U)``: the same law as ``Tensor.exponential_``, six times faster on CPU.
    """
    draw_device = generator.device if generator is not None else device
    uniform = torch.rand(k, generator=generator, device=draw_device)
    exponential = torch.rand(vocab, generator=generator, device=draw_device).neg_().log1p_().neg_()
    return uniform.to(device), exponential.to(device)


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
