"""A chat reply's message, whole or as streamed deltas: its reasoning (:mod:`specdec.reasoning`,
when the server has a reasoning parser), then text or tool calls (:mod:`specdec.tools`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from specdec.reasoning import ReasoningParser, ReasoningStream
from specdec.requests import RequestDelta
from specdec.server.async_engine import EngineFailure, RequestStream
from specdec.server.errors import APIError
from specdec.server.handling import failure
from specdec.tools import ToolCall, ToolCallStream, ToolUse


def _with_reasoning(fields: dict[str, Any], reasoning: str) -> dict[str, Any]:
    # vLLM's field, and ``reasoning_content``, its former name (DeepSeek's API's), which clients still read.
    return {**fields, "reasoning": reasoning, "reasoning_content": reasoning}


class ChatReplies:
    """Builds the ``message`` of each choice of one request, or its streamed ``delta``s; with a
    ``reasoning`` parser, the reasoning goes apart from the content and tool calls."""

    def __init__(self, tools: ToolUse, reasoning: ReasoningParser | None = None) -> None:
        self.tools = tools
        self.reasoning = reasoning
        self._streams: dict[int, ToolCallStream] = {}
        self._forced: dict[int, ToolCall] = {}
        self._thoughts: dict[int, ReasoningStream] = {}

    def message(self, text: str, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
        """A whole reply's message and its finish reason."""
        reasoning, text = self.reasoning.split(text) if self.reasoning is not None else (None, text)
        content, calls = self.tools.parse(text)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning is not None:
            message = _with_reasoning(message, reasoning)
        if calls:
            message["tool_calls"] = [call.openai() for call in calls]
        return message, self.tools.finish_reason(finish_reason, calls)

    def delta(self, index: int, text: str, finish_reason: str | None, first: bool) -> tuple[dict[str, Any], str | None]:
        """Choice ``index``'s delta for its next ``text`` (its first when ``first``; its last when
        ``finish_reason`` is set), and the finish reason to send."""
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if self.reasoning is not None:
            thought = self._thoughts.setdefault(index, ReasoningStream(self.reasoning))
            reasoning, text = thought.feed(text)
            if finish_reason is not None:
                rest_reasoning, rest = thought.finish()
                reasoning, text = reasoning + rest_reasoning, text + rest
            if reasoning:
                delta = _with_reasoning(delta, reasoning)
            if not text and finish_reason is None and not first:
                return delta, None
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


class StreamedCalls:
    """The tool calls of a streamed reply, joined from its deltas' ``tool_calls`` entries (a
    call's id and name come first, its arguments in pieces), for APIs that send each call whole."""

    def __init__(self) -> None:
        self._calls: dict[int, dict[str, Any]] = {}

    def add(self, delta: dict[str, Any]) -> None:
        for entry in delta.get("tool_calls") or []:
            call = self._calls.setdefault(entry["index"], {"id": "", "type": "function",
                                                           "function": {"name": "", "arguments": ""}})
            call["id"] = entry.get("id") or call["id"]
            call["function"]["name"] = entry["function"].get("name") or call["function"]["name"]
            call["function"]["arguments"] += entry["function"].get("arguments") or ""

    def __bool__(self) -> bool:
        return bool(self._calls)

    def calls(self) -> list[dict[str, Any]]:
        """Each call as a chat tool call (``{"id", "type", "function": {"name", "arguments"}}``)."""
        return list(self._calls.values())


class ReplyStream:
    """One streamed chat reply read as pieces, for APIs that build their own events from them (the
    Responses and Messages APIs): :meth:`pieces` gives its reasoning and its text as they come;
    once it ends, :attr:`calls` holds its tool calls, :attr:`finish_reason` the chat's finish
    reason (after tool parsing), :attr:`last` its last delta and :attr:`num_output_tokens` its
    length."""

    def __init__(self, stream: RequestStream, replies: ChatReplies) -> None:
        self._stream, self._replies = stream, replies
        self.calls = StreamedCalls()
        self.finish_reason: str | None = None
        self.last: RequestDelta | None = None
        self.num_output_tokens = 0

    async def pieces(self) -> AsyncIterator[tuple[str, str]]:
        """``("reasoning" | "content", text)`` pieces; raises :class:`APIError` if the request
        fails (a 500 for the engine's own failure)."""
        first = True
        try:
            async for delta in self._stream:
                self.last = delta
                self.num_output_tokens += len(delta.new_token_ids)
                error = failure(delta)
                if error is not None:
                    raise error
                if not (delta.text_delta or delta.finished or first):
                    continue
                chunk, self.finish_reason = self._replies.delta(0, delta.text_delta, delta.finish_reason, first)
                first = False
                for key in ("reasoning", "content"):
                    if chunk.get(key):
                        yield key, chunk[key]
                self.calls.add(chunk)
                if delta.finished:
                    break
        except EngineFailure as exc:
            raise APIError(500, str(exc)) from None
