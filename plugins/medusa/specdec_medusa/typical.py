"""Medusa's typical acceptance (Cai et al. 2024, section 2.3.1): NOT lossless, opt-in.

A sampled request keeps a draft when the target gives it more than
``min(posterior_threshold, posterior_alpha * exp(-H))``, ``H`` being the entropy of the target's
distribution at its parent, and its parent was kept too. Among the longest kept root-down paths
the most likely one (sum of the target's log-probabilities) wins. As in Medusa, the token after
the kept path is the target's argmax there (the "greedy first token" of the next step, accepted
unconditionally), so every step still emits at least one token.

The target's distribution is the request's own (:func:`specdec.logits_to_probs`: temperature,
top-k, top-p), which is Medusa's ``softmax(logits / T)`` for plain temperature sampling. Greedy
requests keep exact matching, as Medusa does at temperature 0: their output stays lossless.

Every draft a sampled request keeps under the typical rule counts in
:attr:`specdec.VerifyResult.num_lossy_accepted` (the metrics' ``num_lossy_accepted_tokens``): no
lossless rule decides an unseeded draw the same way, so none of them is kept losslessly. The
method also logs a warning when typical acceptance is on, and
:attr:`MedusaDecodingConfig.lossless` is false.
"""

from __future__ import annotations

import torch

from specdec import DraftProposal, Request, VerifyResult, greedy_tokens, logits_to_probs, node_depths, path_to

#: Medusa's guard inside the entropy's logarithm.
ENTROPY_EPS = 1e-5


def typical_verify(
    requests: list[Request], proposals: list[DraftProposal], target_logits: list[torch.Tensor], threshold: float, alpha: float
) -> list[VerifyResult]:
    """One result per request: exact matching for greedy requests, typical acceptance otherwise."""
    return [_verify(r, p, lg, threshold, alpha) for r, p, lg in zip(requests, proposals, target_logits)]


def _verify(request: Request, proposal: DraftProposal, logits: torch.Tensor, threshold: float, alpha: float) -> VerifyResult:
    n = len(proposal)
    is_tree = proposal.parents is not None
    parents = list(proposal.parents) if is_tree else list(range(-1, n - 1))
    argmax = greedy_tokens(logits).tolist()
    if n == 0:
        return VerifyResult(0, argmax[0], [] if is_tree else None)
    tokens = torch.tensor(proposal.token_ids, device=logits.device)
    rows = torch.tensor(parents, device=logits.device) + 1
    if request.params.greedy:
        passed = (torch.tensor(argmax, device=logits.device)[rows] == tokens).tolist()
        scores = [0.0] * n
    else:
        probs = logits_to_probs(logits, request.params)
        entropy = -(probs * torch.log(probs + ENTROPY_EPS)).sum(-1)
        bound = torch.clamp(alpha * torch.exp(-entropy), max=threshold)
        drafted = probs[rows, tokens]
        passed = (drafted > bound[rows]).tolist()
        scores = torch.log(drafted).tolist()
    best, best_key = -1, (0, float("-inf"))
    kept = [False] * n
    totals = [0.0] * n
    for i, (parent, depth) in enumerate(zip(parents, node_depths(parents))):
        if not passed[i] or (parent >= 0 and not kept[parent]):
            continue
        kept[i] = True
        totals[i] = scores[i] + (totals[parent] if parent >= 0 else 0.0)
        if (depth, totals[i]) > best_key:
            best, best_key = i, (depth, totals[i])
    path = path_to(best, parents)
    lossy = 0 if request.params.greedy else len(path)
    return VerifyResult(len(path), argmax[best + 1], path if is_tree else None, lossy)
