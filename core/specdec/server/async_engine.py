"""The engine on a thread of its own, driven from asyncio.

The engine is not thread-safe and its steps run target forwards, so every engine call happens on
one :class:`~specdec.server.engine_thread.EngineThread` (the one that loaded the model, see that
module for why): the event loop only puts commands (add, abort, stop) in a thread-safe inbox, and
gets each request's deltas through the request's own asyncio queue, fed with
``loop.call_soon_threadsafe``. The loop never waits on a forward.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from specdec.engine import Engine
from specdec.requests import RequestDelta
from specdec.sampling import SamplingParams
from specdec.server.engine_thread import EngineThread
from specdec.server.metrics import RequestTracker, ServerMetrics

logger = logging.getLogger("specdec.server")


class EngineFailure(Exception):
    """The engine itself failed (not a plugin for one request), or it has stopped."""


@dataclass(eq=False)
class RequestStream:
    """One request's deltas, in order; iterate it until the finished delta.

    :meth:`abort` ends the request (freeing its cache row) unless it already finished; it is
    safe to call at any time, more than once, and for a request the engine has not added yet.
    """

    _engine: AsyncEngine
    _queue: asyncio.Queue[RequestDelta | EngineFailure] = field(default_factory=asyncio.Queue)
    finished: bool = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestDelta:
        if self.finished:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, EngineFailure):
            self.finished = True
            raise item
        self.finished = item.finished
        return item

    def _push(self, item: RequestDelta | EngineFailure) -> None:
        self._queue.put_nowait(item)

    def abort(self) -> None:
        if not self.finished:
            self.finished = True
            self._engine._inbox.put(("abort", self))


@dataclass(eq=False)
class _Active:
    """What the engine thread keeps about a request it added."""

    stream: RequestStream
    tracker: RequestTracker


class AsyncEngine:
    """Runs the engine loop on ``thread`` (if not given, on a thread of its own, ended by
    :meth:`stop`). :meth:`start` and :meth:`stop` run on the event loop (the app's lifespan);
    :meth:`add` may be called from any coroutine on that loop."""

    def __init__(self, engine: Engine, metrics: ServerMetrics, thread: EngineThread | None = None) -> None:
        self.engine = engine
        self.metrics = metrics
        self._inbox: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._thread = thread
        self._owns_thread = thread is None
        self._running: Future[None] | None = None  # the engine loop, once started
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        # Touched by the engine thread only.
        self._active: dict[int, _Active] = {}
        self._streams: dict[RequestStream, int] = {}

    @property
    def alive(self) -> bool:
        return self._running is not None and not self._running.done() and not self._stopping

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = self._thread or EngineThread()
        self._running = self._thread.submit(self._run)

    async def stop(self) -> None:
        """Abort whatever still runs and wait for the engine loop to end."""
        self._stopping = True
        self._inbox.put(("stop",))
        if self._running is not None:
            await asyncio.wrap_future(self._running)
        if self._owns_thread and self._thread is not None:
            self._thread.close()

    def abort_all(self) -> None:
        """Abort every request in flight (the end of a shutdown's grace period): each stream
        gets its ``abort`` delta."""
        self._inbox.put(("abort_all",))

    async def add(self, prompt_ids: list[int], params: SamplingParams) -> RequestStream:
        """Add a request; returns its stream once the engine took it. Raises what
        ``engine.add_request`` raised (``ConfigError`` for a bad prompt, ``QueueFullError``)."""
        (stream,) = await self.add_all(prompt_ids, [params])
        return stream

    async def add_all(self, prompt_ids: list[int], params: list[SamplingParams]) -> list[RequestStream]:
        """Add one request of ``prompt_ids`` per ``params`` (a request's ``n`` choices), all or
        none: if the engine refuses one, the others are aborted and its error raised. They are
        queued back to back, so the engine normally takes them between the same two steps: they
        join the batch together and share the prompt's prefill forward."""
        if not self.alive:
            raise EngineFailure("the engine is not running")
        streams = [RequestStream(self) for _ in params]
        added: list[asyncio.Future[None]] = [self._loop.create_future() for _ in params]
        arrival = time.monotonic()
        for stream, future, choice in zip(streams, added, params, strict=True):
            self._inbox.put(("add", stream, future, list(prompt_ids), choice, arrival))
        try:
            outcomes = await asyncio.gather(*added, return_exceptions=True)
        except asyncio.CancelledError:
            for stream in streams:
                stream.abort()  # the inbox is in order: the abort follows the add
            raise
        refused = next((o for o in outcomes if isinstance(o, BaseException)), None)
        if refused is not None:
            for stream in streams:
                stream.abort()
            raise refused
        return streams

    # -- the engine thread ----------------------------------------------------------------------

    def _run(self) -> None:
        idle_work_left = True
        try:
            while True:
                busy = self.engine.has_unfinished_requests()
                if not self._handle(self._take(block=not busy and not idle_work_left)):
                    break
                if self.engine.has_unfinished_requests():
                    self._step()
                    idle_work_left = True  # serving may have left the engine more to measure
                elif idle_work_left:
                    idle_work_left = self._idle_work()
        except Exception:
            logger.exception("the engine thread failed")
        finally:
            failure = EngineFailure("the engine has stopped")
            self._fail_all(failure)
            self._refuse_pending(failure)

    def _take(self, block: bool) -> list[tuple[Any, ...]]:
        commands = [self._inbox.get()] if block else []
        while True:
            try:
                commands.append(self._inbox.get_nowait())
            except queue.Empty:
                return commands

    def _handle(self, commands: list[tuple[Any, ...]]) -> bool:
        """Run the commands in order; ``False`` once told to stop (everything is aborted then)."""
        deliveries: list[tuple[RequestStream, RequestDelta]] = []
        for kind, *args in commands:
            try:
                if kind == "add":
                    self._add(*args)
                elif kind == "abort":
                    request_id = self._streams.get(args[0])
                    delta = self.engine.abort(request_id) if request_id is not None else None
                    if delta is not None:
                        deliveries.extend(self._record([delta]))
                else:  # abort_all, stop
                    aborted = [self.engine.abort(request_id) for request_id in list(self._active)]
                    deliveries.extend(self._record([delta for delta in aborted if delta is not None]))
            except Exception as exc:
                # One command failing leaves the others of the batch to run; an add is answered.
                logger.exception("the engine could not %s a request", kind)
                if kind == "add":
                    self._call(_settle, args[1], EngineFailure(f"adding the request failed: {type(exc).__name__}: {exc}"))
            if kind == "stop":
                self._deliver(deliveries)
                return False
        self._deliver(deliveries)
        return True

    def _add(self, stream: RequestStream, added: asyncio.Future[None], prompt_ids: list[int],
             params: SamplingParams, arrival: float) -> None:
        try:
            request_id = self.engine.add_request(prompt_ids, params)
        except Exception as exc:
            self._call(_settle, added, exc)
            return
        self._active[request_id] = _Active(stream, RequestTracker(arrival))
        self._streams[stream] = request_id
        self._call(_settle, added, None)
        self._update_load()

    def _step(self) -> None:
        try:
            deltas = self.engine.step()
        except Exception as exc:
            # The engine ends the requests a plugin failure is tied to; anything else is a bug.
            logger.exception("an engine step failed")
            self._fail_all(EngineFailure(f"the engine step failed: {type(exc).__name__}: {exc}"))
            return
        self._deliver(self._record(deltas))

    def _idle_work(self) -> bool:
        try:
            return self.engine.idle_work()
        except Exception:
            logger.exception("idle measurement failed; continuing without it")
            return False

    def _record(self, deltas: list[RequestDelta]) -> list[tuple[RequestStream, RequestDelta]]:
        """Count the deltas in the metrics; the (stream, delta) pairs to deliver."""
        now = time.monotonic()
        pairs = []
        for delta in deltas:
            active = self._active.get(delta.request_id)
            if active is None:
                continue
            self.metrics.observe(active.tracker, delta, now)
            pairs.append((active.stream, delta))
            if delta.finished:
                del self._active[delta.request_id]
                del self._streams[active.stream]
        self._update_load()
        return pairs

    def _update_load(self) -> None:
        self.metrics.set_load(self.engine.num_running, self.engine.num_waiting)

    def _fail_all(self, failure: EngineFailure) -> None:
        """End every request the thread added with ``failure`` (their rows freed if possible),
        counted in the metrics as ended with an error."""
        now = time.monotonic()
        for request_id, active in list(self._active.items()):
            try:
                self.engine.abort(request_id)
            except Exception:
                logger.exception("could not abort request %d", request_id)
            self.metrics.observe_failure(active.tracker, now)
            self._call(active.stream._push, failure)
        self._active.clear()
        self._streams.clear()
        self._update_load()

    def _refuse_pending(self, failure: EngineFailure) -> None:
        """Fail the adds still in the inbox (the thread is ending)."""
        while True:
            try:
                kind, *args = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                self._call(_settle, args[1], failure)

    def _deliver(self, pairs: list[tuple[RequestStream, RequestDelta]]) -> None:
        if pairs:
            self._call(_put_all, pairs)

    def _call(self, func: Any, *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(func, *args)
        except RuntimeError:  # the loop has closed: nobody is waiting any more
            pass


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


def _put_all(pairs: list[tuple[RequestStream, RequestDelta]]) -> None:
    for stream, delta in pairs:
        stream._push(delta)
