"""Medusa heads: per head, residual SiLU blocks over the target's last hidden state, then a vocabulary projection.

Head ``k`` (0-based) reads the final normed hidden state at the position that predicted the
last committed token and predicts the token ``k + 1`` places after that one, i.e. the draft at
depth ``k + 1`` of the tree.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from specdec import ConfigError, full_logits, trimmed_projection


class ResidualBlock(nn.Module):
    """``x + SiLU(W x + b)``, the block both published layouts stack ``num_layers`` deep."""

    def __init__(self, hidden_size: int, bias: bool = True) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """``num_heads`` heads of ``num_layers`` residual blocks each and a bias-free projection
    onto ``head_vocab_size`` tokens; ``token_map`` (vLLM's truncated vocabulary) maps a head's
    token index to the target's id, ``None`` when the heads cover the whole vocabulary.

    With ``shared_lm_head`` (the target's own output weight ``[vocab, hidden]``) every head
    projects through that one frozen layer and is its residual blocks only: a separate projection
    per head costs a whole vocabulary matrix (28M parameters for SmolLM2-135M).
    """

    def __init__(
        self, num_heads: int, num_layers: int, hidden_size: int, head_vocab_size: int, bias: bool = True,
        token_map: torch.Tensor | None = None, shared_lm_head: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(*(ResidualBlock(hidden_size, bias) for _ in range(num_layers))) for _ in range(num_heads)
        )
        #: Whether the heads project through the target's output layer (``shared_lm_head``).
        self.uses_target_lm_head = shared_lm_head is not None
        if shared_lm_head is None:
            self.lm_heads = nn.ModuleList(nn.Linear(hidden_size, head_vocab_size, bias=False) for _ in range(num_heads))
        else:
            shared = nn.Linear(hidden_size, head_vocab_size, bias=False, device="meta")
            shared.weight = nn.Parameter(shared_lm_head.detach(), requires_grad=False)
            self.lm_heads = nn.ModuleList([shared] * num_heads)
        self.register_buffer("token_map", token_map, persistent=False)

    @property
    def num_heads(self) -> int:
        return len(self.blocks)

    def narrow_vocabulary(self, kept: torch.Tensor) -> None:
        """Project onto the target ids ``kept`` only (a draft vocabulary, :mod:`specdec.draft_vocab`):
        each projection keeps their rows, one shared copy for heads that share the target's.
        Call once the heads are on their device and in their dtype."""
        if self.token_map is not None:
            raise ConfigError("draft_vocab_size: these heads already project onto a truncated vocabulary (their token_map)")
        if self.uses_target_lm_head:
            shared = trimmed_projection(self.lm_heads[0], kept)
            self.lm_heads = nn.ModuleList([shared] * self.num_heads)
        else:
            self.lm_heads = nn.ModuleList(trimmed_projection(head, kept) for head in self.lm_heads)
        self.token_map = kept.to(self.lm_heads[0].weight.device)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Head logits ``[num_heads, N, head_vocab_size]`` (float32) for hidden states ``[N, hidden]``.

        Heads that share one projection go through it in one call: a decoding step's projection
        reads its whole weight for a handful of rows, so one read serves every head.
        """
        if self.uses_target_lm_head:
            rows = torch.cat([block(hidden) for block in self.blocks])  # [num_heads * N, hidden]
            return self.lm_heads[0](rows).float().view(self.num_heads, hidden.shape[0], -1)
        return torch.stack([lm_head(block(hidden)).float() for block, lm_head in zip(self.blocks, self.lm_heads)])

    def target_ids(self, head_ids: torch.Tensor) -> torch.Tensor:
        """The target's token ids for head vocabulary indices."""
        return head_ids if self.token_map is None else self.token_map[head_ids]

    def full_logits(self, logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """Head logits placed at their target ids, ``-inf`` elsewhere: ``[..., vocab_size]``."""
        return full_logits(logits, self.token_map, vocab_size)
