"""The in-place growable KV cache gives bit-identical logits to transformers' DynamicCache."""

import torch
from transformers import DynamicCache

from specdec.runner import ModelRunner


def test_growable_cache_matches_dynamic_cache_across_growth_and_rollback(tiny):
    """Prefill, then 20 verify-sized steps with rollbacks, crossing the buffer's first growth."""
    runner = ModelRunner(tiny.model)
    ids = list(range(3, 33)) * 10
    ours, theirs = runner.new_cache(), DynamicCache(config=tiny.model.config)
    assert torch.equal(runner.forward(ours, ids[:250]).logits, runner.forward(theirs, ids[:250]).logits)
    for step in range(20):
        window = ids[250 + step : 255 + step]
        assert torch.equal(runner.forward(ours, window).logits, runner.forward(theirs, window).logits), step
        runner.rollback(ours, 4)
        runner.rollback(theirs, 4)
        assert runner.cache_length(ours) == runner.cache_length(theirs) == 251 + step
