"""The server's engine thread (specdec.server.async_engine, specdec.server.engine_thread).

A failed step ends every request in flight with an error, counted in /metrics; a command that
fails (an abort raising) does not keep the other commands taken with it from running, and an add
taken with it is answered, never left waiting. `specdec serve` loads, warms up, steps and closes
the model on one thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from specdec import LLM, SamplingParams
from specdec.cli import serve as serve_cli
from specdec.cli.main import main
from specdec.engine import Engine
from specdec.errors import QueueFullError

pytest.importorskip("prometheus_client")

from fastapi.testclient import TestClient  # noqa: E402

from specdec.server import uvicorn_runner  # noqa: E402
from specdec.server.async_engine import AsyncEngine, EngineFailure, RequestStream  # noqa: E402
from specdec.server.metrics import ServerMetrics  # noqa: E402


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


def test_a_requests_choices_share_one_prefill_and_are_refused_together(tiny, watch_prefills):
    """The n choices of a request reach the engine together: one prefill forward of the prompt
    serves them all, and each samples as it would alone. When the queue cannot take them all,
    none is left running: the refusal is raised and the choices the engine took are aborted."""
    prompt = list(range(3, 10))
    choices = [SamplingParams(max_tokens=6, temperature=1.0, seed=seed) for seed in (1, 2, 3)]
    with LLM(tiny.model, None, tokenizer=tiny.tokenizer) as alone:
        expected = [alone.generate({"prompt_token_ids": prompt}, params)[0].token_ids for params in choices]
    llm = LLM(tiny.model, None, tokenizer=tiny.tokenizer, max_batch_size=4)
    prefills = watch_prefills(llm.engine.runner)

    async def run() -> list[list[int]]:
        engine = AsyncEngine(llm.engine, ServerMetrics("tiny"))
        engine.start()
        try:
            outputs = []
            for stream in await engine.add_all(prompt, choices):
                outputs.append([t async for delta in stream for t in delta.new_token_ids])
            return outputs
        finally:
            await engine.stop()

    assert asyncio.run(run()) == expected
    assert prefills == [prompt]
    llm.close()

    small = LLM(tiny.model, None, tokenizer=tiny.tokenizer, max_batch_size=1, max_queue_size=1)

    async def refused() -> None:
        engine = AsyncEngine(small.engine, ServerMetrics("tiny"))
        engine.start()
        try:
            with pytest.raises(QueueFullError):
                await engine.add_all(prompt, [SamplingParams(max_tokens=50, ignore_eos=True)] * 3)
            await engine.add(prompt, SamplingParams(max_tokens=1))  # the refused choices left room
        finally:
            await engine.stop()

    asyncio.run(refused())
    small.close()


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


def test_serve_runs_every_model_call_on_one_thread(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading, warming up, the steps and closing all happen on the engine thread, never on the
    main thread: torch work on a second thread gives libgomp a second thread team, after which
    every forward runs slower (see specdec.server.engine_thread)."""
    seen: dict[str, set[int]] = {}

    def recorded(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            seen.setdefault(name, set()).add(threading.get_ident())
            return func(*args, **kwargs)
        return call

    monkeypatch.setattr(serve_cli, "LLM", recorded("load", LLM))
    monkeypatch.setattr(Engine, "idle_work", recorded("warm up", Engine.idle_work))
    monkeypatch.setattr(Engine, "step", recorded("step", Engine.step))
    monkeypatch.setattr(LLM, "close", recorded("close", LLM.close))

    def run_app(app: Any, sock: Any, grace: float, access_log: bool) -> bool:
        with TestClient(app) as client:  # runs the lifespan: the engine loop starts and stops
            reply = client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 4, "temperature": 0})
            assert reply.status_code == 200, reply.text
        return True

    monkeypatch.setattr(uvicorn_runner, "run_app", run_app)
    assert main(["serve", "--model", str(tiny_dir), "--dtype", "float32", "--method", "ngram", "--port", "0"]) == 0
    assert set(seen) == {"load", "warm up", "step", "close"}
    threads = set().union(*seen.values())
    assert len(threads) == 1
    assert threading.get_ident() not in threads


def test_a_model_that_fails_to_load_on_the_engine_thread_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    """The loading error raised on the engine thread reaches the command line as one line and exit 2."""
    assert main(["serve", "--model", "/nonexistent/model", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "/nonexistent/model" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
