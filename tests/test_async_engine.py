"""The server's engine thread (specdec.server.async_engine): what it does when the engine fails.

A failed step ends every request in flight with an error, counted in /metrics; a command that
fails (an abort raising) does not keep the other commands taken with it from running, and an add
taken with it is answered, never left waiting.
"""

from __future__ import annotations

import asyncio

import pytest

from specdec import LLM, SamplingParams
from specdec.server.async_engine import AsyncEngine, EngineFailure, RequestStream
from specdec.server.metrics import ServerMetrics

pytest.importorskip("prometheus_client")


def _errors(metrics: ServerMetrics) -> float:
    for line in metrics.render().decode().splitlines():
        if line.startswith("vllm:request_success_total") and 'finished_reason="error"' in line:
            return float(line.split()[-1])
    return 0.0


def test_a_failed_step_ends_requests_with_an_error_counted_in_the_metrics(tiny, monkeypatch):
    llm = LLM(tiny.model, None, tokenizer=tiny.tokenizer)
    metrics = ServerMetrics("tiny")

    def broken_step(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(llm.engine, "step", broken_step)

    async def run() -> None:
        engine = AsyncEngine(llm.engine, metrics)
        engine.start()
        try:
            stream = await engine.add(list(range(3, 10)), SamplingParams(max_tokens=4))
            with pytest.raises(EngineFailure, match="the engine step failed: RuntimeError: boom"):
                async for _ in stream:
                    pass
        finally:
            await engine.stop()

    asyncio.run(run())
    assert _errors(metrics) == 1.0


def test_a_failing_command_leaves_the_add_beside_it_answered(tiny, monkeypatch):
    llm = LLM(tiny.model, None, tokenizer=tiny.tokenizer)

    def broken_abort(request_id):
        raise RuntimeError("abort broke")

    async def run() -> None:
        engine = AsyncEngine(llm.engine, ServerMetrics("tiny"))
        engine._loop = asyncio.get_running_loop()
        doomed, stream = RequestStream(engine), RequestStream(engine)
        engine._streams[doomed] = 0
        monkeypatch.setattr(llm.engine, "abort", broken_abort)
        added = engine._loop.create_future()
        assert engine._handle([("abort", doomed), ("add", stream, added, list(range(3, 10)), SamplingParams(max_tokens=2), 0.0)])
        await asyncio.wait_for(added, timeout=5)  # settled: the add ran after the abort failed
        assert llm.engine.num_waiting == 1

    asyncio.run(run())
