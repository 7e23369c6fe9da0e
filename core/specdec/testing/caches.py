"""Batch caches for runner tests."""

from __future__ import annotations

from specdec.kv_cache import BatchKVCache
from specdec.runner import ModelRunner


def prefilled_batch(runner: ModelRunner, prompts: list[list[int]]) -> BatchKVCache:
    """A batch cache of ``runner`` whose row ``b`` holds ``prompts[b]``, each prefilled alone (as
    the engine prefills a request) and then joined to the batch."""
    cache = runner.new_batch_cache()
    for prompt in prompts:
        row = runner.new_cache()
        runner.forward(row, prompt)
        cache.append_rows(row)
    return cache
