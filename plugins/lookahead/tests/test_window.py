"""The lookahead window and pool on their own: the window's tree gives each guess exactly the
context Jacobi iteration needs, iteration on a first-order target collects only true n-grams,
the pool keeps the newest n-grams per key, and in the engine each next row is the target's pick
after its column."""

from __future__ import annotations

import itertools

import torch

from specdec import LLM, DraftTree, SamplingParams, path_to
from specdec_lookahead import LookaheadDecodingConfig
from specdec_lookahead.plugin import LookaheadResources
from specdec_lookahead.pool import NGramPool
from specdec_lookahead.window import LookaheadWindow


def test_each_guess_sees_the_first_row_up_to_its_column_then_its_column():
    """A guess's ancestors in the tree are the context the lookahead branch gives it: the first
    row up to its column, then its column of the rows above it; its depth is its position."""
    window = LookaheadWindow(width=3, ngram=4, fillers=[0], seed=0)
    window.rows = [[10, 11, 12], [20, 21, 22], [30, 31, 32]]
    tree = DraftTree()
    last = window.lay_out(tree)
    assert [tree.token_ids[n] for n in last] == [30, 31, 32]
    for column, node in enumerate(last):
        context = [tree.token_ids[n] for n in path_to(node, tree.parents)]
        assert context == [10, 11, 12][: column + 1] + [20 + column, 30 + column]


def test_jacobi_iteration_on_a_first_order_target_collects_true_ngrams():
    """With a target whose next token depends on the previous one only, every n-gram the window
    hands the pool follows the target once the columns the filling left with prompt tokens
    have been iterated through (N - 1 steps after the window is full)."""
    def follow(token: int) -> int:
        return (token * 7 + 3) % 50

    window = LookaheadWindow(width=5, ngram=4, fillers=list(range(50)), seed=1)
    settling, pool = NGramPool(n=4, capacity=8), NGramPool(n=4, capacity=8)
    for step in range(12):
        next_row = [follow(row_last) for row_last in window.rows[-1]]
        # Filling takes 2 steps, and 3 more carry the filler columns out of the window.
        window.advance(next_row, tokens=1, pool=settling if step < 2 + 3 else pool)
    ngrams = [(key, c) for key in range(50) for c in pool.candidates(key)]
    assert len(ngrams) >= 5
    for key, continuation in ngrams:
        chain = [key, *continuation]
        assert all(follow(a) == b for a, b in itertools.pairwise(chain)), chain


def test_advancing_by_several_tokens_moves_the_columns_left():
    window = LookaheadWindow(width=4, ngram=3, fillers=[99], seed=0)
    window.rows = [[1, 2, 3, 4], [5, 6, 7, 8]]
    pool = NGramPool(n=3, capacity=4)
    window.advance([9, 10, 11, 12], tokens=3, pool=pool)  # full window: rows move up, then 2 columns left
    assert window.rows == [[7, 8, 99, 99], [11, 12, 99, 99]]
    assert pool.candidates(1) == [(5, 9)] and pool.candidates(4) == [(8, 12)]
    window.advance(None, tokens=5, pool=pool)  # the window was not forwarded: only the columns move
    assert window.rows == [[99] * 4, [99] * 4]


def test_the_pool_keeps_the_newest_ngrams_per_key():
    pool = NGramPool(n=3, capacity=2)
    pool.add_sequence([1, 2, 3, 1, 2, 4, 1, 5, 6])
    assert pool.candidates(1) == [(5, 6), (2, 4)]
    pool.add(1, (2, 4))
    assert pool.candidates(1) == [(2, 4), (5, 6)]
    assert pool.candidates(7) == []
    pool.add_sequence([1, 2, 3, 1, 2, 9], start=5)  # only the n-grams ending at position 5 or later
    assert pool.candidates(1) == [(2, 9), (2, 4)]


def test_the_next_row_is_the_targets_pick_after_each_column(tiny, monkeypatch):
    """In the engine, the row the window receives after a step is, column by column, the
    target's greedy pick after that column's context (checked by a plain forward of the
    context), while the window fills and once it is full (4 rows): the window reads the right
    rows of the verify forward."""
    records = []
    accept, advance = LookaheadResources.accept, LookaheadWindow.advance

    def recording_accept(self, request, result):
        state = request.method_state
        records.append({"context": request.token_ids[: state.seen], "rows": [list(r) for r in state.window.rows]})
        accept(self, request, result)

    def recording_advance(window, next_row, tokens, pool):
        records[-1]["next_row"] = next_row
        advance(window, next_row, tokens, pool)

    monkeypatch.setattr(LookaheadResources, "accept", recording_accept)
    monkeypatch.setattr(LookaheadWindow, "advance", recording_advance)
    config = LookaheadDecodingConfig(max_window_size=3, max_ngram_size=5, adaptive_draft_len=False)
    with LLM(tiny.model, config, tokenizer=tiny.tokenizer) as llm:
        llm.generate({"prompt_token_ids": tiny.encode("the cat sat on the mat")}, SamplingParams(max_tokens=64, ignore_eos=True))
    forwarded = [r for r in records if r["next_row"] is not None]
    assert len(forwarded) >= 6 and {len(r["rows"]) for r in forwarded} == {1, 2, 3, 4}
    for record in forwarded:
        rows = record["rows"]
        for column, picked in enumerate(record["next_row"]):
            sequence = record["context"] + rows[0][: column + 1] + [row[column] for row in rows[1:]]
            with torch.no_grad():
                logits = tiny.model(torch.tensor([sequence], device=tiny.model.device)).logits[0, -1]
            assert int(logits.argmax()) == picked
