"""The n-gram pool follows TensorRT-LLM's option semantics, indexes incrementally and stays bounded."""

import gc
import weakref

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


def test_forgotten_sequences_beyond_the_bound_are_evicted():
    """Only the ``max_cached_sequences`` most recently finished sequences keep candidates; older
    ones leave the table entirely and nothing references them any more."""
    pool = NGramPool(1, 2, max_cached_sequences=2)
    finished = []
    for key in range(5):
        tokens = [100 * key + i for i in range(6)]  # no n-gram shared between sequences
        pool.update(key, tokens)
        finished.append(weakref.ref(pool._sequences[key]))
        pool.forget(key)
        del tokens
    gc.collect()
    assert [ref() is None for ref in finished] == [True, True, True, False, False]
    assert pool.num_sequences == 2
    # Two sequences of 6 tokens: 5 unigrams and 4 bigrams each.
    assert pool.num_candidates == len(pool) == 2 * (5 + 4)
    assert pool.propose([300], 2) == [301, 302]
    assert pool.propose([100], 2) == []


def test_shared_ngrams_keep_the_candidates_of_kept_sequences():
    """Evicting a sequence removes its candidates only; an n-gram other sequences share stays."""
    pool = NGramPool(1, 1, max_cached_sequences=1)
    pool.update(0, [7, 1, 7, 2])
    pool.forget(0)
    pool.update(1, [7, 3])
    pool.forget(1)
    assert pool.propose([7], 1) == [3]
    assert pool.num_candidates == 1


def test_running_sequences_are_never_evicted():
    """With no finished sequence kept at all, a running sequence still drafts from its own
    n-grams while hundreds of others start and finish around it."""
    pool = NGramPool(1, 3, max_cached_sequences=0)
    running = [1, 2, 3, 4, 1, 2]
    pool.update(0, running)
    for key in range(1, 300):
        pool.update(key, [1, 2, 9, 9, key % 5])
        pool.forget(key)
        running.append(key % 4 + 1)
        pool.update(0, running)
        assert pool.num_sequences == 1
    assert pool.propose([9], 1) == []  # the finished sequences' n-grams are gone
    assert pool.propose([1, 2], 2) == [3, 4]
    pool.forget(0)
    assert pool.num_sequences == 0 and len(pool) == 0


def test_max_cached_requests_must_be_a_count():
    """A negative or non-integer bound is a config error naming the field."""
    assert parse_speculative_config({"method": "ngram"}).max_cached_requests == 256
    for value in (-1, "many", 2.5):
        with pytest.raises(ConfigError, match="max_cached_requests"):
            parse_speculative_config({"method": "ngram", "is_public_pool": True, "max_cached_requests": value})
