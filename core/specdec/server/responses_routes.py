"""OpenAI's Responses API: ``POST /v1/responses``, the chat completion a request means answered as a
response, whole or streamed as typed events, and ``GET``/``DELETE /v1/responses/{id}`` for stored
ones (:mod:`specdec.server.responses`)."""

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
from specdec.server.protocol import parse
from specdec.server.responses import (
    ResponseBuilder,
    ResponsesRequest,
    function_call_item,
    message_item,
    output_items,
    output_text,
    reasoning_item,
    reply_messages,
    status,
    usage,
)
from specdec.server.state import ServerState


def responses_router(state: ServerState) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/responses")
    async def responses(request: Request) -> Response:
        body: ResponsesRequest = parse(ResponsesRequest, await request.body())
        state.check_model(body.model)
        conversation = body.conversation(state.responses.conversation(body.previous_response_id))
        chat = body.as_chat(conversation)
        chat.check_supported()
        prompt_ids, tools = state.encode_conversation(chat)
        max_tokens = chat.max_completion_tokens or max(state.max_length - len(prompt_ids), 1)
        streams = await submit_all(state.engine, prompt_ids, [chat.sampling_params(max_tokens)], "input")
        builder = ResponseBuilder(body, state.model_name)
        replies = ChatReplies(tools, state.reasoning)
        if body.stream:
            events = _events(ReplyStream(streams[0], replies), builder, state, conversation)
            return EventStreamResponse(events, lambda: abort_all(streams))
        outcome = (await until_disconnected(request, collect_all(streams)))[0]
        message, _ = replies.message(outcome.text, outcome.finish_reason)
        counted = _usage(state, outcome.num_prompt_tokens, outcome.num_output_tokens, outcome.metrics.num_cached_tokens,
                         message.get("reasoning"))
        response = builder.response(status(outcome.finish_reason), output_items(message), counted)
        _keep(state, builder, response, conversation, message)
        return JSONResponse(response)

    @router.get("/v1/responses/{response_id}")
    async def stored(response_id: str) -> dict[str, Any]:
        return state.responses.response(response_id)

    @router.delete("/v1/responses/{response_id}")
    async def delete(response_id: str) -> dict[str, Any]:
        state.responses.delete(response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    return router


def _keep(state: ServerState, builder: ResponseBuilder, response: dict[str, Any], conversation: list[dict[str, Any]],
          message: dict[str, Any]) -> None:
    """Keep a stored response (``store`` true, the default) for ``previous_response_id``."""
    if builder.body.store is not False:
        state.responses.keep(response, conversation + reply_messages(message))


def _usage(state: ServerState, prompt_tokens: int, output_tokens: int, cached_tokens: int, reasoning: str | None) -> dict[str, Any]:
    thought = len(state.llm.tokenizer(reasoning, add_special_tokens=False)["input_ids"]) if reasoning else 0
    return usage(prompt_tokens, output_tokens, cached_tokens, thought)


def _sse(event: dict[str, Any]) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n"


class _OpenItem:
    """An output item being streamed: its index, the item as first announced, its text so far."""

    def __init__(self, index: int, item: dict[str, Any]) -> None:
        self.index, self.item, self.text = index, item, ""


async def _events(reply: ReplyStream, builder: ResponseBuilder, state: ServerState,
                  conversation: list[dict[str, Any]]) -> AsyncIterator[str]:
    """``response.created`` and ``.in_progress``; the reasoning and the message text, each an item
    opened, its deltas, then closed; function calls, whole, once the reply ends (a call is known
    only then); then ``response.completed`` (or ``.incomplete`` at ``max_output_tokens``). A
    failure after the stream started is an ``error`` event."""
    output: list[dict[str, Any]] = []
    open_item: _OpenItem | None = None
    yield _sse(builder.event("response.created", response=builder.response("in_progress", [], None)))
    yield _sse(builder.event("response.in_progress", response=builder.response("in_progress", [], None)))

    def close() -> list[str]:
        nonlocal open_item
        if open_item is None:
            return []
        item, text, index = open_item.item, open_item.text, open_item.index
        reasoning = item["type"] == "reasoning"
        part = {"type": "reasoning_text", "text": text} if reasoning else output_text(text)
        done = {**item, "status": "completed", "content": [part]}
        output.append(done)
        open_item = None
        ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
        return [_sse(builder.event("response.reasoning_text.done" if reasoning else "response.output_text.done", **ids, text=text)),
                _sse(builder.event("response.content_part.done", **ids, part=part)),
                _sse(builder.event("response.output_item.done", output_index=index, item=done))]

    def add(kind: str, text: str) -> list[str]:
        nonlocal open_item
        events = []
        if open_item is not None and open_item.item["type"] != kind:
            events += close()
        if open_item is None:
            item = reasoning_item("", done=False) if kind == "reasoning" else message_item("", done=False)
            open_item = _OpenItem(len(output), item)
            part = {"type": "reasoning_text", "text": ""} if kind == "reasoning" else output_text("")
            events += [_sse(builder.event("response.output_item.added", output_index=open_item.index, item=item)),
                       _sse(builder.event("response.content_part.added", item_id=item["id"], output_index=open_item.index,
                                          content_index=0, part=part))]
        open_item.text += text
        delta_kind = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        extra = {} if kind == "reasoning" else {"logprobs": []}
        events.append(_sse(builder.event(delta_kind, item_id=open_item.item["id"], output_index=open_item.index,
                                         content_index=0, delta=text, **extra)))
        return events

    try:
        async for kind, text in reply.pieces():
            for line in add("reasoning" if kind == "reasoning" else "message", text):
                yield line
    except APIError as error:
        yield _sse(builder.event("error", code=str(error.status), message=error.message, param=error.param))
        return
    for line in close():
        yield line
    if not output and not reply.calls:  # an empty reply is still a message
        for line in add("message", "") + close():
            yield line
    for call in reply.calls.calls():
        item = function_call_item(call)
        index = len(output)
        output.append(item)
        ids = {"item_id": item["id"], "output_index": index}
        yield _sse(builder.event("response.output_item.added", output_index=index, item={**item, "arguments": "", "status": "in_progress"}))
        yield _sse(builder.event("response.function_call_arguments.delta", **ids, delta=item["arguments"]))
        yield _sse(builder.event("response.function_call_arguments.done", **ids, arguments=item["arguments"]))
        yield _sse(builder.event("response.output_item.done", output_index=index, item=item))
    reasoning = "".join(part["text"] for item in output if item["type"] == "reasoning" for part in item["content"])
    last = reply.last
    counted = _usage(state, last.num_prompt_tokens, reply.num_output_tokens, last.metrics.num_cached_tokens, reasoning or None)
    final = status(last.finish_reason)
    response = builder.response(final, output, counted)
    text = "".join(part["text"] for item in output if item["type"] == "message" for part in item["content"])
    _keep(state, builder, response, conversation, {"content": text, "tool_calls": reply.calls.calls()})
    kind = "response.incomplete" if final == "incomplete" else "response.completed"
    yield _sse(builder.event(kind, response=response))

