"""Triton's generate endpoint as the TensorRT-LLM backend's LLM API model answers it, and
Triton's health routes.

``POST /v2/models/{model}/generate`` takes ``{"text_input", "sampling_param_*", ...}`` and answers
``{"model_name", "model_version", "text_output"}`` (plus the speculation metrics when
``sampling_param_return_perf_metrics`` is true); ``generate_stream`` takes the same body and
answers with server-sent events, one per text increment. The body is read as JSON whatever its content
type: ``curl -d`` sends it as a form. Errors are Triton's ``{"error": "..."}``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request, Response

from specdec.server.errors import APIError
from specdec.server.async_engine import EngineFailure, RequestStream
from specdec.server.handling import EventStreamResponse, collect, event, failure, perf_metrics, submit, until_disconnected
from specdec.server.protocol import TritonGenerateRequest, parse
from specdec.server.state import ServerState

MODEL_VERSION = "1"


def triton_router(state: ServerState) -> APIRouter:
    router = APIRouter()

    async def start(model: str, request: Request) -> tuple[TritonGenerateRequest, RequestStream]:
        if model != state.model_name:
            raise APIError(404, f"Request for unknown model: '{model}' is not found")
        body: TritonGenerateRequest = parse(TritonGenerateRequest, await request.body())
        prompt_ids = state.encode(body.text_input, chat=False, param="text_input")
        return body, await submit(state.engine, prompt_ids, body.sampling_params(), "text_input")

    @router.post("/v2/models/{model}/generate")
    async def generate(model: str, request: Request) -> dict[str, Any]:
        body, stream = await start(model, request)
        outcome = await until_disconnected(request, collect(stream))
        text = outcome.text if body.exclude_input_in_output else body.text_input + outcome.text
        reply: dict[str, Any] = {"model_name": state.model_name, "model_version": MODEL_VERSION, "text_output": text}
        if body.sampling_param_return_perf_metrics:
            reply.update(perf_metrics(outcome.metrics))
        return reply

    @router.post("/v2/models/{model}/generate_stream")
    async def generate_stream(model: str, request: Request) -> Response:
        body, stream = await start(model, request)
        return EventStreamResponse(_events(state.model_name, body, stream), stream.abort)

    @router.get("/v2/health/ready")
    async def ready() -> Response:
        return Response(status_code=200 if state.engine.alive else 503)

    return router


async def _events(model_name: str, body: TritonGenerateRequest, stream: RequestStream) -> AsyncIterator[str]:
    """``generate_stream``'s server-sent events: one per text increment, each
    ``{"model_name", "model_version", "text_output"}`` with the new text only (the prompt is not
    echoed), the speculation metrics on the last when asked for. A request that fails after the
    stream started ends with Triton's ``{"error": ...}`` event."""
    try:
        async for delta in stream:
            error = failure(delta)
            if error is not None:
                yield event({"error": error.message})
                return
            if not (delta.text_delta or delta.finished):
                continue
            reply: dict[str, Any] = {"model_name": model_name, "model_version": MODEL_VERSION, "text_output": delta.text_delta}
            if delta.finished and body.sampling_param_return_perf_metrics:
                reply.update(perf_metrics(delta.metrics))
            yield event(reply)
    except EngineFailure as exc:
        yield event({"error": str(exc)})
