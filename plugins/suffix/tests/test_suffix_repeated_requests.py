"""Suffix decoding on the workload it is made for: a request sent again (a retry, n-sampling, an
agent loop) is drafted from the global tree's copy of its earlier output."""

from __future__ import annotations

from specdec import LLM, SamplingParams
from specdec_suffix import SuffixDecodingConfig


def test_a_repeated_request_drafts_its_earlier_output(tiny) -> None:
    """The second run of a greedy request accepts long drafts (its first run's output, from the
    global tree), its output unchanged; without the global tree it accepts less (the tiny model
    repeats itself, so its own tokens already draft well)."""
    prompt = {"prompt_token_ids": tiny.encode("the quick brown fox jumps over")}
    params = SamplingParams(max_tokens=48, ignore_eos=True)
    with LLM(tiny.model, None, tokenizer=tiny.tokenizer) as plain:
        expected = plain.generate(prompt, params)[0].token_ids
    lengths = {}
    for cached in (10000, 0):
        config = SuffixDecodingConfig(max_draft_len=8, adaptive_draft_len=False, suffix_decoding_max_cached_requests=cached)
        with LLM(tiny.model, config, tokenizer=tiny.tokenizer) as llm:
            first = llm.generate(prompt, params)[0]
            second = llm.generate(prompt, params)[0]
        assert first.token_ids == second.token_ids == expected
        lengths[cached] = second.metrics.mean_acceptance_length
    assert lengths[10000] > 6 and lengths[10000] > lengths[0] + 1, lengths
