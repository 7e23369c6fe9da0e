"""The draft model's KV cache lives only while requests do, and one draft/target ``LLM`` serves
several threads."""

from __future__ import annotations

import threading
from pathlib import Path

from specdec import LLM, SamplingParams

PROMPTS = ["hello world, hello", "abc abd abe ab", "one two three, one two", "the cat sat on the mat. the cat"]


def config(draft: Path) -> dict:
    return {"method": "draft_target", "speculative_model": str(draft), "max_draft_len": 3, "adaptive_draft_len": False}


def test_the_draft_cache_is_released_when_generate_returns(tiny, small_draft_dir: Path) -> None:
    """While requests run the draft holds a row each; once ``generate`` returns it holds none
    (the rows of finished requests used to stay until the next call's first step)."""
    with LLM(tiny.model, config(small_draft_dir), tokenizer=tiny.tokenizer, max_batch_size=2) as llm:
        drafter = llm.engine.resource_manager.drafter
        engine, seen = llm.engine, []
        step = engine.step

        def counting_step(*args, **kwargs):
            deltas = step(*args, **kwargs)
            seen.append(drafter.cache.num_rows)
            return deltas

        engine.step = counting_step
        llm.generate([{"prompt_token_ids": tiny.encode(p)} for p in PROMPTS], SamplingParams(max_tokens=16))
        assert max(seen) == 2
        assert drafter.cache.num_rows == 0 and drafter.rows == []


def test_two_threads_share_one_draft_target_llm(tiny, small_draft_dir: Path) -> None:
    """``generate`` called from two threads at once gives each thread the outputs it gets alone
    (calls are serialized; a draft/target LLM used to fail with a tensor size mismatch)."""
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    prompts = [[{"prompt_token_ids": tiny.encode(p)} for p in PROMPTS[:2]], [{"prompt_token_ids": tiny.encode(p)} for p in PROMPTS[2:]]]
    with LLM(tiny.model, config(small_draft_dir), tokenizer=tiny.tokenizer) as llm:
        expected = [[o.token_ids for o in llm.generate(batch, params)] for batch in prompts]
        got: list[list[list[int]] | BaseException] = [[], []]

        def run(i: int) -> None:
            try:
                for _ in range(3):
                    outputs = llm.generate(prompts[i], params)
                    assert [o.token_ids for o in outputs] == expected[i]
                got[i] = [o.token_ids for o in outputs]
            except BaseException as exc:  # reported below, in the test's thread
                got[i] = exc

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
    assert got == expected
