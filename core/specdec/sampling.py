"""Sampling parameters, the one logits -> probabilities transform shared by target and drafts, and
the random numbers of seeded requests.

Rejection sampling is lossless only if the draft distribution q and the target distribution p
are shaped by the same temperature / top-k / top-p. Every drafter that produces logits calls
:func:`logits_to_probs` with the request's params, as the core does for the target.

A seeded request draws each token from its own position's noise (:class:`PositionNoise`), so
its output depends on the seed and the prompt only: not on the batch, the draft lengths the
policy chose, what was drafted, or how many times it ran.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from specdec.kernels.reference import sample_by_race
from specdec.logprobs import MAX_LOGPROBS
from specdec.structured_outputs import StructuredOutputsParams


#: Temperatures below this are greedy decoding (vLLM's threshold).
GREEDY_BELOW = 1e-5


class SamplingParams(BaseModel):
    """How to pick tokens (vLLM's names). ``temperature == 0`` is greedy."""

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(default=0.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0, description="0 disables top-k.")
    min_p: float = Field(default=0.0, ge=0.0, le=1.0,
                         description="Drop tokens less likely than this fraction of the likeliest token's "
                                     "probability (after temperature); 0 disables it.")
    max_tokens: int = Field(default=128, ge=1)
    stop: list[str] = Field(default_factory=list, description="Stop strings (excluded from text unless "
                                                              "include_stop_str_in_output).")
    include_stop_str_in_output: bool = Field(default=False, description="Keep the stop string that ended the "
                                                                        "output in its text.")
    stop_token_ids: list[int] = Field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = Field(default=None, ge=-(2**63), le=2**64 - 1, description="What torch.Generator takes.")
    logprobs: int | None = Field(
        default=None, ge=0, le=MAX_LOGPROBS,
        description="Return each output token's log-probability under the target (raw logits) and this many "
                    "likeliest tokens' at its position; None returns none.",
    )

    # Logits processing (specdec.logits_processing): vLLM's names and ranges.
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0, description="1 is off; above 1 discourages repeats.")
    logit_bias: dict[int, float] | None = Field(default=None, description="Token id -> added to its logit.")
    min_tokens: int = Field(default=0, ge=0, description="No EOS or stop token before this many tokens.")
    bad_words: list[str] = Field(default_factory=list, description="Words never generated.")
    structured_outputs: StructuredOutputsParams | None = None
    #: Arguments for plugins' own logits processors (``specdec_logits_processors``).
    extra_args: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _min_tokens_fit(self) -> SamplingParams:
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        return self

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
    """Turn ``[..., vocab]`` logits into the sampling distribution ``params`` describes (fp32):
    temperature, then ``min_p``, ``top_k`` and ``top_p``, in vLLM's order."""
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(greedy_tokens(logits), logits.shape[-1]).float()
    logits = logits / params.temperature
    if params.min_p > 0.0:
        # p_i >= min_p * p_max, compared in log space: logit_i >= logit_max + log(min_p).
        floor = logits.max(-1, keepdim=True).values + math.log(params.min_p)
        logits = logits.masked_fill(logits < floor, float("-inf"))
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


def invalid_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per row of ``[..., vocab]`` logits: whether it holds a NaN or ``+inf`` (``-inf`` masks a
    token and is allowed). One pass: such a row's sum is NaN or ``+inf``."""
    total = logits.float().sum(-1)
    return total.isnan() | total.isposinf()


_MASK64 = (1 << 64) - 1


def _position_seed(seed: int, position: int) -> int:
    """A 64-bit seed for ``position`` of a request seeded with ``seed`` (SplitMix64's finalizer,
    so neighbouring positions and seeds get unrelated streams)."""
    z = (seed + (position + 1) * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


class PositionNoise:
    """The Exp(1) noise of each sequence position of one seeded request.

    The token at position ``t`` is ``argmax(p / E_t)`` (an exponential race: a draw from ``p``)
    with ``E_t`` drawn from a CPU generator seeded by ``(seed, t)``. Plain decoding, every
    speculative step and the verifier read the same ``E_t``, so a seeded request's output is the
    same token for token whatever was drafted, and a drafter that samples its draft for position
    ``t`` with ``E_t`` too (:meth:`specdec.requests.Request.sample`) proposes the token the target
    will pick whenever both distributions agree on it (a Gumbel-max coupling).

    Noise for positions not yet committed is kept for the step that needs it again;
    :meth:`forget_before` drops the rest.
    """

    def __init__(self, seed: int, vocab_size: int) -> None:
        self.seed = seed
        self.vocab_size = vocab_size
        self._noise: dict[int, torch.Tensor] = {}

    def at(self, position: int) -> torch.Tensor:
        """``E_position``: ``[vocab]`` float32 on the CPU."""
        noise = self._noise.get(position)
        if noise is None:
            generator = torch.Generator().manual_seed(_position_seed(self.seed, position))
            noise = exponential_noise(self.vocab_size, generator)
            self._noise[position] = noise
        return noise

    def forget_before(self, position: int) -> None:
        """Drop the noise of positions before ``position`` (they are committed)."""
        for old in [p for p in self._noise if p < position]:
            del self._noise[old]


def exponential_noise(size: int, generator: torch.Generator | None, device: torch.device | str = "cpu") -> torch.Tensor:
    """``size`` Exp(1) variates as ``-log(U)``, ``U ~ U[0, 1)``: several times faster than
    ``Tensor.exponential_`` on CPU. ``U == 0`` (one draw in 2**24) gives ``inf``, so that token
    simply cannot win the race; ``-log(1 - U)`` would give ``0`` instead, and that token would win
    whatever its probability."""
    return torch.rand(size, generator=generator, device=device).log_().neg_()


def race(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """``argmax(p / E)`` over the last dim: the token ``noise`` draws from ``probs``."""
    return sample_by_race(probs.float(), noise.to(probs.device))
