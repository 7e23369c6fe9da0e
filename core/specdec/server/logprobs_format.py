"""Output tokens' log-probabilities in OpenAI's two response shapes.

``/v1/completions`` (``logprobs: k``) answers in the legacy shape: parallel lists of token
strings, their log-probabilities, per position a dict of the likeliest tokens (the chosen one
included, as vLLM does, so ``k = 0`` still names it) and each token's character offset in the
choice's text. ``/v1/chat/completions`` (``logprobs: true``, ``top_logprobs: k``) answers with a
``content`` list of ``{token, logprob, bytes, top_logprobs}``. A token's string is its own
decoded text; ``bytes`` are that string's UTF-8 bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specdec.logprobs import TokenLogprob

#: A token id's own decoded text.
TokenText = Callable[[int], str]


def completion_logprobs(entries: list[TokenLogprob], text: TokenText, offset: int = 0) -> dict[str, Any]:
    """The legacy shape for ``entries``, their text offsets counted from ``offset``."""
    tokens = [text(e.token_id) for e in entries]
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    top = [{**{text(t): lp for t, lp in e.top}, token: e.logprob} for e, token in zip(entries, tokens)]
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries], "top_logprobs": top, "text_offset": offsets}


def chat_logprobs(entries: list[TokenLogprob], text: TokenText) -> dict[str, Any]:
    """The chat shape for ``entries``."""

    def item(token_id: int, logprob: float) -> dict[str, Any]:
        token = text(token_id)
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

    return {"content": [{**item(e.token_id, e.logprob), "top_logprobs": [item(t, lp) for t, lp in e.top]} for e in entries]}
