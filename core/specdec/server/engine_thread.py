"""The one thread that runs the model in a server process.

A server loads the model, warms it up, runs every engine step and closes the engine on this
thread, and nowhere else. On a CPU this is a matter of speed, not only of safety: torch's
OpenMP runtime (GNU libgomp in the PyPI wheels) keeps one team of worker threads for each thread
that has run a parallel region, and once the threads of all teams outnumber the CPUs, its workers
stop spin-waiting between parallel regions and sleep instead. Every forward then pays for waking
them hundreds of times. A model loaded on the main thread and stepped on another was measured 35%
slower per forward on two cores (SmolLM2-135M, bfloat16) than the same forwards run where it was
loaded.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class EngineThread:
    """A daemon thread that runs the calls given to it, one at a time, in order.

    :meth:`submit` returns a :class:`~concurrent.futures.Future` (the engine loop's, which runs
    until the server stops); :meth:`run` waits for the call and returns what it returned or raises
    what it raised (start-up work: loading, warming up, closing). :meth:`close` ends the thread
    once the calls before it have run.

    Not a one-worker ``ThreadPoolExecutor``: its worker is no daemon, and the interpreter joins
    it at exit, so an engine loop that never got its stop would hang the process there.
    """

    def __init__(self, name: str = "specdec-engine") -> None:
        self._calls: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def submit(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        self._calls.put((future, func, args, kwargs))
        return future

    def run(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return self.submit(func, *args, **kwargs).result()

    def close(self) -> None:
        self._calls.put(None)

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            future, func, args, kwargs = call
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(func(*args, **kwargs))
            except BaseException as exc:  # handed to whoever waits on the future
                future.set_exception(exc)
