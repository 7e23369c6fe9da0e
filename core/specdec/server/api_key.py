"""An ASGI middleware that admits API requests only with the server's key (``specdec serve
--api-key``, vLLM's option): ``Authorization: Bearer KEY``, which OpenAI's clients send from
their ``api_key``, or ``x-api-key: KEY``, which Anthropic's send. The OpenAI and Anthropic
routes (``/v1/...``), vLLM's ``/tokenize`` and ``/detokenize`` and Triton's model routes
(``/v2/models/...``) need it; ``/health``, ``/metrics`` and Triton's readiness stay open, for
load balancers and scrapers. A request without the key gets a 401 in its API's error shape."""

from __future__ import annotations

import hmac

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from specdec.server.errors import APIError, error_response

#: Path prefixes that need the key.
PROTECTED = ("/v1/", "/v2/models/", "/tokenize", "/detokenize")


class ApiKeyCheck:
    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app = app
        self.key = key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(PROTECTED) and not self._admitted(scope):
            error = APIError(401, "a valid API key is required: send it as 'Authorization: Bearer KEY'",
                             headers={"WWW-Authenticate": "Bearer"})
            await error_response(Request(scope), error)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _admitted(self, scope: Scope) -> bool:
        headers = dict(scope["headers"])
        scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
        # compare_digest: the time taken does not tell how much of a guess was right.
        if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key):
            return True
        # Anthropic's clients send their key as x-api-key.
        return b"x-api-key" in headers and hmac.compare_digest(headers[b"x-api-key"].strip(), self.key)
