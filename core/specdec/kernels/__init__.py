"""Batched verify-step operations: Triton kernels on CUDA, the torch path elsewhere.

Three operations, each over a padded batch (one row per request):

- :func:`greedy_accept`: keep drafts while they equal the target's argmax.
- :func:`rejection_accept`: standard rejection sampling with recovered and bonus tokens.
- :func:`tree_accept`: greedy acceptance of the longest path in a draft tree.

:mod:`specdec.kernels.dispatch` picks the implementation per call from the tensors' device and
``SPECDEC_VERIFY_BACKEND``; :mod:`specdec.kernels.reference` is the torch path, and both give
identical results for identical inputs (random numbers are inputs too).
"""

from __future__ import annotations

import torch

from specdec.kernels import inputs
from specdec.kernels.dispatch import backend_for, describe, implementation, triton_status
from specdec.kernels.reference import Acceptance, TreeAcceptance

__all__ = [
    "Acceptance",
    "TreeAcceptance",
    "backend_for",
    "describe",
    "greedy_accept",
    "rejection_accept",
    "tree_accept",
    "triton_status",
]


def _counts(name: str, counts: torch.Tensor, batch: int, limit: int, device: torch.device) -> tuple[torch.Tensor, tuple[torch.Tensor, str]]:
    counts = inputs.ids(name, counts, (batch,), device)
    return counts, ((counts >= 0) & (counts <= limit), f"{name}: every count must lie in [0, {limit}]")


def greedy_accept(draft_ids: torch.Tensor, num_drafts: torch.Tensor, target_argmax: torch.Tensor) -> Acceptance:
    """Greedy verification of draft chains.

    :param draft_ids: ``[B, K]`` integer drafts; row ``b`` is read up to ``num_drafts[b]``.
    :param num_drafts: ``[B]`` drafts per request, each in ``[0, K]``.
    :param target_argmax: ``[B, K + 1]``: column ``i`` is the target's argmax after draft ``i - 1``
        (column 0: after the request's last committed token).
    :return: :class:`Acceptance`: ``num_accepted`` ``[B]`` (the drafts before the first mismatch)
        and ``output_ids`` ``[B, K + 1]`` (those drafts, then the target's argmax after them, then
        ``-1`` padding).
    """
    batch, k = inputs.matrix("draft_ids", draft_ids)
    device = draft_ids.device
    draft_ids = inputs.ids("draft_ids", draft_ids, (batch, k), device)
    num_drafts, in_range = _counts("num_drafts", num_drafts, batch, k, device)
    target_argmax = inputs.ids("target_argmax", target_argmax, (batch, k + 1), device)
    inputs.require([in_range])
    return implementation(device).greedy_accept(draft_ids, num_drafts, target_argmax)


def rejection_accept(
    draft_ids: torch.Tensor,
    num_drafts: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    uniform: torch.Tensor,
    exponential: torch.Tensor,
) -> Acceptance:
    """Rejection sampling of draft chains (Leviathan et al. 2023; Chen et al. 2023): lossless.

    Draft ``i`` is kept with probability ``min(1, p_i(x) / q_i(x))`` (tested as ``u * q < p``);
    at the first rejection the next token is drawn from ``norm(max(p_i - q_i, 0))`` (from ``p_i``
    when that is empty, i.e. ``p_i == q_i``), and when every draft is kept, the bonus token from
    ``p_K``. Draws use the exponential race ``argmax(w / E)``, a draw from ``norm(w)`` for
    ``E ~ Exp(1)``, so every random number is an input and results are reproducible.

    :param draft_ids: ``[B, K]`` integer drafts, each in ``[0, V)`` up to ``num_drafts[b]``.
    :param num_drafts: ``[B]`` drafts per request, each in ``[0, K]``.
    :param draft_probs: ``[B, K, V]``: the distribution each draft was sampled from, or ``None``
        for deterministic drafts (one-hot ``q``, e.g. n-gram).
    :param target_probs: ``[B, K + 1, V]``: the target's distributions, shaped by the request's
        sampling params (:func:`specdec.sampling.logits_to_probs`). fp32, fp16 or bf16 (computed
        in fp32).
    :param uniform: ``[B, K]`` draws from U[0, 1), one per draft.
    :param exponential: ``[B, V]`` draws from Exp(1), one per vocabulary entry.
    :return: :class:`Acceptance`, as for :func:`greedy_accept`.
    """
    batch, k = inputs.matrix("draft_ids", draft_ids)
    device = draft_ids.device
    vocab = inputs.vocab_size("target_probs", target_probs, batch, k + 1)
    draft_ids = inputs.ids("draft_ids", draft_ids, (batch, k), device)
    num_drafts, in_range = _counts("num_drafts", num_drafts, batch, k, device)
    target_probs = inputs.probs("target_probs", target_probs, (batch, k + 1, vocab), device)
    if draft_probs is not None:
        draft_probs = inputs.probs("draft_probs", draft_probs, (batch, k, vocab), device)
    uniform = inputs.randoms("uniform", uniform, (batch, k), device)
    exponential = inputs.randoms("exponential", exponential, (batch, vocab), device)
    is_draft = torch.arange(k, device=device) < num_drafts[:, None]
    in_vocab = ~is_draft | ((draft_ids >= 0) & (draft_ids < vocab))
    inputs.require([in_range, (in_vocab, f"draft_ids: every draft must lie in [0, {vocab})")])
    return implementation(device).rejection_accept(draft_ids, num_drafts, draft_probs, target_probs, uniform, exponential)


def tree_accept(
    node_ids: torch.Tensor, parents: torch.Tensor, num_nodes: torch.Tensor, target_argmax: torch.Tensor
) -> TreeAcceptance:
    """Greedy verification of draft trees: the longest path whose every node is the target's argmax.

    Each request's tree is laid out flat, as for :func:`specdec.runner.tree_attention`. Node ``i``
    is accepted when its parent is accepted (the root always is) and its token equals the
    target's argmax at its parent. Among the deepest accepted nodes the lowest index wins.

    :param node_ids: ``[B, N]`` node tokens; row ``b`` is read up to ``num_nodes[b]``.
    :param parents: ``[B, N]`` the parent index of each node, ``-1`` for a child of the root
        (the last committed token); a parent comes before its child.
    :param num_nodes: ``[B]`` nodes per request, each in ``[0, N]``.
    :param target_argmax: ``[B, N + 1]``: column 0 is the target's argmax at the root, column
        ``i + 1`` its argmax at node ``i``.
    :return: :class:`TreeAcceptance`: ``num_accepted`` ``[B]`` (path length), ``accepted_nodes``
        ``[B, N]`` (the path's node indices from the root down, ``-1`` padding) and
        ``next_token`` ``[B]`` (the target's argmax after the path).
    """
    batch, n = inputs.matrix("node_ids", node_ids)
    device = node_ids.device
    node_ids = inputs.ids("node_ids", node_ids, (batch, n), device)
    parents = inputs.ids("parents", parents, (batch, n), device)
    num_nodes, in_range = _counts("num_nodes", num_nodes, batch, n, device)
    target_argmax = inputs.ids("target_argmax", target_argmax, (batch, n + 1), device)
    position = torch.arange(n, device=device)
    ordered = (position >= num_nodes[:, None]) | ((parents >= -1) & (parents < position))
    inputs.require([in_range, (ordered, "parents: each parent must be -1 or an earlier node's index")])
    return implementation(device).tree_accept(node_ids, parents, num_nodes, target_argmax)
