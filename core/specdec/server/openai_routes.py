"""OpenAI's API: ``/v1/completions``, ``/v1/chat/completions`` (both streaming) and ``/v1/models``."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from specdec.server.async_engine import EngineFailure, RequestStream
from specdec.server.errors import APIError
from specdec.server.handling import EventStreamResponse, collect, event, failure, perf_metrics, submit, until_disconnected
from specdec.server.protocol import ChatCompletionRequest, CompletionRequest, parse
from specdec.server.state import ServerState

#: Builds one streamed choice from a text increment, the finish reason (on the last chunk) and
#: whether it is the first chunk.
ChoiceBuilder = Callable[[str, str | None, bool], dict[str, Any]]


@dataclass
class _Reply:
    """The envelope every response and chunk of one request shares."""

    id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))

    @classmethod
    def new(cls, prefix: str, model: str) -> _Reply:
        return cls(f"{prefix}-{uuid.uuid4().hex}", model)

    def body(self, obj: str, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices, **extra}


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def openai_router(state: ServerState) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": state.model_name, "object": "model", "created": int(time.time()), "owned_by": "specdec",
                "max_model_len": state.max_length}
        return {"object": "list", "data": [card]}

    @router.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body: CompletionRequest = parse(CompletionRequest, await request.body())
        state.check_model(body.model)
        body.check_supported()
        prompt = body.single_prompt()
        prompt_ids = prompt if isinstance(prompt, list) else state.encode(prompt, chat=False, param="prompt")
        stream = await submit(state.engine, prompt_ids, body.sampling_params(body.max_tokens or 16), "prompt")
        reply = _Reply.new("cmpl", state.model_name)
        if body.stream:

            def choice(text: str, finish_reason: str | None, first: bool) -> dict[str, Any]:
                return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}

            events = _events(stream, reply, "text_completion", choice, body.include_usage, body.return_perf_metrics)
            return EventStreamResponse(events, stream.abort)
        outcome = await until_disconnected(request, collect(stream))
        extra = {"perf_metrics": perf_metrics(outcome.metrics)} if body.return_perf_metrics else {}
        choices = [{"index": 0, "text": outcome.text, "logprobs": None, "finish_reason": outcome.finish_reason}]
        usage = _usage(outcome.num_prompt_tokens, outcome.num_output_tokens)
        return JSONResponse(reply.body("text_completion", choices, usage=usage, **extra))

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body: ChatCompletionRequest = parse(ChatCompletionRequest, await request.body())
        state.check_model(body.model)
        body.check_supported()
        prompt_ids = state.encode(body.conversation(), chat=True, param="messages")
        max_tokens = body.max_completion_tokens or body.max_tokens or max(state.max_length - len(prompt_ids), 1)
        stream = await submit(state.engine, prompt_ids, body.sampling_params(max_tokens), "messages")
        reply = _Reply.new("chatcmpl", state.model_name)
        if body.stream:

            def choice(text: str, finish_reason: str | None, first: bool) -> dict[str, Any]:
                delta = {"role": "assistant", "content": text} if first else {"content": text}
                return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}

            events = _events(stream, reply, "chat.completion.chunk", choice, body.include_usage, body.return_perf_metrics)
            return EventStreamResponse(events, stream.abort)
        outcome = await until_disconnected(request, collect(stream))
        extra = {"perf_metrics": perf_metrics(outcome.metrics)} if body.return_perf_metrics else {}
        message = {"role": "assistant", "content": outcome.text}
        choices = [{"index": 0, "message": message, "logprobs": None, "finish_reason": outcome.finish_reason}]
        usage = _usage(outcome.num_prompt_tokens, outcome.num_output_tokens)
        return JSONResponse(reply.body("chat.completion", choices, usage=usage, **extra))

    return router


async def _events(stream: RequestStream, reply: _Reply, obj: str, choice: ChoiceBuilder, include_usage: bool,
                  return_perf_metrics: bool) -> AsyncIterator[str]:
    """The chunks of a streamed response, then ``[DONE]``. A request that fails on the server
    after the stream started ends with an OpenAI error event (as vLLM sends it) before ``[DONE]``."""
    extra: dict[str, Any] = {"usage": None} if include_usage else {}
    first, num_output_tokens = True, 0
    try:
        async for delta in stream:
            num_output_tokens += len(delta.new_token_ids)
            error = failure(delta)
            if error is not None:
                yield event(error.openai_body())
                break
            if not (delta.text_delta or delta.finished or first):
                continue
            chunk = reply.body(obj, [choice(delta.text_delta, delta.finish_reason, first)], **extra)
            first = False
            if delta.finished and return_perf_metrics:
                chunk["perf_metrics"] = perf_metrics(delta.metrics)
            yield event(chunk)
            if delta.finished and include_usage:
                yield event(reply.body(obj, [], usage=_usage(delta.num_prompt_tokens, num_output_tokens)))
    except EngineFailure as exc:
        yield event(APIError(500, str(exc)).openai_body())
    yield event("[DONE]")
