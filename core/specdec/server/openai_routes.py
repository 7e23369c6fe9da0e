"""OpenAI's API: ``/v1/completions``, ``/v1/chat/completions`` (both streaming) and ``/v1/models``."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from specdec.logprobs import TokenLogprob
from specdec.metrics import aggregate
from specdec.server.async_engine import EngineFailure, RequestStream
from specdec.server.chat_replies import ChatReplies
from specdec.server.errors import APIError
from specdec.server.handling import (EventStreamResponse, Outcome, abort_all, collect_all, event, failure, merged, perf_metrics,
                                     submit_all, until_disconnected)
from specdec.server.logprobs_format import chat_logprobs, completion_logprobs
from specdec.server.protocol import ChatCompletionRequest, CompletionRequest, parse
from specdec.server.state import ServerState

#: Builds one streamed choice from its index, a text increment, the finish reason (on the last
#: chunk), whether it is the choice's first chunk, and the log-probabilities of the tokens since
#: the choice's last chunk (``None`` when the request asks for none).
ChoiceBuilder = Callable[[int, str, str | None, bool, list[TokenLogprob] | None], dict[str, Any]]


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


def _usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """OpenAI's ``usage``; ``cached_tokens`` of the prompt came from the prefix cache."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens, "prompt_tokens_details": {"cached_tokens": cached_tokens}}


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
        params = [body.sampling_params(body.max_tokens or 16, i) for i in range(body.num_choices)]
        streams = await submit_all(state.engine, prompt_ids, params, "prompt")
        reply = _Reply.new("cmpl", state.model_name)
        if body.stream:
            offsets = [0] * body.num_choices

            def choice(index: int, text: str, finish_reason: str | None, first: bool,
                       logprobs: list[TokenLogprob] | None) -> dict[str, Any]:
                formatted = None
                if logprobs is not None:
                    formatted = completion_logprobs(logprobs, state.token_text, offsets[index])
                    offsets[index] += sum(len(t) for t in formatted["tokens"])
                return {"index": index, "text": text, "logprobs": formatted, "finish_reason": finish_reason}

            events = _events(streams, reply, "text_completion", choice, body.include_usage, body.return_perf_metrics)
            return EventStreamResponse(events, lambda: abort_all(streams))
        outcomes = await until_disconnected(request, collect_all(streams))
        choices = [{"index": i, "text": o.text,
                    "logprobs": None if o.logprobs is None else completion_logprobs(o.logprobs, state.token_text),
                    "finish_reason": o.finish_reason} for i, o in enumerate(outcomes)]
        return JSONResponse(reply.body("text_completion", choices, **_totals(outcomes, body.return_perf_metrics)))

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body: ChatCompletionRequest = parse(ChatCompletionRequest, await request.body())
        state.check_model(body.model)
        body.check_supported()
        prompt_ids, tools = state.encode_conversation(body)
        max_tokens = body.max_completion_tokens or body.max_tokens or max(state.max_length - len(prompt_ids), 1)
        params = [body.sampling_params(max_tokens, i) for i in range(body.num_choices)]
        streams = await submit_all(state.engine, prompt_ids, params, "messages")
        reply = _Reply.new("chatcmpl", state.model_name)
        replies = ChatReplies(tools, state.reasoning)
        if body.stream:

            def choice(index: int, text: str, finish_reason: str | None, first: bool,
                       logprobs: list[TokenLogprob] | None) -> dict[str, Any]:
                delta, finish_reason = replies.delta(index, text, finish_reason, first)
                formatted = None if logprobs is None else chat_logprobs(logprobs, state.token_text)
                return {"index": index, "delta": delta, "logprobs": formatted, "finish_reason": finish_reason}

            events = _events(streams, reply, "chat.completion.chunk", choice, body.include_usage, body.return_perf_metrics)
            return EventStreamResponse(events, lambda: abort_all(streams))
        outcomes = await until_disconnected(request, collect_all(streams))
        choices = []
        for i, o in enumerate(outcomes):
            message, finish_reason = replies.message(o.text, o.finish_reason)
            choices.append({"index": i, "message": message, "finish_reason": finish_reason,
                            "logprobs": None if o.logprobs is None else chat_logprobs(o.logprobs, state.token_text)})
        return JSONResponse(reply.body("chat.completion", choices, **_totals(outcomes, body.return_perf_metrics)))

    return router


def _totals(outcomes: list[Outcome], return_perf_metrics: bool) -> dict[str, Any]:
    """``usage`` over every choice (the prompt counted once, as OpenAI does) and, when asked for,
    the speculation metrics of all choices together."""
    usage = _usage(outcomes[0].num_prompt_tokens, sum(o.num_output_tokens for o in outcomes), outcomes[0].metrics.num_cached_tokens)
    extra: dict[str, Any] = {"usage": usage}
    if return_perf_metrics:
        extra["perf_metrics"] = perf_metrics(aggregate(o.metrics for o in outcomes))
    return extra


async def _events(streams: list[RequestStream], reply: _Reply, obj: str, choice: ChoiceBuilder, include_usage: bool,
                  return_perf_metrics: bool) -> AsyncIterator[str]:
    """The chunks of a streamed response, each choice's as they come, then the usage chunk (when
    asked for) once every choice finished, then ``[DONE]``. A request that fails on the server
    after the stream started ends it with an OpenAI error event (as vLLM sends it) before ``[DONE]``."""
    extra: dict[str, Any] = {"usage": None} if include_usage else {}
    started: set[int] = set()
    # Log-probabilities of tokens whose text is held back (a possible stop string) wait for the
    # choice's next chunk.
    pending: dict[int, list[TokenLogprob]] = {}
    num_output_tokens, num_prompt_tokens, num_cached_tokens = 0, 0, 0
    try:
        async for index, delta in merged(streams):
            num_output_tokens += len(delta.new_token_ids)
            num_prompt_tokens, num_cached_tokens = delta.num_prompt_tokens, delta.metrics.num_cached_tokens
            error = failure(delta)
            if error is not None:
                yield event(error.openai_body())
                break
            if delta.logprobs is not None:
                pending.setdefault(index, []).extend(delta.logprobs)
            if not (delta.text_delta or delta.finished or index not in started):
                continue
            logprobs = pending.pop(index, []) if delta.logprobs is not None else None
            chunk = reply.body(obj, [choice(index, delta.text_delta, delta.finish_reason, index not in started, logprobs)],
                               **extra)
            started.add(index)
            if delta.finished and return_perf_metrics:
                chunk["perf_metrics"] = perf_metrics(delta.metrics)
            yield event(chunk)
        else:
            if include_usage:
                yield event(reply.body(obj, [], usage=_usage(num_prompt_tokens, num_output_tokens, num_cached_tokens)))
    except EngineFailure as exc:
        yield event(APIError(500, str(exc)).openai_body())
    yield event("[DONE]")
