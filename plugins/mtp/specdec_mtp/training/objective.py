"""DeepSeek-V3's MTP objective (technical report, section 2.2) on a frozen target's final states.

Depth ``k`` (1-based; layer ``min(k, n) - 1`` of ``n``) at position ``i`` reads depth ``k - 1``'s
output there (for ``k = 1`` the target's final normed state, which is what the drafter feeds it:
the runner's ``hidden_states[-1]``) and the embedding of token ``i + k``, and learns token
``i + k + 1``. There are ``D >= n`` depths, one per layer by default; past ``n`` the last layer
is trained again on its own outputs, which is how the drafter reuses it when ``max_draft_len``
exceeds the layers (vLLM's rule), so one layer can learn to draft several tokens. The
depths run in sequence over whole conversations (a batch right-padded, causal attention), each
over positions ``0 .. T - k - 2``, and gradients flow back through the chain as in DeepSeek's
joint training. A position counts only where its label is an assistant token (``loss_mask``),
which also rules out padding.

DeepSeek's ``L_MTP = lambda / D * sum_k L_k`` weighs the MTP losses against the main model's;
with the target frozen there is no main loss and Adam ignores a constant scale, so lambda is left
out: the objective is ``sum_k decay ** (k - 1) * L_k / D``, DeepSeek's equal weighting at the
default ``decay = 1``.

The vocabulary projection dominates the cost (49,152 x 576 per position and depth for
SmolLM2), so it runs only over the scored positions (and a training vocabulary may narrow the
softmax to the reply tokens that matter), ``chunk`` at a time, on a detached copy of
the depth's output: each chunk's loss is back-propagated at once into that copy (at most one
chunk's logits alive), and the gathered gradients enter the chain in one backward at the end.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from specdec.training import Scores, TrainingVocabulary, projection


@dataclass
class DepthScores(Scores):
    """Per depth: summed cross-entropy, top-1 hits and positions scored (over a batch or more)."""

    def weighted_loss(self, decay: float) -> float:
        """The training objective's value: ``sum_k decay ** (k - 1) * L_k / D``."""
        losses = self.losses()
        return sum(decay**k * loss for k, loss in enumerate(losses)) / max(1, len(losses))


def mtp_loss(layers: nn.ModuleList, embed: nn.Module, rotary: Callable[..., tuple[torch.Tensor, torch.Tensor]],
             hidden: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor, decay: float = 1.0,
             chunk: int = 1024, backward: bool = False, bf16: bool = False,
             vocabulary: TrainingVocabulary | None = None, depths: int | None = None) -> DepthScores:
    """Every depth's loss and top-1 hits over a right-padded batch.

    :param embed: the target's (frozen) input embedding; ``rotary``: its rotary embedding module.
    :param hidden: ``[B, T, hidden]`` the target's final normed states (no gradient).
    :param input_ids: ``[B, T]`` tokens; ``loss_mask`` ``[B, T]`` marks assistant tokens (False on padding).
    :param backward: back-propagate ``decay ** (k - 1) * L_k / D`` (training).
    :param bf16: matrix products in bfloat16 (autocast; weights and the summed losses stay float32).
    :param vocabulary: score over these tokens only (training; evaluation takes the whole vocabulary):
        a position whose label lies outside is not scored.
    :param depths: ``D``, at least ``len(layers)`` (default: equal); the last layer serves the depths past it.
    """
    batch, length = input_ids.shape
    depths = depths or len(layers)
    if depths < len(layers):
        raise ValueError(f"{depths} depths for {len(layers)} layers: every layer needs its depth")
    scores = DepthScores([], [], [])
    previous = hidden.float()
    roots: list[torch.Tensor] = []
    grads: list[torch.Tensor] = []
    for k in range(1, depths + 1):
        layer = layers[min(k, len(layers)) - 1]
        span = length - k - 1  # positions whose label, token i + k + 1, exists
        if span < 1:
            scores.loss_sums.append(0.0), scores.correct.append(0), scores.counts.append(0)
            continue
        positions = torch.arange(span, device=input_ids.device)[None].expand(batch, -1)
        with torch.autocast(input_ids.device.type, dtype=torch.bfloat16, enabled=bf16):
            embeds = embed(input_ids[:, k : k + span]).float()
            out = layer(embeds, previous[:, :span], positions, rotary(embeds, positions), None).float()
        labels = input_ids[:, k + 1 : k + 1 + span]
        scored = loss_mask[:, k + 1 : k + 1 + span].bool()
        if vocabulary is not None:
            labels = vocabulary.index[labels]
            scored &= labels >= 0
        rows, cols = scored.nonzero(as_tuple=True)
        head = projection(layer.shared_head.head, vocabulary)
        count = int(rows.numel())
        detached = out.detach().requires_grad_(backward)
        loss_sum, correct = 0.0, 0
        for start in range(0, count, chunk):
            r, c = rows[start : start + chunk], cols[start : start + chunk]
            with torch.autocast(input_ids.device.type, dtype=torch.bfloat16, enabled=bf16):
                logits = head(layer.shared_head.norm(detached[r, c]))
            want = labels[r, c]
            loss = F.cross_entropy(logits if bf16 else logits.float(), want, reduction="none").float().sum()
            if backward:
                (loss * (decay ** (k - 1) / (count * depths))).backward()
            loss_sum += float(loss.detach())
            correct += int((logits.detach().argmax(-1) == want).sum())
        if backward and detached.grad is not None:
            roots.append(out)
            grads.append(detached.grad)
        scores.loss_sums.append(loss_sum)
        scores.correct.append(correct)
        scores.counts.append(count)
        previous = out
    if roots:
        torch.autograd.backward(roots, grads)
    return scores
