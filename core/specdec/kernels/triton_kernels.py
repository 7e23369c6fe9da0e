"""Triton kernels for the verify step: one program per request, inputs batched and padded.

They compute exactly what :mod:`specdec.kernels.reference` computes (float32 inside, whatever
the input dtype; divisions rounded to nearest as torch does, and launched with
``enable_fp_fusion=False`` so no multiply-add is fused), so results compare bit for bit.
Importing this module imports triton; :mod:`specdec.kernels.dispatch` does so only when the
kernels are used. Under ``TRITON_INTERPRET=1`` (set before this import) they run on CPU tensors.

Each program writes every output element once, computed in registers: two stores to the same
address from one program would race between its threads on a GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.kernels.reference import Acceptance, TreeAcceptance

#: Largest vocabulary chunk a rejection-sampling program scans per loop iteration.
MAX_BLOCK_V = 1024


@triton.jit
def greedy_accept_kernel(
    draft_ids_ptr, num_drafts_ptr, target_argmax_ptr, num_accepted_ptr, output_ids_ptr,
    K, BLOCK_K: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_K)
    num_drafts = tl.load(num_drafts_ptr + b)
    is_draft = cols < num_drafts
    drafts = tl.load(draft_ids_ptr + b * K + cols, mask=is_draft, other=0)
    argmax = tl.load(target_argmax_ptr + b * (K + 1) + cols, mask=cols <= num_drafts, other=0)
    num_accepted = tl.min(tl.where(is_draft & (drafts != argmax), cols, num_drafts))
    out = tl.where(cols < num_accepted, drafts, tl.where(cols == num_accepted, argmax, -1))
    tl.store(num_accepted_ptr + b, num_accepted)
    tl.store(output_ids_ptr + b * (K + 1) + cols, out, mask=cols < K + 1)


@triton.jit
def rejection_accept_kernel(
    draft_ids_ptr, num_drafts_ptr, draft_probs_ptr, target_probs_ptr, uniform_ptr, exponential_ptr,
    num_accepted_ptr, output_ids_ptr,
    K, V, HAS_DRAFT_PROBS: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_K)
    num_drafts = tl.load(num_drafts_ptr + b)
    is_draft = cols < num_drafts
    drafts = tl.load(draft_ids_ptr + b * K + cols, mask=is_draft, other=0)
    p_draft = tl.load(target_probs_ptr + (b * (K + 1) + cols) * V + drafts, mask=is_draft, other=0.0).to(tl.float32)
    if HAS_DRAFT_PROBS:
        q_draft = tl.load(draft_probs_ptr + (b * K + cols) * V + drafts, mask=is_draft, other=1.0).to(tl.float32)
    else:
        q_draft = tl.full([BLOCK_K], 1.0, tl.float32)
    uniform = tl.load(uniform_ptr + b * K + cols, mask=is_draft, other=0.0).to(tl.float32)
    # Accept iff u < p/q, written as u * q < p to stay exact when q == 1.
    rejected = is_draft & (uniform * q_draft >= p_draft)
    num_accepted = tl.min(tl.where(rejected, cols, num_drafts))
    recovering = num_accepted < num_drafts
    q_width = tl.where(recovering, V, 0)  # the bonus token has no draft row: q = 0
    rejected_draft = tl.sum(tl.where(cols == num_accepted, drafts, 0))

    # Sample from norm(max(p - q, 0)) at the first rejection (q = 0 for the bonus token), and
    # from p in the same pass in case that residual is empty (p == q), by the exponential race
    # argmax(w / E). Per lane: best score so far and its index; strict > keeps the lowest index.
    p_row = target_probs_ptr + (b * (K + 1) + num_accepted) * V
    q_row = draft_probs_ptr + (b * K + num_accepted) * V
    best_residual = tl.full([BLOCK_V], -3.0, tl.float32)
    best_residual_at = tl.zeros([BLOCK_V], tl.int64)
    best_p = tl.full([BLOCK_V], -3.0, tl.float32)
    best_p_at = tl.zeros([BLOCK_V], tl.int64)
    for start in range(0, V, BLOCK_V):
        vocab = start + tl.arange(0, BLOCK_V).to(tl.int64)
        in_vocab = vocab < V
        p = tl.load(p_row + vocab, mask=in_vocab, other=0.0).to(tl.float32)
        if HAS_DRAFT_PROBS:
            q = tl.load(q_row + vocab, mask=vocab < q_width, other=0.0).to(tl.float32)
        else:
            q = tl.where(recovering & (vocab == rejected_draft), 1.0, 0.0)
        residual = tl.maximum(p - q, 0.0)
        e = tl.load(exponential_ptr + b * V + vocab, mask=in_vocab, other=1.0).to(tl.float32)
        residual_score = tl.where(in_vocab, tl.where(residual > 0, tl.div_rn(residual, e), -1.0), -3.0)
        p_score = tl.where(in_vocab, tl.where(p > 0, tl.div_rn(p, e), -1.0), -3.0)
        better = residual_score > best_residual
        best_residual = tl.where(better, residual_score, best_residual)
        best_residual_at = tl.where(better, vocab, best_residual_at)
        better = p_score > best_p
        best_p = tl.where(better, p_score, best_p)
        best_p_at = tl.where(better, vocab, best_p_at)
    top_residual = tl.max(best_residual)
    residual_token = tl.min(tl.where(best_residual == top_residual, best_residual_at, V))
    p_token = tl.min(tl.where(best_p == tl.max(best_p), best_p_at, V))
    next_token = tl.where(top_residual >= 0.0, residual_token, p_token)

    out = tl.where(cols < num_accepted, drafts, tl.where(cols == num_accepted, next_token, -1))
    tl.store(num_accepted_ptr + b, num_accepted)
    tl.store(output_ids_ptr + b * (K + 1) + cols, out, mask=cols < K + 1)


@triton.jit
def tree_accept_kernel(
    node_ids_ptr, parents_ptr, num_nodes_ptr, target_argmax_ptr,
    num_accepted_ptr, accepted_nodes_ptr, next_token_ptr,
    N, BLOCK_N: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    nodes = tl.arange(0, BLOCK_N)
    num_nodes = tl.load(num_nodes_ptr + b)
    is_node = nodes < num_nodes
    tokens = tl.load(node_ids_ptr + b * N + nodes, mask=is_node, other=-1)
    parents = tl.load(parents_ptr + b * N + nodes, mask=is_node, other=-1)
    root_argmax = tl.load(target_argmax_ptr + b * (N + 1))
    node_argmax = tl.load(target_argmax_ptr + b * (N + 1) + 1 + nodes, mask=is_node, other=-1)

    # depth[i]: length of the accepted path ending at node i, 0 if node i is not accepted.
    # Parents come before children, so one pass in node order settles every node.
    depth = tl.zeros([BLOCK_N], tl.int32)
    for i in range(0, num_nodes):
        here = nodes == i
        parent = tl.sum(tl.where(here, parents, 0))
        at_parent = nodes == parent
        from_root = parent < 0
        parent_depth = tl.sum(tl.where(at_parent, depth, 0))
        prediction = tl.where(from_root, root_argmax, tl.sum(tl.where(at_parent, node_argmax, 0)))
        accepted = (from_root | (parent_depth > 0)) & (tl.sum(tl.where(here, tokens, 0)) == prediction)
        depth = tl.where(here, tl.where(accepted, parent_depth + 1, 0), depth)

    num_accepted = tl.max(depth)
    best = tl.min(tl.where(depth == num_accepted, nodes, BLOCK_N))
    next_token = tl.where(num_accepted > 0, tl.sum(tl.where(nodes == best, node_argmax, 0)), root_argmax)

    on_path = nodes < 0
    node = tl.where(num_accepted > 0, best, -1).to(tl.int64)
    for _ in range(0, num_nodes):
        at_node = nodes == node
        on_path = on_path | at_node
        node = tl.where(node >= 0, tl.sum(tl.where(at_node, parents, 0)), -1)
    # Column c of the output holds the path node of depth c + 1.
    cols = tl.arange(0, BLOCK_N)
    hit = on_path[None, :] & (depth[None, :] - 1 == cols[:, None])
    accepted_nodes = tl.max(tl.where(hit, nodes[None, :], -1), axis=1)
    tl.store(num_accepted_ptr + b, num_accepted)
    tl.store(next_token_ptr + b, next_token)
    tl.store(accepted_nodes_ptr + b * N + cols, accepted_nodes, mask=cols < N)


def _block(size: int) -> int:
    return triton.next_power_of_2(max(size, 1))


def _dense(*tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    """The kernels index rows as ``row * width``: they need contiguous tensors."""
    return [t.contiguous() if t is not None else None for t in tensors]


def greedy_accept(draft_ids: torch.Tensor, num_drafts: torch.Tensor, target_argmax: torch.Tensor) -> Acceptance:
    batch, k = draft_ids.shape
    draft_ids, num_drafts, target_argmax = _dense(draft_ids, num_drafts, target_argmax)
    num_accepted = torch.empty(batch, dtype=torch.long, device=draft_ids.device)
    output_ids = torch.empty(batch, k + 1, dtype=torch.long, device=draft_ids.device)
    if batch:
        greedy_accept_kernel[(batch,)](
            draft_ids, num_drafts, target_argmax, num_accepted, output_ids, k, BLOCK_K=_block(k + 1), num_warps=1, enable_fp_fusion=False
        )
    return Acceptance(num_accepted, output_ids)


def rejection_accept(
    draft_ids: torch.Tensor,
    num_drafts: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    uniform: torch.Tensor,
    exponential: torch.Tensor,
) -> Acceptance:
    batch, k = draft_ids.shape
    vocab = target_probs.shape[-1]
    draft_ids, num_drafts, draft_probs, target_probs, uniform, exponential = _dense(
        draft_ids, num_drafts, draft_probs, target_probs, uniform, exponential
    )
    num_accepted = torch.empty(batch, dtype=torch.long, device=draft_ids.device)
    output_ids = torch.empty(batch, k + 1, dtype=torch.long, device=draft_ids.device)
    if batch:
        rejection_accept_kernel[(batch,)](
            draft_ids, num_drafts, draft_probs if draft_probs is not None else target_probs, target_probs,
            uniform, exponential, num_accepted, output_ids, k, vocab,
            HAS_DRAFT_PROBS=draft_probs is not None, BLOCK_K=_block(k + 1), BLOCK_V=min(MAX_BLOCK_V, _block(vocab)), num_warps=4, enable_fp_fusion=False,
        )
    return Acceptance(num_accepted, output_ids)


def tree_accept(
    node_ids: torch.Tensor, parents: torch.Tensor, num_nodes: torch.Tensor, target_argmax: torch.Tensor
) -> TreeAcceptance:
    batch, n = node_ids.shape
    device = node_ids.device
    node_ids, parents, num_nodes, target_argmax = _dense(node_ids, parents, num_nodes, target_argmax)
    num_accepted = torch.empty(batch, dtype=torch.long, device=device)
    accepted_nodes = torch.empty(batch, n, dtype=torch.long, device=device)
    next_token = torch.empty(batch, dtype=torch.long, device=device)
    if batch:
        block = _block(n)
        tree_accept_kernel[(batch,)](
            node_ids, parents, num_nodes, target_argmax, num_accepted, accepted_nodes, next_token,
            n, BLOCK_N=block, num_warps=4 if block >= 64 else 1, enable_fp_fusion=False,  # [block, block] path table
        )
    return TreeAcceptance(num_accepted, accepted_nodes, next_token)
