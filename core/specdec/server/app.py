"""The ASGI app: routes, error handlers, the body limit and the engine thread's lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST

from specdec.llm import LLM
from specdec.reasoning import ReasoningParser
from specdec.server.api_key import ApiKeyCheck
from specdec.server.async_engine import AsyncEngine
from specdec.server.body_limit import BodySizeLimit
from specdec.server.engine_thread import EngineThread
from specdec.server.errors import install_error_handlers
from specdec.server.messages_routes import messages_router
from specdec.server.metrics import ServerMetrics
from specdec.server.openai_routes import openai_router
from specdec.server.responses_routes import responses_router
from specdec.server.state import ServerState
from specdec.server.tokenize_routes import tokenize_router
from specdec.server.triton_routes import triton_router

#: The default limit on a request body (``--max-request-bytes``).
DEFAULT_MAX_REQUEST_BYTES = 1 << 20


def create_app(llm: LLM, model_name: str, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
               thread: EngineThread | None = None, api_key: str | None = None,
               reasoning: ReasoningParser | None = None) -> FastAPI:
    """An app serving ``llm`` as ``model_name``. Its lifespan starts the engine loop on
    ``thread`` (pass the thread that loaded ``llm``; a new one if none) and, at shutdown, aborts
    what is left and stops the loop; ``app.state.engine`` is the :class:`AsyncEngine`, whose
    ``abort_all`` ends the requests in flight when a graceful shutdown's grace period is over.
    Nothing else may use ``llm.engine`` while the app runs. With ``api_key``, the API routes
    admit only requests that send it (:mod:`specdec.server.api_key`); with ``reasoning``, chat
    replies give their reasoning apart (:mod:`specdec.reasoning`)."""
    metrics = ServerMetrics(model_name)
    engine = AsyncEngine(llm.engine, metrics, thread)
    state = ServerState(llm, engine, model_name, metrics, reasoning)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        try:
            yield
        finally:
            await engine.stop()

    app = FastAPI(title="specdec", lifespan=lifespan)
    app.state.engine = engine
    app.add_middleware(BodySizeLimit, max_bytes=max_request_bytes)
    if api_key is not None:
        app.add_middleware(ApiKeyCheck, key=api_key)  # added last, so it runs first
    install_error_handlers(app)
    app.include_router(openai_router(state))
    app.include_router(triton_router(state))
    app.include_router(responses_router(state))
    app.include_router(messages_router(state))
    app.include_router(tokenize_router(state))

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if engine.alive else 503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return app
