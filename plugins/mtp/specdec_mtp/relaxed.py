"""TensorRT-LLM's relaxed acceptance inside thinking spans: NOT lossless, opt-in.

A draft generated inside a thinking span (the tokens before it, the request's and the drafts
before it, have a begin token after the last end token) is kept when the core's lossless rule
keeps it, or else when it is among the target's ``relaxed_topk`` tokens and
``log p(top 1) - log p(draft) <= relaxed_delta``. A draft that is itself the end token is still
inside; the drafts after it are not. Outside a span verification is the core's, exactly.

TensorRT-LLM ranks the candidates by the target's logits and takes its top 1 as the next token,
whatever the request's sampling. Here greedy requests do the same (``p`` is the softmax of the
logits, the next token their argmax), while sampled requests keep their own rule: ``p`` is the
distribution the request samples from (temperature, top-k, top-p: a token it could never sample
is never kept) and the token after the kept drafts comes from the core's verification of the
rest of the chain (rejection sampling, or the seeded pick), so outside thinking spans a sampled
request's output still follows the target's.

A draft kept only by the relaxed test counts in :attr:`VerifyResult.num_lossy_accepted`; the core
verifies the drafts after it anew, from the prefix that now includes it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from specdec import ConfigError, DraftProposal, Request, VerifyResult, logits_to_probs, verify_requests

#: The tokens that open and close a thinking span by default, when the tokenizer has them.
DEFAULT_THINKING_TOKENS = ("<think>", "</think>")


@dataclasses.dataclass
class ThinkingSpan:
    """Whether a request's tokens leave a thinking span open, read only past the tokens seen last
    time (a request's tokens only grow)."""

    begin: int
    end: int
    is_open: bool = False
    scanned: int = 0

    def after(self, token_ids: list[int]) -> bool:
        """Whether a span is open after ``token_ids``."""
        for token in token_ids[self.scanned :]:
            self.is_open = self.then(self.is_open, token)
        self.scanned = len(token_ids)
        return self.is_open

    def then(self, is_open: bool, token: int) -> bool:
        """Whether a span is open after ``token``, given whether it was before."""
        return True if token == self.begin else False if token == self.end else is_open


def thinking_tokens(begin: int | None, end: int | None, tokenizer: Any, vocab_size: int) -> tuple[int, int]:
    """The begin and end token ids: the options, else the tokenizer's ``<think>`` and ``</think>``."""
    vocab = tokenizer.get_vocab() if tokenizer is not None else {}
    ids = []
    for field, given, token in zip(("begin_thinking_phase_token", "end_thinking_phase_token"), (begin, end),
                                   DEFAULT_THINKING_TOKENS):
        found = given if given is not None else vocab.get(token)
        if found is None:
            raise ConfigError(
                f"{field}: relaxed acceptance needs the thinking span's tokens, and the tokenizer has no {token}; "
                "set the token id"
            )
        if found >= vocab_size:
            raise ConfigError(f"{field}: token id {found} is outside the target's vocabulary of {vocab_size}")
        ids.append(found)
    if ids[0] == ids[1]:
        raise ConfigError(f"end_thinking_phase_token: {ids[1]} is also the begin token; a span needs two tokens")
    return ids[0], ids[1]


def relaxed_verify(
    requests: list[Request], proposals: list[DraftProposal], target_logits: list[torch.Tensor],
    spans: list[ThinkingSpan], topk: int, delta: float,
) -> list[VerifyResult]:
    """One result per request (chains only): the core's verification, relaxed inside thinking spans."""
    exact = verify_requests(requests, proposals, target_logits)
    return [
        _relaxed(*row, topk, delta) for row in zip(requests, proposals, target_logits, spans, exact)
    ]


def _relaxed(request: Request, proposal: DraftProposal, logits: torch.Tensor, span: ThinkingSpan, result: VerifyResult,
             topk: int, delta: float) -> VerifyResult:
    drafts = proposal.token_ids
    if result.num_accepted == len(drafts):
        return result
    inside = [span.after(request.token_ids)]
    for token in drafts[:-1]:
        inside.append(span.then(inside[-1], token))
    kept, lossy = result.num_accepted, 0
    while kept < len(drafts) and inside[kept] and near_top(logits[kept], drafts[kept], request, topk, delta):
        kept += 1
        lossy += 1
        rest = DraftProposal(drafts[kept:], proposal.probs[kept:] if proposal.probs is not None else None)
        ahead = dataclasses.replace(request, token_ids=request.token_ids + drafts[:kept])
        result = verify_requests([ahead], [rest], [logits[kept:]])[0]
        kept += result.num_accepted
    return VerifyResult(kept, result.next_token, num_lossy_accepted=lossy) if lossy else result


def near_top(logits: torch.Tensor, token: int, request: Request, topk: int, delta: float) -> bool:
    """Whether ``token`` is among the top ``topk`` of ``logits`` (``[V]``) with a log-probability
    at most ``delta`` below the top one's, in the request's distribution (the logits' softmax when
    it is greedy)."""
    if request.params.greedy:
        logprobs = torch.log_softmax(logits.float(), dim=-1)
    else:
        logprobs = torch.log(logits_to_probs(logits, request.params))
    top = torch.topk(logprobs, min(topk, logprobs.shape[-1]))
    return bool((top.indices == token).any()) and float(top.values[0] - logprobs[token]) <= delta
