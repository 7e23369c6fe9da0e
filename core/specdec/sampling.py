"""Sampling parameters and the one logits -> probabilities transform shared by target and drafts.

Rejection sampling is lossless only if the draft distribution q and the target distribution p
are shaped by the same temperature / top-k / top-p. Every drafter that produces logits calls
:func:`logits_to_probs` with the request's params, as the core does for the target.
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator


#: Temperatures below this are greedy decoding (vLLM's threshold).
GREEDY_BELOW = 1e-5


class SamplingParams(BaseModel):
    """How to pick tokens (vLLM's names). ``temperature == 0`` is greedy."""

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(default=0.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0, description="0 disables top-k.")
    max_tokens: int = Field(default=128, ge=1)
    stop: list[str] = Field(default_factory=list, description="Stop strings (excluded from text).")
    stop_token_ids: list[int] = Field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = Field(default=None, ge=-(2**63), le=2**64 - 1, description="What torch.Generator takes.")

    @field_validator("stop", mode="before")
    @classmethod
    def _one_stop_string(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    @field_validator("stop")
    @classmethod
    def _no_empty_stop_string(cls, value: list[str]) -> list[str]:
        if any(not s for s in value):
            raise ValueError("stop strings must not be empty")
        return value

    @property
    def greedy(self) -> bool:
        """Temperatures below ``GREEDY_BELOW`` decode greedily (as vLLM does): dividing logits by
        them overflows to a distribution with no finite value."""
        return self.temperature < GREEDY_BELOW


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """The greedy token at every position of ``[..., vocab]`` logits: ``argmax(-1)``, computed as
    ``max(-1).indices`` (the same first maximum on ties), which is about three times faster on CPU."""
    return logits.max(-1).indices


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Turn ``[..., vocab]`` logits into the sampling distribution ``params`` describes (fp32)."""
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(greedy_tokens(logits), logits.shape[-1]).float()
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        # Drop a token when the tokens ranked above it already reach top_p.
        drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from a 1-D distribution."""
    return int(torch.multinomial(probs, 1, generator=generator).item())
