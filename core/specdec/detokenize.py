"""Text deltas for streaming: each step's new text, decoded incrementally.

Only a short window of tokens is decoded per step (vLLM's prefix/read offsets), so a long
output costs the same per step as a short one. Text is held back while it ends in an incomplete
character (a byte-level token that splits a UTF-8 sequence decodes to U+FFFD) or while its end
could be the start of a stop string, so a client never receives text that the stop string later
removes; when the request finishes, the text is cut before the first stop string (after it, with
``include_stop_str_in_output``, when nothing is held back).
"""

from __future__ import annotations

from typing import Any

from specdec.stopping import cut_at_stop


class IncrementalDetokenizer:
    """The text of one request's output, grown token by token; :meth:`delta` returns what is new."""

    def __init__(self, tokenizer: Any, stop: list[str], include_stop: bool = False) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.include_stop = include_stop
        #: The decoded output so far (before cutting at a stop string).
        self.text = ""
        #: Characters of the output already handed out.
        self.sent = 0
        self._prefix_offset = 0
        self._read_offset = 0

    def delta(self, output_ids: list[int], finished: bool) -> str:
        """New text since the last call for the output ``output_ids``."""
        if self.tokenizer is None:
            return ""
        self._decode(output_ids, final=finished)
        if finished:
            ready = len(cut_at_stop(self.text, self.stop, self.include_stop))
        else:
            ready = len(self.text) - self._held_back()
        if ready <= self.sent:
            return ""
        new, self.sent = self.text[self.sent : ready], ready
        return new

    def _decode(self, ids: list[int], final: bool) -> None:
        """Decode the tokens not decoded yet; ``final``: no more will come, so an incomplete
        character is decoded as it is (as a whole-output decode would)."""
        if self._read_offset >= len(ids):
            return
        prefix = self.tokenizer.decode(ids[self._prefix_offset : self._read_offset], skip_special_tokens=True)
        full = self.tokenizer.decode(ids[self._prefix_offset :], skip_special_tokens=True)
        if not final and (full.endswith("\ufffd") or len(full) <= len(prefix)):
            # An incomplete character (or only special tokens): wait for the tokens after it.
            return
        self.text += full[len(prefix) :]
        self._prefix_offset, self._read_offset = self._read_offset, len(ids)

    def _held_back(self) -> int:
        """Characters at the end of the text that could begin a stop string (none when stop
        strings stay in the text: only what follows one is cut, and it ends the output)."""
        if self.include_stop:
            return 0
        longest = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(self.text)), longest, -1):
                if self.text.endswith(s[:n]):
                    longest = n
                    break
        return longest
