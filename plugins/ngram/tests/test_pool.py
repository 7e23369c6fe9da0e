"""The n-gram pool follows TensorRT-LLM's option semantics and indexes incrementally."""

import pytest

from specdec.config_loader import parse_speculative_config
from specdec.errors import ConfigError
from specdec_ngram import NGramDecodingConfig, NGramPool


def test_longest_suffix_wins_and_draft_is_what_followed():
    pool = NGramPool(min_n=1, max_n=3)
    tokens = [1, 2, 3, 9, 2, 3, 4, 5, 1, 2, 3]
    pool.update(0, tokens)
    # Suffix (1, 2, 3) occurred at the start followed by 9; (2, 3) alone would also match 4.
    assert pool.propose(tokens, 3) == [9, 2, 3]


def test_suffix_never_matches_itself():
    pool = NGramPool(min_n=1, max_n=2)
    tokens = [5, 6, 7]
    pool.update(0, tokens)
    assert pool.propose(tokens, 4) == []


def test_oldest_and_newest_candidates():
    tokens = [1, 2, 1, 3, 1, 4, 1]
    oldest = NGramPool(1, 1, keep_all=True, use_oldest=True)
    newest = NGramPool(1, 1, keep_all=True, use_oldest=False)
    oldest.update(0, tokens)
    newest.update(0, tokens)
    assert oldest.propose(tokens, 1) == [2]
    assert newest.propose(tokens, 1) == [4]


def test_keep_one_keeps_the_largest_candidate():
    pool = NGramPool(1, 1, keep_all=False, max_draft_len=3)
    tokens = [1, 2, 3, 4, 1, 7]
    pool.update(0, tokens)
    # The newer occurrence of 1 has a 1-token continuation; the older one a full 3 tokens.
    assert pool.propose(tokens + [1], 3) == [2, 3, 4]
    tokens += [8, 9, 1]
    pool.update(0, tokens)
    # Now the newer occurrence is as large (3 tokens), so it replaces the older one.
    assert pool.propose(tokens, 3) == [7, 8, 9]


def test_update_is_incremental():
    pool = NGramPool(1, 2)
    tokens = [1, 2, 3]
    pool.update(0, tokens)
    size = len(pool)
    tokens.append(4)
    pool.update(0, tokens)
    # Only the n-grams ending at the new position were added: (3,) and (2, 3).
    assert len(pool) == size + 2
    assert pool.propose([3], 2) == [4]


def test_candidates_read_live_continuations():
    pool = NGramPool(1, 1)
    tokens = [7, 8]
    pool.update(0, tokens)
    tokens.extend([9, 10])
    # The candidate for 7 sees tokens appended after it was indexed.
    assert pool.propose([7], 3) == [8, 9, 10]


def test_vllm_and_trtllm_spellings():
    a = parse_speculative_config({"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2, "prompt_lookup_max": 5})
    b = parse_speculative_config({"decoding_type": "NGram", "max_draft_len": 5, "max_matching_ngram_size": 5, "prompt_lookup_min": 2})
    assert a == b and isinstance(a, NGramDecodingConfig)


def test_min_above_max_is_refused_naming_the_fields():
    with pytest.raises(ConfigError, match="prompt_lookup_min"):
        parse_speculative_config({"method": "ngram", "prompt_lookup_min": 4, "prompt_lookup_max": 2})
