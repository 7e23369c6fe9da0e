"""What every generation route does: submit a request, collect or stream its deltas, and abort
it when the client goes away."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from specdec.errors import ConfigError, QueueFullError
from specdec.logprobs import TokenLogprob
from specdec.metrics import RequestMetrics
from specdec.requests import RequestDelta
from specdec.sampling import SamplingParams
from specdec.server.async_engine import AsyncEngine, EngineFailure, RequestStream
from specdec.server.errors import APIError, from_config_error

T = TypeVar("T")

#: Seconds a client refused for a full queue is told to wait (``Retry-After``).
RETRY_AFTER_SECONDS = 1


async def submit(engine: AsyncEngine, prompt_ids: list[int], params: SamplingParams, param: str) -> RequestStream:
    """Add a request; a refused one becomes a 4xx (``param``: the field holding the prompt)."""
    (stream,) = await submit_all(engine, prompt_ids, [params], param)
    return stream


async def submit_all(engine: AsyncEngine, prompt_ids: list[int], params: list[SamplingParams], param: str) -> list[RequestStream]:
    """One request per choice (``n``), all or none (see :meth:`AsyncEngine.add_all`); a refused
    one becomes a 4xx (``param``: the field holding the prompt)."""
    try:
        return await engine.add_all(prompt_ids, params)
    except QueueFullError as exc:
        raise APIError(429, str(exc), headers={"Retry-After": str(RETRY_AFTER_SECONDS)}) from None
    except ConfigError as exc:
        raise from_config_error(exc, param) from None
    except EngineFailure as exc:
        raise APIError(503, str(exc)) from None


def abort_all(streams: list[RequestStream]) -> None:
    for stream in streams:
        stream.abort()


def failure(delta: RequestDelta) -> APIError | None:
    """The error a request ended with, if it did not complete: a server-side failure (its
    method failed for it) is a 500; an abort the client did not cause (shutdown) is a 503."""
    if delta.finish_reason == "error":
        return APIError(500, f"the request failed: {delta.error}")
    if delta.finish_reason == "abort":
        return APIError(503, "the request was aborted: the server is shutting down")
    return None


@dataclass
class Outcome:
    text: str
    finish_reason: str
    num_prompt_tokens: int
    num_output_tokens: int
    metrics: RequestMetrics
    #: The output tokens' log-probabilities, when the request asked for them.
    logprobs: list[TokenLogprob] | None = None


async def collect(stream: RequestStream) -> Outcome:
    """Wait for the whole output; raises :class:`APIError` if the request failed."""
    text: list[str] = []
    logprobs: list[TokenLogprob] = []
    num_output_tokens = 0
    try:
        async for delta in stream:
            text.append(delta.text_delta)
            num_output_tokens += len(delta.new_token_ids)
            logprobs += delta.logprobs or []
    except EngineFailure as exc:
        raise APIError(500, str(exc)) from None
    finally:
        stream.abort()
    error = failure(delta)
    if error is not None:
        raise error
    return Outcome("".join(text), delta.finish_reason, delta.num_prompt_tokens, num_output_tokens, delta.metrics,
                   logprobs if delta.logprobs is not None else None)


async def collect_all(streams: list[RequestStream]) -> list[Outcome]:
    """Every choice's whole output; the first failure aborts the others and is raised."""
    try:
        return list(await asyncio.gather(*(collect(stream) for stream in streams)))
    finally:
        abort_all(streams)


async def merged(streams: list[RequestStream]) -> AsyncIterator[tuple[int, RequestDelta]]:
    """The deltas of several requests as they come, each with its request's index; raises the
    first :class:`EngineFailure`. Leaving the loop early stops reading (the caller aborts)."""
    if len(streams) == 1:  # the usual n = 1: no task and queue hop per delta
        async for delta in streams[0]:
            yield 0, delta
        return
    queue: asyncio.Queue[tuple[int, RequestDelta | EngineFailure | None]] = asyncio.Queue()

    async def pump(index: int, stream: RequestStream) -> None:
        try:
            async for delta in stream:
                queue.put_nowait((index, delta))
        except EngineFailure as exc:
            queue.put_nowait((index, exc))
        queue.put_nowait((index, None))

    tasks = [asyncio.ensure_future(pump(i, stream)) for i, stream in enumerate(streams)]
    try:
        running = len(tasks)
        while running:
            index, item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, EngineFailure):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()


async def until_disconnected(request: Request, work: Coroutine[Any, Any, T]) -> T:
    """Run ``work``; if the client disconnects first, cancel it (which aborts its request) and
    raise Starlette's :class:`ClientDisconnect`. For non-streaming routes, whose handler nothing else
    cancels when the client goes away."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnect(request.receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        raise ClientDisconnect()
    return task.result()


async def _disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def perf_metrics(metrics: RequestMetrics) -> dict[str, float | int]:
    """A request's speculation metrics under TensorRT-LLM's names."""
    return {
        "acceptance_rate": metrics.acceptance_rate,
        "total_accepted_draft_tokens": metrics.total_accepted_draft_tokens,
        "total_draft_tokens": metrics.total_draft_tokens,
        "mean_acceptance_length": metrics.mean_acceptance_length,
    }


def event(data: object) -> str:
    """One server-sent event carrying ``data`` as JSON (or ``[DONE]``)."""
    return f"data: {data if isinstance(data, str) else json.dumps(data, separators=(',', ':'))}\n\n"


class EventStreamResponse(StreamingResponse):
    """A server-sent event stream that aborts its request however it ends: finished, client
    gone (Starlette cancels the stream) or send failed. ``on_close`` is the request's abort,
    a no-op once it finished."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(events, headers={"Cache-Control": "no-cache"})
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()
