"""HTTP errors as clients of each API expect them.

OpenAI routes answer ``{"error": {"message", "type", "param", "code"}}`` (``code``: the HTTP
status, as vLLM does); Triton routes (``/v2/...``) answer ``{"error": "message"}``; Anthropic's
``/v1/messages`` answers ``{"type": "error", "error": {"type", "message"}}``. A client error is
always a 4xx, never a 500.
"""

from __future__ import annotations

import re

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from specdec.errors import ConfigError

_TYPES = {429: "rate_limit_error", 500: "server_error", 503: "server_error"}
#: Anthropic's error types by status (``invalid_request_error`` otherwise).
_ANTHROPIC_TYPES = {401: "authentication_error", 404: "not_found_error", 413: "request_too_large",
                    429: "rate_limit_error", 500: "api_error", 503: "overloaded_error"}


class APIError(Exception):
    """An error answered with ``status``; ``param`` names the request field at fault."""

    def __init__(self, status: int, message: str, param: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.headers = headers

    @property
    def type(self) -> str:
        return _TYPES.get(self.status, "invalid_request_error")

    def openai_body(self) -> dict[str, object]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status}}

    def anthropic_body(self) -> dict[str, object]:
        return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(self.status, "invalid_request_error"),
                                           "message": self.message}}


class BodyTooLarge(Exception):
    """The request body is longer than the server's limit (raised while it is read)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the request body exceeds the limit of {limit} bytes")


def from_config_error(exc: ConfigError, default: str) -> APIError:
    """A 400 for a :class:`ConfigError`, naming the field its message starts with
    (``logit_bias: ...``, ``structured_outputs.regex: ...``), else ``default``."""
    match = re.match(r"([a-z_][a-z_.]*): ", str(exc))
    return APIError(400, str(exc), match.group(1) if match and match.group(1) != "prompt" else default)


def from_validation_error(exc: ValidationError) -> APIError:
    """A 400 naming the first offending field: ``temperature: Input should be ...``."""
    err = exc.errors()[0]
    param = ".".join(str(p) for p in err["loc"]) or None
    message = str(err["ctx"]["error"]) if err["type"] == "value_error" else err["msg"]
    return APIError(400, f"{param}: {message}" if param else message, param)


def error_response(request: Request, error: APIError) -> JSONResponse:
    path = request.url.path
    if path.startswith("/v2/"):
        body: dict[str, object] = {"error": error.message}
    elif path.startswith("/v1/messages"):
        body = error.anthropic_body()
    else:
        body = error.openai_body()
    return JSONResponse(body, status_code=error.status, headers=error.headers)


def install_error_handlers(app: FastAPI) -> None:
    """Every error the app raises, in the shape of the API that was called."""

    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(request, exc)

    async def too_large(request: Request, exc: BodyTooLarge) -> JSONResponse:
        return error_response(request, APIError(413, str(exc)))

    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return error_response(request, APIError(exc.status_code, str(exc.detail), headers=exc.headers))

    async def disconnected(request: Request, exc: ClientDisconnect) -> Response:
        # The client went away (while its body was read, or before its answer was ready): no
        # one reads this answer; its request, if it was added, has been aborted.
        return Response(status_code=499)

    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Starlette re-raises it afterwards, and uvicorn logs the traceback.
        return error_response(request, APIError(500, f"internal error: {type(exc).__name__}: {exc}"))

    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(BodyTooLarge, too_large)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(ClientDisconnect, disconnected)
    app.add_exception_handler(Exception, unexpected)
