"""The request's own tree and the global tree of recent outputs: which draft wins, the match
length's bound, and first-in-first-out eviction by requests and by tokens."""

from __future__ import annotations

from specdec.suffix import SuffixCache


def run(cache: SuffixCache, request_id: int, prompt: list[int], output: list[int]) -> None:
    cache.start(request_id, prompt)
    cache.extend(request_id, prompt + output, len(prompt))
    cache.stop(request_id)


def test_a_repeated_request_drafts_from_the_global_tree() -> None:
    cache = SuffixCache(depth=8, max_cached_requests=10, max_cached_tokens=1000)
    run(cache, 1, [7, 7], [1, 2, 3, 4, 5, 6])
    cache.start(2, [8, 8])
    cache.extend(2, [8, 8, 1, 2, 3], 2)
    draft = cache.speculate(2, [8, 8, 1, 2, 3], 10, 1.0, 0.0, 0.1, tree=False)
    assert draft.token_ids == [4, 5, 6] and draft.match_len == 3


def test_the_match_length_bounds_the_draft() -> None:
    """A match of m tokens drafts at most factor * m + offset tokens."""
    cache = SuffixCache(depth=8, max_cached_requests=10, max_cached_tokens=1000)
    run(cache, 1, [], [1, 2, 3, 4, 5, 6, 7, 8])
    cache.start(2, [9, 2])
    assert cache.speculate(2, [9, 2], 10, 1.0, 0.0, 0.0, tree=False).token_ids == [3]
    assert cache.speculate(2, [9, 2], 10, 2.0, 1.0, 0.0, tree=False).token_ids == [3, 4, 5]
    assert cache.speculate(2, [9, 2], 2, 2.0, 1.0, 0.0, tree=False).token_ids == [3, 4]


def test_the_requests_own_tokens_draft_without_a_global_tree() -> None:
    cache = SuffixCache(depth=8, max_cached_requests=0, max_cached_tokens=0)
    assert cache.global_tree is None
    cache.start(1, [5, 6, 7, 1, 5, 6])
    draft = cache.speculate(1, [5, 6, 7, 1, 5, 6], 10, 1.0, 0.0, 0.1, tree=False)
    assert draft.token_ids == [7, 1] and draft.match_len == 2


def test_eviction_is_first_in_first_out_by_requests_and_tokens() -> None:
    cache = SuffixCache(depth=4, max_cached_requests=2, max_cached_tokens=10)
    for i in range(3):
        run(cache, i, [], [10 * i + t for t in range(4)])
    assert cache.num_cached_requests == 2 and cache.cached_tokens == 8
    assert cache.global_tree.matches([0]) == [] and cache.global_tree.matches([10])  # request 0 left first
    run(cache, 3, [], list(range(100, 106)))  # 14 tokens > 10: request 1 leaves too
    assert cache.num_cached_requests == 2 and cache.cached_tokens == 10
    assert cache.global_tree.matches([10]) == [] and cache.global_tree.matches([20])


def test_running_outputs_are_never_evicted() -> None:
    cache = SuffixCache(depth=4, max_cached_requests=1, max_cached_tokens=3)
    cache.start(1, [])
    cache.extend(1, [1, 2, 3, 4, 5], 0)
    run(cache, 2, [], [9, 9, 9, 9])  # over both bounds: it leaves at once
    assert cache.num_cached_requests == 0
    assert cache.global_tree.matches([1, 2])  # the running request's output stays
    cache.stop(1)
    assert cache.num_cached_requests == 0 and cache.global_tree.num_nodes == 1


def test_forget_finished_empties_the_global_tree_and_keeps_running_requests():
    """After ``forget_finished`` no finished output is drafted from or counted, and a running
    request still drafts from its own tokens."""
    cache = SuffixCache(depth=8, max_cached_requests=10, max_cached_tokens=1000)
    cache.start(1, [1, 2])
    cache.extend(1, [1, 2, 3, 4, 5, 6, 7], 2)
    cache.stop(1)
    cache.start(2, [8, 4, 5])
    assert cache.speculate(2, [8, 4, 5], 4, 4.0, 0.0, 0.0, tree=False).token_ids == [6, 7]
    cache.forget_finished()
    assert cache.num_cached_requests == 0 and cache.cached_tokens == 0
    assert cache.speculate(2, [8, 4, 5], 4, 4.0, 0.0, 0.0, tree=False).token_ids == []
    cache.extend(2, [8, 4, 5, 8, 4], 3)
    assert cache.speculate(2, [8, 4, 5, 8, 4], 4, 4.0, 0.0, 0.0, tree=False).token_ids[:1] == [5]
