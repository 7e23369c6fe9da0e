"""``POST /v1/messages`` (Anthropic's Messages API): the chat completion a request means, answered as
a message, whole or streamed as Anthropic's events (:mod:`specdec.server.messages`)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from specdec.server.chat_replies import ChatReplies, ReplyStream
from specdec.server.errors import APIError
from specdec.server.handling import (
    EventStreamResponse,
    abort_all,
    collect_all,
    submit_all,
    until_disconnected,
)
from specdec.server.messages import (
    STOP_REASONS,
    MessagesRequest,
    content_blocks,
    message,
    new_message_id,
    tool_use_block,
    usage,
)
from specdec.server.protocol import parse
from specdec.server.state import ServerState


def messages_router(state: ServerState) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/messages")
    async def messages(request: Request) -> Response:
        body: MessagesRequest = parse(MessagesRequest, await request.body())
        state.check_model(body.model)
        chat = body.as_chat()
        chat.check_supported()
        prompt_ids, tools = state.encode_conversation(chat)
        streams = await submit_all(state.engine, prompt_ids, [chat.sampling_params(body.max_tokens)], "messages")
        replies = ChatReplies(tools, state.reasoning)
        message_id = new_message_id()
        if body.stream:
            events = _events(ReplyStream(streams[0], replies), message_id, state.model_name, len(prompt_ids))
            return EventStreamResponse(events, lambda: abort_all(streams))
        outcome = (await until_disconnected(request, collect_all(streams)))[0]
        reply, finish_reason = replies.message(outcome.text, outcome.finish_reason)
        blocks = content_blocks(reply)
        counted = usage(outcome.num_prompt_tokens, outcome.num_output_tokens, outcome.metrics.num_cached_tokens)
        return JSONResponse(message(message_id, state.model_name, blocks, _stop_reason(finish_reason, blocks), counted))

    return router


def _stop_reason(finish_reason: str | None, blocks: list[dict[str, Any]]) -> str | None:
    if any(block["type"] == "tool_use" for block in blocks):
        return "tool_use"
    return STOP_REASONS.get(finish_reason or "", "end_turn")


def _sse(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data}, separators=(',', ':'))}\n\n"


async def _events(reply: ReplyStream, message_id: str, model: str, prompt_tokens: int) -> AsyncIterator[str]:
    """``message_start``; each thinking or text block started, its deltas, stopped; tool uses,
    whole, once the reply ends (a call is known only then); ``message_delta`` with the stop reason
    and usage; ``message_stop``. A failure after the stream started is an ``error`` event."""
    blocks: list[dict[str, Any]] = []
    open_kind: str | None = None

    def stop() -> list[str]:
        nonlocal open_kind
        if open_kind is None:
            return []
        open_kind = None
        return [_sse("content_block_stop", {"index": len(blocks) - 1})]

    def add(kind: str, text: str) -> list[str]:
        nonlocal open_kind
        events = stop() if open_kind not in (None, kind) else []
        field, delta_kind = ("thinking", "thinking_delta") if kind == "thinking" else ("text", "text_delta")
        if open_kind is None:
            block = {"type": kind, field: "", **({"signature": ""} if kind == "thinking" else {})}
            blocks.append(block)
            open_kind = kind
            events.append(_sse("content_block_start", {"index": len(blocks) - 1, "content_block": dict(block)}))
        blocks[-1][field] += text
        events.append(_sse("content_block_delta", {"index": len(blocks) - 1, "delta": {"type": delta_kind, field: text}}))
        return events

    start = message(message_id, model, [], None, {"input_tokens": prompt_tokens, "output_tokens": 0})
    yield _sse("message_start", {"message": start})
    try:
        async for kind, text in reply.pieces():
            for line in add("thinking" if kind == "reasoning" else "text", text):
                yield line
    except APIError as error:
        yield _sse("error", error.anthropic_body())
        return
    for line in stop():
        yield line
    if not blocks and not reply.calls:  # an empty reply is still a text block
        for line in add("text", "") + stop():
            yield line
    for call in reply.calls.calls():
        block = tool_use_block(call)
        blocks.append(block)
        index = len(blocks) - 1
        yield _sse("content_block_start", {"index": index, "content_block": {**block, "input": {}}})
        yield _sse("content_block_delta", {"index": index, "delta": {"type": "input_json_delta",
                                                                     "partial_json": json.dumps(block["input"])}})
        yield _sse("content_block_stop", {"index": index})
    last = reply.last
    counted = usage(last.num_prompt_tokens, reply.num_output_tokens, last.metrics.num_cached_tokens)
    yield _sse("message_delta", {"delta": {"stop_reason": _stop_reason(reply.finish_reason, blocks), "stop_sequence": None},
                                 "usage": counted})
    yield _sse("message_stop", {})
