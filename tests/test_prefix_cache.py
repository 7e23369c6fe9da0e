"""Prefix caching: a prompt whose leading blocks an earlier prompt computed prefills from them
with the same bits as prefilling it cold (logits, every layer's keys and values, the kept hidden
states), on every architecture the cache holds; outputs, speculative and plain, do not change; the
cache keeps to its memory budget, least recently used leaves first; users turn it off or size it
by name."""

from __future__ import annotations

import pytest
import torch

from specdec import LLM, SamplingParams
from specdec.errors import ConfigError
from specdec.prefill import Prefill, PromptForward
from specdec.prefix_cache import PrefixCache
from specdec.runner import ModelRunner
from specdec.testing.architectures import FULL_ATTENTION, SLIDING_WINDOW, make_tiny_model
from specdec.testing.tiny import TinyTarget

BLOCK = 16


def _tokens(target: TinyTarget, count: int, seed: int = 0) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, target.model.config.vocab_size, (count,), generator=generator).tolist()


def _assert_same_bits(hit: PromptForward, cold: PromptForward) -> None:
    assert torch.equal(hit.output.logits, cold.output.logits)
    length = len(cold.prompt)
    assert hit.cache.lengths == cold.cache.lengths == [length]
    for (hit_keys, hit_values), (cold_keys, cold_values) in zip(hit.cache.entries(0, 0, length), cold.cache.entries(0, 0, length), strict=True):
        assert torch.equal(hit_keys, cold_keys) and torch.equal(hit_values, cold_values)
    if cold.output.hidden_states is not None:
        for layer in cold.output.hidden_states.kept:
            assert torch.equal(hit.output.hidden_states[layer], cold.output.hidden_states[layer])


@pytest.mark.parametrize("name", [*FULL_ATTENTION, *SLIDING_WINDOW])
def test_a_hit_prefills_the_bits_of_a_cold_prefill(name: str, device: torch.device) -> None:
    target = make_tiny_model(name, device=device)
    runner = ModelRunner(target.model)
    runner.hidden_layers = (1, -1)  # kept hidden states are cached with the blocks
    tokens = _tokens(target, 90)
    warm = Prefill(runner, PrefixCache(1 << 30, BLOCK))
    first = warm(tokens[:53] + [5])  # three whole blocks, the fourth differs
    assert first.cached_tokens == 0
    hit = warm(tokens[:70])
    assert hit.cached_tokens == 3 * BLOCK
    _assert_same_bits(hit, Prefill(runner, PrefixCache(1 << 30, BLOCK))(tokens[:70]))
    # The last token is always computed: a prompt of exactly four blocks reuses three.
    assert warm(tokens[:64]).cached_tokens == 3 * BLOCK
    assert warm(tokens[:65]).cached_tokens == 4 * BLOCK


@pytest.mark.parametrize("name", [*FULL_ATTENTION, *SLIDING_WINDOW])
def test_chunked_prefill_agrees_with_one_forward(name: str, device: torch.device) -> None:
    """Chunks differ from one forward of the prompt only in summation order (sliding windows,
    whose 4 positions every chunk crosses, included)."""
    target = make_tiny_model(name, device=device)
    runner = ModelRunner(target.model)
    tokens = _tokens(target, 100)
    chunked = Prefill(runner, PrefixCache(1 << 30, BLOCK))(tokens)
    whole = Prefill(runner)(tokens)
    assert whole.cached_tokens == 0
    torch.testing.assert_close(chunked.output.logits, whole.output.logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("method", [None, {"method": "ngram", "num_speculative_tokens": 3}])
def test_outputs_with_and_without_cached_blocks_are_the_same(tiny: TinyTarget, method: dict | None) -> None:
    """A request that finds its prompt's blocks cached decodes the same tokens as one that
    computed them, alone and batched; the metrics say how many prompt tokens came from the cache."""
    tokens = _tokens(tiny, 300)
    prompts = [{"prompt_token_ids": tokens[:200]}, {"prompt_token_ids": tokens[:150] + tokens[:100]}]
    params = SamplingParams(max_tokens=24)
    llm = LLM(tiny.model, method, tokenizer=tiny.tokenizer)
    llm.engine.prefill.prefix_cache.block_size = BLOCK
    cold = llm.generate(prompts, params)
    assert [o.metrics.num_cached_tokens for o in cold] == [0, 144]  # the second shares 144 tokens with the first
    again = llm.generate(prompts[::-1], params)[::-1]
    assert [o.metrics.num_cached_tokens for o in again] == [192, 240]
    assert [o.token_ids for o in again] == [o.token_ids for o in cold]
    uncached = LLM(tiny.model, method, tokenizer=tiny.tokenizer, enable_prefix_caching=False)
    assert uncached.engine.prefill.prefix_cache is None
    assert [o.metrics.num_cached_tokens for o in uncached.generate(prompts, params)] == [0, 0]


def test_the_least_recently_used_leaf_leaves_first() -> None:
    entry = torch.zeros(2, BLOCK, 4)  # 512 bytes a tensor: a block of one layer is 1,024 bytes
    contents = lambda index: ([(entry.clone(), entry.clone())], None)  # noqa: E731
    cache = PrefixCache(3 * 1024, BLOCK)
    a = list(range(3 * BLOCK))
    cache.insert(a, contents)
    assert len(cache) == 3 and cache.used_bytes == 3 * 1024
    b = a[:BLOCK] + [7] * (2 * BLOCK)  # shares a's first block
    cache.insert(b, contents)
    # Room for b's two new blocks came from a's last two, least recently used first; a's first
    # block is b's too (and a block is never used less recently than the blocks continuing it).
    assert len(cache) == 3 and cache.used_bytes == 3 * 1024
    assert len(cache.match(a + [0])) == 1
    assert len(cache.match(b + [0])) == 3
    # A block larger than the whole budget is not kept, and nothing is evicted for it.
    cache.insert([9] * BLOCK, lambda index: ([(torch.zeros(2, BLOCK, 64),) * 2], None))
    assert len(cache) == 3 and cache.match([9] * BLOCK + [0]) == []
    cache.clear()
    assert len(cache) == 0 and cache.used_bytes == 0 and cache.match(b + [0]) == []


def test_a_prefix_cache_budget_must_be_positive(tiny: TinyTarget) -> None:
    with pytest.raises(ConfigError, match="prefix_cache_gib"):
        LLM(tiny.model, None, tokenizer=tiny.tokenizer, prefix_cache_gib=0)
