"""A check for drafters that draft in fixed shapes (:mod:`specdec.static_draft`): where their
loops are recorded and replayed (as CUDA graphs on CUDA; emulated, with the same semantics, on
any device), they must draft exactly what the same loops draft unrecorded (``static``), which
the drafters' own tests check against recomputation."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from specdec import LLM, SamplingParams
from specdec.static_draft import RecordedCalls
from specdec.testing.conformance import fixed_draft_len, recorded_proposals


def recording_executions(device: torch.device) -> tuple[str, str]:
    """The unrecorded execution and the recorded one to compare it with on ``device``: CUDA
    graphs on CUDA, their emulation elsewhere."""
    return ("static", "cuda_graph" if device.type == "cuda" else "emulated")


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
    back to drafting unrecorded). ``emulated`` runs the static path with the drafter's calls
    recorded in emulation (:mod:`specdec.graph_emulation`)."""
    seen = recorded_proposals(monkeypatch, resources)
    runs = {}
    for execution in executions:
        seen.clear()
        with monkeypatch.context() as patch:
            if execution == "emulated":
                patch.setattr(RecordedCalls, "like_target", classmethod(
                    lambda cls, target, clock=None: cls("emulated", target.device, clock)))
            with LLM(model, fixed_draft_len(config), tokenizer=tokenizer, max_batch_size=len(prompts),
                     execution="static" if execution == "emulated" else execution) as llm:
                outputs = llm.generate(prompts, SamplingParams(max_tokens=max_tokens))
                recorded = llm.engine.resource_manager.recorded
                shapes = len(recorded.shapes) if recorded is not None and recorded.mode != "static" else 0
        runs[execution] = ([o.token_ids for o in outputs], [(ids, list(p.token_ids), p.parents) for ids, p in seen], shapes)
    return runs
