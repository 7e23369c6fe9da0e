"""Triton's generate endpoint as the TensorRT-LLM backend's LLM API model answers it, and
Triton's health routes.

``POST /v2/models/{model}/generate`` takes ``{"text_input", "sampling_param_*", ...}`` and answers
``{"model_name", "model_version", "text_output"}`` (plus the speculation metrics when
``sampling_param_return_perf_metrics`` is true). The body is read as JSON whatever its content
type: ``curl -d`` sends it as a form. Errors are Triton's ``{"error": "..."}``.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from specdec.server.errors import APIError
from specdec.server.handling import collect, perf_metrics, submit, until_disconnected
from specdec.server.protocol import TritonGenerateRequest, parse
from specdec.server.state import ServerState

MODEL_VERSION = "1"


def triton_router(state: ServerState) -> APIRouter:
    router = APIRouter()

    @router.post("/v2/models/{model}/generate")
    async def generate(model: str, request: Request) -> dict[str, Any]:
        if model != state.model_name:
            raise APIError(404, f"Request for unknown model: '{model}' is not found")
        body: TritonGenerateRequest = parse(TritonGenerateRequest, await request.body())
        prompt_ids = state.encode(body.text_input, chat=False, param="text_input")
        stream = await submit(state.engine, prompt_ids, body.sampling_params(), "text_input")
        outcome = await until_disconnected(request, collect(stream))
        text = outcome.text if body.exclude_input_in_output else body.text_input + outcome.text
        reply: dict[str, Any] = {"model_name": state.model_name, "model_version": MODEL_VERSION, "text_output": text}
        if body.sampling_param_return_perf_metrics:
            reply.update(perf_metrics(outcome.metrics))
        return reply

    @router.get("/v2/health/ready")
    async def ready() -> Response:
        return Response(status_code=200 if state.engine.alive else 503)

    return router
