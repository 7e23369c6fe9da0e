"""Recorded execution under test: :func:`emulate_cuda_graphs` lets ``execution="cuda_graph"`` run
on a machine without CUDA, its captures emulated; :func:`drafts_by_execution` checks that
drafters that draft in fixed shapes (:mod:`specdec.static_draft`) draft exactly the same when
their loops are recorded and replayed as unrecorded (``static``), which the drafters' own tests
check against recomputation."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from specdec import LLM, SamplingParams, runner, static_forward
from specdec.cuda_graphs import record_graph
from specdec.graph_emulation import emulate_graph
from specdec.testing.conformance import fixed_draft_len, recorded_proposals


def emulate_cuda_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let ``execution="cuda_graph"`` run where there is no CUDA device, its captures emulated
    (:mod:`specdec.graph_emulation`): the target's forwards recorded and replayed with a CUDA
    graph's semantics, and the drafters' recorded steps too (:meth:`RecordedCalls.like_target`
    then gives ``emulated`` calls). On CUDA it changes nothing."""
    resolve = static_forward.resolve_execution
    monkeypatch.setattr(runner, "resolve_execution",
                        lambda mode, device: mode if mode == "cuda_graph" else resolve(mode, device))
    monkeypatch.setattr(static_forward, "record_graph", lambda run, device, pool=None: (
        record_graph(run, device, pool) if device.type == "cuda" else emulate_graph(run)))


def drafts_by_execution(
    model: torch.nn.Module,
    config: dict[str, Any],
    tokenizer: Any,
    resources: type,
    monkeypatch: pytest.MonkeyPatch,
    prompts: list[dict[str, list[int]]],
    executions: tuple[str, ...] = ("static", "cuda_graph"),
    max_tokens: int = 24,
) -> dict[str, tuple[list[list[int]], list[tuple[list[int], list[int], list[int] | None]], int]]:
    """For each execution: the outputs of generating ``prompts`` greedily together (the draft
    length fixed), every proposal of ``resources.propose`` as (tokens so far, drafts, parents), and
    how many shapes the drafter recorded and still replays (0 if recording failed and it fell
    back to drafting unrecorded). Off CUDA, ``cuda_graph`` runs with its captures emulated
    (:func:`emulate_cuda_graphs`)."""
    seen = recorded_proposals(monkeypatch, resources)
    if "cuda_graph" in executions:
        emulate_cuda_graphs(monkeypatch)
    runs = {}
    for execution in executions:
        seen.clear()
        with LLM(model, fixed_draft_len(config), tokenizer=tokenizer, execution=execution, max_batch_size=len(prompts)) as llm:
            outputs = llm.generate(prompts, SamplingParams(max_tokens=max_tokens))
            recorded = llm.engine.resource_manager.recorded
            shapes = len(recorded.shapes) if recorded is not None and recorded.mode != "static" else 0
        runs[execution] = ([o.token_ids for o in outputs], [(ids, list(p.token_ids), p.parents) for ids, p in seen], shapes)
    return runs
