"""Running the app with uvicorn, with a graceful shutdown that ends every request properly and
exits with status 0.

On SIGTERM (or Ctrl-C) uvicorn stops accepting connections and waits for the requests in
flight. After ``grace`` seconds the requests still running are aborted through the engine, so
each ends as the API says (a 503, or an error event and ``[DONE]`` in a stream) rather than
with a cut connection; uvicorn's own deadline, a little later, is only a backstop. Then the
app's lifespan stops the engine thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import Callable, Iterator

import uvicorn
from fastapi import FastAPI

#: How long after the grace period uvicorn itself cancels what is still running.
_BACKSTOP_SECONDS = 5.0


class _GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, grace: float, on_grace_over: Callable[[], None]) -> None:
        super().__init__(config)
        self.grace = grace
        self.on_grace_over = on_grace_over

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        timer = asyncio.get_running_loop().call_later(self.grace, self.on_grace_over)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()


def run_app(app: FastAPI, sock: socket.socket, grace: float, access_log: bool) -> bool:
    """Serve ``app`` (from :func:`specdec.server.app.create_app`) on the bound ``sock`` until a
    signal stops it; returns whether it started."""
    config = uvicorn.Config(app, log_level="info" if access_log else "warning", access_log=access_log,
                            timeout_graceful_shutdown=grace + _BACKSTOP_SECONDS)
    server = _GracefulServer(config, grace, app.state.engine.abort_all)
    with _exit_quietly_after_signals():
        server.run(sockets=[sock])
    return server.started


@contextlib.contextmanager
def _exit_quietly_after_signals() -> Iterator[None]:
    """uvicorn shuts down gracefully on SIGINT/SIGTERM and then raises the signal again for the
    handler that was there before it; with this no-op handler there, a graceful shutdown ends
    the command normally (exit status 0) instead of killing the process."""
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
