"""A thinking model's reasoning apart from its answer, as vLLM's reasoning parsers split them
(``--reasoning-parser``): the text in ``<think> ... </think>`` is the reasoning, the rest the
content.

- ``deepseek_r1``: the reply starts in its reasoning (DeepSeek-R1's template opens ``<think>``
  in the prompt; a ``<think>`` the model writes itself is dropped) and the reasoning runs to
  ``</think>``, or to the end of a reply that never closes it. Also for models whose template
  opens the thinking (QwQ, Qwen3's thinking-only releases).
- ``qwen3``: a reply that starts with ``<think>`` reasons until ``</think>``; any other reply is
  all content (Qwen3 with ``enable_thinking: false``).

A reply streamed in pieces splits exactly as it does whole: text that may be the start of a tag
waits for the next piece (:class:`ReasoningStream`).
"""

from __future__ import annotations

from dataclasses import dataclass

from specdec.errors import ConfigError

START, END = "<think>", "</think>"

#: Each parser's name, and whether a reply starts in its reasoning without an opening tag.
PARSERS = {"deepseek_r1": True, "qwen3": False}


@dataclass(frozen=True)
class ReasoningParser:
    name: str

    def __post_init__(self) -> None:
        if self.name not in PARSERS:
            raise ConfigError(f"reasoning_parser: {self.name!r} is not one of {', '.join(sorted(PARSERS))}")

    def split(self, text: str) -> tuple[str | None, str]:
        """A whole reply's reasoning (``None`` when it has none) and content."""
        stream = ReasoningStream(self)
        reasoning, content = stream.feed(text)
        rest_reasoning, rest_content = stream.finish()
        reasoning += rest_reasoning
        return (reasoning if stream.reasoned else None), content + rest_content


class ReasoningStream:
    """Splits one reply fed in pieces: each :meth:`feed` returns the reasoning and the content it
    can tell apart so far, :meth:`finish` what was held back."""

    def __init__(self, parser: ReasoningParser) -> None:
        self.opens_in_reasoning = PARSERS[parser.name]
        self._state = "start"  # start -> reasoning -> content
        self._held = ""
        #: Whether the reply had a reasoning part (even an empty one).
        self.reasoned = False

    def feed(self, text: str) -> tuple[str, str]:
        self._held += text
        reasoning, content = "", ""
        while self._held:
            if self._state == "start":
                if START.startswith(self._held):  # "<thi": wait for more
                    break
                if self._held.startswith(START):
                    self._held = self._held[len(START):]
                    self._state, self.reasoned = "reasoning", True
                else:
                    self._state = "reasoning" if self.opens_in_reasoning else "content"
                    self.reasoned = self.opens_in_reasoning
            elif self._state == "reasoning":
                end = self._held.find(END)
                if end >= 0:
                    reasoning += self._held[:end]
                    self._held = self._held[end + len(END):]
                    self._state = "content"
                    continue
                keep = _partial_tag(self._held)
                reasoning += self._held[: len(self._held) - keep]
                self._held = self._held[len(self._held) - keep:]
                break
            else:
                content += self._held
                self._held = ""
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        """What is left once the reply has ended: held text belongs where the reply stopped."""
        held, self._held = self._held, ""
        if self._state == "start":
            self._state = "reasoning" if self.opens_in_reasoning else "content"
            self.reasoned = self.opens_in_reasoning
        return (held, "") if self._state == "reasoning" else ("", held)


def _partial_tag(text: str) -> int:
    """How many characters at the end of ``text`` could begin ``</think>``."""
    for size in range(min(len(END) - 1, len(text)), 0, -1):
        if END.startswith(text[-size:]):
            return size
    return 0
