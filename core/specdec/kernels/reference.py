"""The torch path of the verify-step operations: the CPU path and the reference for the kernels.

Every function takes batched, padded tensors and returns the same values as the Triton kernels
in :mod:`specdec.kernels.triton_kernels`, bit for bit (both compute in float32 with the same
operations, and every random number is passed in). Tree acceptance, which only compares token
ids, walks each tree in Python.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Acceptance(NamedTuple):
    """The outcome of chain verification for a batch.

    ``num_accepted[b]`` drafts of request ``b`` are kept; ``output_ids[b]`` holds them followed by
    the next (bonus or recovered) token, padded with ``-1`` to ``K + 1`` columns.
    """

    num_accepted: torch.Tensor
    output_ids: torch.Tensor


class TreeAcceptance(NamedTuple):
    """The outcome of tree verification for a batch.

    ``num_accepted[b]`` is the length of the longest accepted path (0 when no node is accepted),
    ``accepted_nodes[b]`` the node indices along it, root side first, padded with ``-1`` to ``N``
    columns, and ``next_token[b]`` the target's token after the path's last node.
    """

    num_accepted: torch.Tensor
    accepted_nodes: torch.Tensor
    next_token: torch.Tensor


def _first_true(mask: torch.Tensor, default: torch.Tensor) -> torch.Tensor:
    """Per row, the column of the first ``True`` in ``mask`` ``[B, K]``, else ``default`` ``[B]``."""
    cols = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    candidates = torch.where(mask, cols, default[:, None])
    return torch.cat([candidates, default[:, None]], dim=1).amin(dim=1)


def _chain_output(draft_ids: torch.Tensor, num_accepted: torch.Tensor, next_token: torch.Tensor) -> torch.Tensor:
    batch, k = draft_ids.shape
    cols = torch.arange(k + 1, device=draft_ids.device).expand(batch, k + 1)
    drafts = torch.cat([draft_ids, draft_ids.new_zeros(batch, 1)], dim=1)
    out = torch.where(cols < num_accepted[:, None], drafts, torch.full_like(drafts, -1))
    return torch.where(cols == num_accepted[:, None], next_token[:, None], out)


def greedy_accept(draft_ids: torch.Tensor, num_drafts: torch.Tensor, target_argmax: torch.Tensor) -> Acceptance:
    """Keep drafts while they equal the target's argmax; the next token is the argmax after them."""
    k = draft_ids.shape[1]
    valid = torch.arange(k, device=draft_ids.device) < num_drafts[:, None]
    num_accepted = _first_true((draft_ids != target_argmax[:, :k]) & valid, num_drafts)
    next_token = target_argmax.gather(1, num_accepted[:, None])[:, 0]
    return Acceptance(num_accepted, _chain_output(draft_ids, num_accepted, next_token))


def sample_by_race(weights: torch.Tensor, exponential: torch.Tensor) -> torch.Tensor:
    """``argmax(w / E)`` over the last dim: a draw from ``norm(w)`` when ``E ~ Exp(1)`` i.i.d.

    Tokens of weight 0 score -1 so they are never picked while any weight is positive (and
    ``0 / 0`` never appears). Ties go to the lowest index, as in the kernels.
    """
    return torch.where(weights > 0, weights / exponential, -1.0).argmax(dim=-1)


def rejection_accept(
    draft_ids: torch.Tensor,
    num_drafts: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    uniform: torch.Tensor,
    exponential: torch.Tensor,
) -> Acceptance:
    """Standard rejection sampling (Leviathan et al.; Chen et al.), see :func:`specdec.kernels.rejection_accept`."""
    batch, k = draft_ids.shape
    rows = torch.arange(batch, device=draft_ids.device)
    p = target_probs.float()
    valid = torch.arange(k, device=draft_ids.device) < num_drafts[:, None]
    index = torch.where(valid, draft_ids, 0)[:, :, None]
    p_draft = p[:, :k].gather(2, index)[:, :, 0]
    q_draft = draft_probs.float().gather(2, index)[:, :, 0] if draft_probs is not None else torch.ones_like(p_draft)
    # Accept iff u < p/q, written as u * q < p to stay exact when q == 1.
    num_accepted = _first_true(~(uniform.float() * q_draft < p_draft) & valid, num_drafts)

    # Row picks by flat index_select / gather: torch's advanced indexing is slow on CPU (and
    # pathologically so with several OpenMP threads on a busy machine).
    p_row = p.reshape(batch * (k + 1), -1).index_select(0, rows * (k + 1) + num_accepted)
    recovering = num_accepted < num_drafts
    at = num_accepted.clamp(max=max(k - 1, 0))
    if draft_probs is not None and k:
        q_row = draft_probs.reshape(batch * k, -1).index_select(0, rows * k + at).float()
    else:
        q_row = torch.zeros_like(p_row)
        if k:
            q_row.scatter_(1, draft_ids.gather(1, at[:, None]).clamp(0, p.shape[-1] - 1), 1.0)
    q_row = torch.where(recovering[:, None], q_row, 0.0)
    residual = (p_row - q_row).clamp_min(0.0)
    # p == q exactly leaves nothing to resample from; then p itself is the right law.
    empty = ~(residual > 0).any(dim=-1)
    weights = torch.where(empty[:, None], p_row, residual)
    next_token = sample_by_race(weights, exponential.float())
    return Acceptance(num_accepted, _chain_output(draft_ids, num_accepted, next_token))


def accepted_path(tokens: list[int], parents: list[int], picks: list[int]) -> tuple[list[int], int]:
    """One tree's greedy acceptance on the host: the nodes of the longest root-down path whose every
    node is the target's pick at its parent (``picks[parent + 1]``; the lowest index wins among
    the deepest), root side first, and the pick after the path's last node."""
    # depth[i]: length of the accepted path ending at node i, 0 when node i is not accepted.
    depth = [0] * len(tokens)
    best = -1
    for i, (token, parent) in enumerate(zip(tokens, parents)):
        if parent >= 0 and not depth[parent]:
            continue
        if token == picks[parent + 1]:
            depth[i] = (depth[parent] if parent >= 0 else 0) + 1
            if best < 0 or depth[i] > depth[best]:
                best = i
    path = []
    node = best
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1], picks[best + 1]


def tree_accept(
    node_ids: torch.Tensor, parents: torch.Tensor, num_nodes: torch.Tensor, target_argmax: torch.Tensor
) -> TreeAcceptance:
    """Greedy acceptance along a draft tree, see :func:`specdec.kernels.tree_accept`.

    A walk over each row's nodes in Python: a tree has a few dozen nodes, and the verify step reads
    the result as lists anyway. Run as one torch operation per node over the batch instead, it
    took about 1 ms for a 12-node tree on CPU (now 15 us), 2% of a SmolLM2 tree step.
    """
    batch, n = node_ids.shape
    # One read of every input (one host sync on a GPU without the kernels).
    rows = torch.cat([num_nodes[:, None], node_ids, parents, target_argmax], dim=1).tolist()
    num_accepted, accepted_nodes, next_token = [], [], []
    for row in rows:
        count = row[0]
        path, token = accepted_path(row[1 : 1 + count], row[1 + n : 1 + n + count], row[1 + 2 * n :])
        num_accepted.append(len(path))
        accepted_nodes.append(path + [-1] * (n - len(path)))
        next_token.append(token)
    device = node_ids.device
    return TreeAcceptance(
        torch.tensor(num_accepted, dtype=torch.long, device=device),
        torch.tensor(accepted_nodes, dtype=torch.long, device=device).reshape(batch, n),
        torch.tensor(next_token, dtype=torch.long, device=device),
    )
