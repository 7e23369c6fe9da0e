"""Stop conditions, checked after every appended token so a stop inside a run of accepted
drafts ends the output exactly where plain decoding would."""

from __future__ import annotations

from typing import Any

from specdec.requests import Request


class StopChecker:
    def __init__(self, tokenizer: Any, eos_token_ids: set[int], max_length: int) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.max_length = max_length

    def check(self, request: Request) -> str | None:
        """The finish reason if ``request``'s newest token ends it: ``stop`` or ``length``."""
        params = request.params
        token = request.token_ids[-1]
        if (not params.ignore_eos and token in self.eos_token_ids) or token in params.stop_token_ids:
            return "stop"
        if params.stop and self.tokenizer is not None and self._stop_string_in_tail(request):
            return "stop"
        if request.num_output_tokens >= params.max_tokens or len(request.token_ids) >= self.max_length:
            return "length"
        return None

    def tokens_left(self, request: Request) -> int:
        """Tokens ``request`` may still emit before ``max_tokens`` or the context length ends it."""
        return min(request.params.max_tokens - request.num_output_tokens, self.max_length - len(request.token_ids))

    def known_remaining(self, request: Request) -> int | None:
        """Tokens ``request`` will still emit if only its length can end it (``ignore_eos``, no
        stop tokens or strings), else ``None``."""
        params = request.params
        if not params.ignore_eos or params.stop_token_ids or params.stop:
            return None
        return self.tokens_left(request)

    def _stop_string_in_tail(self, request: Request) -> bool:
        # A stop string ending at the new token lies within its last len(utf-8 bytes)+2 tokens:
        # every token carries at least one byte.
        window = max(len(s.encode("utf-8")) for s in request.params.stop) + 2
        tail = self.tokenizer.decode(request.output_ids[-window:], skip_special_tokens=False)
        return any(s in tail for s in request.params.stop)

    def final_text(self, request: Request) -> str:
        """The output text, cut at the first stop string (which is excluded unless
        ``include_stop_str_in_output``, as in vLLM)."""
        if self.tokenizer is None:
            return ""
        text = self.tokenizer.decode(request.output_ids, skip_special_tokens=True)
        return cut_at_stop(text, request.params.stop, request.params.include_stop_str_in_output)


def cut_at_stop(text: str, stop: list[str], include: bool = False) -> str:
    """``text`` up to the first stop string in it (the one that starts first; the earlier listed
    on a tie), with that string when ``include``; all of ``text`` when it holds none."""
    found = [(i, len(s)) for i, s in ((text.find(s), s) for s in stop) if i >= 0]
    if not found:
        return text
    start, length = min(found, key=lambda f: f[0])
    return text[: start + length if include else start]


def eos_token_ids(model: Any, tokenizer: Any) -> set[int]:
    """EOS ids from the model's generation config and the tokenizer."""
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    for source in (getattr(gen, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(int(i) for i in source)
    return ids
