"""A chat reply's message, whole or as streamed deltas: text, or tool calls (:mod:`specdec.tools`)."""

from __future__ import annotations

from typing import Any

from specdec.tools import ToolCall, ToolCallStream, ToolUse


class ChatReplies:
    """Builds the ``message`` of each choice of one request, or its streamed ``delta``s."""

    def __init__(self, tools: ToolUse) -> None:
        self.tools = tools
        self._streams: dict[int, ToolCallStream] = {}
        self._forced: dict[int, ToolCall] = {}

    def message(self, text: str, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
        """A whole reply's message and its finish reason."""
        content, calls = self.tools.parse(text)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = [call.openai() for call in calls]
        return message, self.tools.finish_reason(finish_reason, calls)

    def delta(self, index: int, text: str, finish_reason: str | None, first: bool) -> tuple[dict[str, Any], str | None]:
        """Choice ``index``'s delta for its next ``text`` (its first when ``first``; its last when
        ``finish_reason`` is set), and the finish reason to send."""
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if self.tools.mode == "none":
            delta["content"] = text
        elif self.tools.mode == "named":  # the reply is the call's arguments, streamed as they come
            call = self._forced.setdefault(index, ToolCall(self.tools.named.function.name, ""))
            entry: dict[str, Any] = {"index": 0, "function": {"arguments": text}}
            if first:
                entry.update(id=call.id, type="function")
                entry["function"]["name"] = call.name
            delta["tool_calls"] = [entry]
        else:
            stream = self._streams.setdefault(index, ToolCallStream(self.tools))
            content, calls = stream.feed(text), []
            if finish_reason is not None:
                rest, calls = stream.finish()
                content += rest
                finish_reason = self.tools.finish_reason(finish_reason, calls)
            if content or first:
                delta["content"] = content
            if calls:
                delta["tool_calls"] = [{"index": i, **call.openai()} for i, call in enumerate(calls)]
        return delta, finish_reason
