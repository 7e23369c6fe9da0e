"""A check for drafters that draft in fixed shapes (:mod:`specdec.static_draft`): on CUDA, where
their loops are recorded as CUDA graphs and replayed, they must draft exactly what the same loops
draft unrecorded (``static``), which the drafters' own tests check against recomputation."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from specdec import LLM, SamplingParams
from specdec.testing.conformance import fixed_draft_len, recorded_proposals


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
    how many shapes the drafter recorded (those are replayed from then on)."""
    seen = recorded_proposals(monkeypatch, resources)
    runs = {}
    for execution in executions:
        seen.clear()
        with LLM(model, fixed_draft_len(config), tokenizer=tokenizer, execution=execution, max_batch_size=len(prompts)) as llm:
            outputs = llm.generate(prompts, SamplingParams(max_tokens=max_tokens))
            recorded = llm.engine.resource_manager.recorded
            shapes = len(recorded.shapes) if recorded is not None else 0
        runs[execution] = ([o.token_ids for o in outputs], [(ids, list(p.token_ids), p.parents) for ids, p in seen], shapes)
    return runs
