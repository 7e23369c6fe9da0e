"""Where a training batch's target signals come from: a dump (offline) or the live target (online).

Either way a batch becomes the same tensors for :func:`~specdec_eagle3.training.ttt.ttt_forward`:
token ids, assistant mask, fused features, the target's logits over the draft vocabulary and its
greedy token over the full vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional as F

from specdec_eagle3.training.dump import target_states


@dataclass
class TargetSignals:
    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    features: torch.Tensor
    draft_logits: torch.Tensor
    target_argmax: torch.Tensor


class OfflineTarget:
    """Signals from a dump: logits are the stored final states times the target's output rows
    for the draft vocabulary (never the full vocabulary)."""

    def __init__(self, tensors: dict[str, torch.Tensor], device: torch.device) -> None:
        self.embedding = tensors["embed_tokens.weight"].to(device, torch.float32)
        self.lm_head = tensors["lm_head.weight"].to(device, torch.float32)
        self.device = device
        self.draft_rows: torch.Tensor | None = None

    def use_draft_vocabulary(self, draft_ids: torch.Tensor) -> None:
        self.draft_rows = self.lm_head[draft_ids.to(self.device)]

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.embedding)

    def signals(self, batch: dict[str, torch.Tensor]) -> TargetSignals:
        on = {name: t.to(self.device) for name, t in batch.items()}
        return TargetSignals(
            on["input_ids"], on["loss_mask"], on["features"].float(),
            F.linear(on["final_hidden"].float(), self.draft_rows), on["target_argmax"],
        )


class OnlineTarget:
    """Signals from a target forward in the same step (its weights frozen)."""

    def __init__(self, model: Any, layers: tuple[int, ...]) -> None:
        self.model = model.eval().requires_grad_(False)
        self.layers = layers
        self.device = next(model.parameters()).device
        self.draft_rows: torch.Tensor | None = None

    def use_draft_vocabulary(self, draft_ids: torch.Tensor) -> None:
        self.draft_rows = self.model.get_output_embeddings().weight[draft_ids.to(self.device)].float()

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(ids).float()

    @torch.no_grad()
    def signals(self, batch: dict[str, torch.Tensor]) -> TargetSignals:
        ids = batch["input_ids"].to(self.device)
        lengths = [int(n) for n in batch["length"]]
        attention = (torch.arange(ids.shape[1])[None] < torch.tensor(lengths)[:, None]).long().to(self.device)
        states = target_states(self.model, ids, attention, self.layers)
        logits = F.linear(states["final_hidden"].float(), self.draft_rows)
        return TargetSignals(ids, batch["loss_mask"].to(self.device), states["features"].float(), logits,
                             states["target_argmax"])
