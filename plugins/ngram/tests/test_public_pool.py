"""A shared n-gram pool stays bounded over hundreds of requests through the real LLM, and lossless."""

from __future__ import annotations

import gc
import random
import weakref

import pytest

from specdec import LLM, SamplingParams
from specdec.testing import make_tiny_target

ROUNDS, PER_ROUND, MAX_TOKENS = 10, 30, 12


def _prompts(target, rng: random.Random) -> list[dict]:
    """Short prompts that repeat themselves, so n-gram drafts get accepted."""
    prompts = []
    for _ in range(PER_ROUND):
        word = "".join(rng.choice("abcdefghij") for _ in range(5))
        prompts.append({"prompt_token_ids": target.encode(f"{word} {word} {word[:3]}")})
    return prompts


@pytest.mark.parametrize("kept", [8, 0])
def test_public_pool_memory_stays_flat_and_output_lossless(kept: int):
    """300 requests through one LLM, 4 at a time, with ``max_cached_requests`` 8 (or 0): after
    every round the pool holds the candidates of exactly that many finished requests (no more
    candidates than they can have), sequences pushed out earlier are no longer referenced, drafts
    are accepted (with 0, from the requests running, their own sequences included), and each
    output equals plain greedy decoding."""
    target = make_tiny_target(seed=0)
    plain = LLM(target.model, None, tokenizer=target.tokenizer)
    config = {"method": "ngram", "is_public_pool": True, "max_cached_requests": kept,
              "max_draft_len": 3, "prompt_lookup_max": 3, "adaptive_draft_len": False}
    rng = random.Random(0)
    params = SamplingParams(max_tokens=MAX_TOKENS)
    earlier: list[weakref.ref] = []
    accepted = 0
    with LLM(target.model, config, tokenizer=target.tokenizer, max_batch_size=4) as llm:
        pool = llm.engine.resource_manager.public_pool
        for _ in range(ROUNDS):
            prompts = _prompts(target, rng)
            got = llm.generate(prompts, params)
            assert [o.token_ids for o in got] == [o.token_ids for o in plain.generate(prompts, params)]
            accepted += sum(o.metrics.num_accepted_tokens for o in got)

            longest = max(len(p["prompt_token_ids"]) for p in prompts) + MAX_TOKENS
            assert pool.num_sequences == kept
            assert pool.num_candidates <= kept * longest * 3  # n-gram sizes 1-3 at each position
            referenced = {id(seq) for candidates in pool._table.values() for seq, _ in candidates.values()}
            assert referenced == {id(seq) for seq in pool._finished}
            gc.collect()
            assert all(ref() is None for ref in earlier), "an evicted sequence is still referenced"
            earlier = [weakref.ref(seq) for seq in pool._finished]
    assert accepted > 0, "no n-gram draft was accepted: the test would prove nothing"
