"""The frozen target a drafter trainer learns from: its final normed states for a batch."""

from __future__ import annotations

from typing import Any

import torch


class FrozenTarget:
    """A target in eval mode with no gradients; called on a collated batch, its final normed
    states (what its ``lm_head`` reads), ``[batch, length, hidden]``: the batch's own ``hidden``
    when it carries them (a cache of the target's states), else a forward of its decoder."""

    def __init__(self, model: Any) -> None:
        self.model = model.eval().requires_grad_(False)
        self.device = next(model.parameters()).device

    @torch.no_grad()
    def __call__(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if "hidden" in batch:
            return batch["hidden"].to(self.device)
        ids = batch["input_ids"].to(self.device)
        attention = (torch.arange(ids.shape[1])[None] < batch["length"][:, None]).long().to(self.device)
        # The decoder alone: the target's own vocabulary projection over every position is not needed.
        return self.model.get_decoder()(input_ids=ids, attention_mask=attention, use_cache=False).last_hidden_state
