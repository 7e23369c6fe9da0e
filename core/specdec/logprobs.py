"""Log-probabilities of the output tokens (``SamplingParams.logprobs``), as vLLM returns them.

They are the target's raw distribution at each output position: ``log_softmax`` of the target's
logits before temperature, top-k and top-p (vLLM's default ``raw_logprobs``), from the forward
that chose the token. With speculative decoding that forward is the verify forward: the logits
row of an emitted token is the row of its predecessor (the request's last token for the first,
then each kept draft), the very row plain decoding would have chosen it from.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

#: The most alternatives per position a request may ask for (vLLM's default ``max_logprobs``).
MAX_LOGPROBS = 20


@dataclass
class TokenLogprob:
    """One output token's log-probability, and the ``k`` likeliest tokens' at its position."""

    token_id: int
    logprob: float
    #: ``(token id, log-probability)``, likeliest first (``SamplingParams.logprobs`` of them).
    top: list[tuple[int, float]] = field(default_factory=list)


def token_logprobs(logits: torch.Tensor, tokens: list[int], k: int) -> list[TokenLogprob]:
    """For ``tokens[i]`` chosen from the distribution of ``logits[i]`` (``[len(tokens), vocab]``),
    its log-probability and the ``k`` likeliest tokens' (one host transfer for all)."""
    logprobs = torch.log_softmax(logits[: len(tokens)].float(), dim=-1)
    chosen = logprobs.gather(-1, torch.tensor(tokens, device=logits.device)[:, None])[:, 0]
    if k:
        values, ids = logprobs.topk(min(k, logprobs.shape[-1]), dim=-1)
        top = [list(zip(i, v)) for i, v in zip(ids.tolist(), values.tolist())]
    else:
        top = [[] for _ in tokens]
    return [TokenLogprob(t, lp, alternatives) for t, lp, alternatives in zip(tokens, chosen.tolist(), top)]
