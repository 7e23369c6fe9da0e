"""An ASGI middleware that refuses request bodies over a size limit (413).

A declared ``Content-Length`` over the limit is refused before the body is read; a body sent
without one (chunked) is counted while it is read, and reading fails with :class:`BodyTooLarge`
as soon as it passes the limit, so the server never holds more than the limit in memory.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from specdec.server.errors import APIError, BodyTooLarge, error_response


class BodySizeLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            response = error_response(Request(scope), APIError(413, str(BodyTooLarge(self.max_bytes))))
            await response(scope, receive, send)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, limited_receive, send)
