"""The in-place growable KV cache gives bit-identical logits to transformers' DynamicCache, and a
drafter's ragged batch of request caches attends as each request alone."""

import torch
from transformers import DynamicCache

from specdec.attention import grouped_query_attention
from specdec.kv_cache import RaggedDraftBatch, RequestKV, padded_key_length
from specdec.runner import ModelRunner
from specdec.testing import make_tiny_target


def test_growable_cache_matches_dynamic_cache_across_growth_and_rollback(tiny):
    """Prefill, then 20 verify-sized steps with rollbacks, crossing the buffer's first growth.
    (Verify steps read their keys in whole blocks of 32, transformers' cache the exact count: the
    logits agree to float32 summation order.)"""
    runner = ModelRunner(tiny.model)
    ids = list(range(3, 33)) * 10
    ours, theirs = runner.new_cache(), DynamicCache(config=tiny.model.config)
    assert torch.equal(runner.forward(ours, ids[:250]).logits, runner.forward(theirs, ids[:250]).logits)
    for step in range(20):
        window = ids[250 + step : 255 + step]
        torch.testing.assert_close(runner.forward(ours, window).logits, runner.forward(theirs, window).logits, atol=1e-5, rtol=1e-5)
        runner.rollback(ours, 4)
        runner.rollback(theirs, 4)
        assert runner.cache_length(ours) == runner.cache_length(theirs) == 251 + step


def test_batched_rows_match_single_request_forwards(tiny):
    """Requests of different lengths share one batch cache, append different numbers of tokens
    per step and roll back different amounts, and each row's logits stay those of the request
    run alone; finished rows leave and new ones join without disturbing the others."""
    runner = ModelRunner(tiny.model)
    prompts = [list(range(3, 35)), list(range(10, 17)), (list(range(3, 30)) * 11)[:295]]
    batch, alone = runner.new_cache(rows=0), []
    for prompt in prompts:
        single = runner.new_cache()
        runner.forward(single, prompt)
        batch.append_rows(single)
        alone_cache = runner.new_cache()
        runner.forward(alone_cache, prompt)
        alone.append(alone_cache)
    assert batch.lengths == [len(p) for p in prompts]
    steps = [([7, 8, 9], [4], [11, 12]), ([5], [6, 7, 8, 9, 10], [3]), ([20, 21], [22], [23, 24, 25, 26])]
    rollbacks = [[2, 0, 1], [0, 3, 0], [1, 0, 3]]
    for rows, back in zip(steps, rollbacks):
        outputs = runner.forward_rows(batch, [list(r) for r in rows])
        for b, r in enumerate(rows):
            expected = runner.forward(alone[b], list(r)).logits
            torch.testing.assert_close(outputs[b].logits, expected, atol=1e-5, rtol=1e-5)
            assert torch.equal(outputs[b].logits.argmax(-1), expected.argmax(-1))
            runner.rollback(alone[b], back[b])
        runner.rollback_rows(batch, back)
        assert batch.lengths == [runner.cache_length(c) for c in alone]
    batch.select_rows([2, 0])
    joiner = runner.new_cache()
    runner.forward(joiner, [9, 9, 8])
    batch.append_rows(joiner)
    outputs = runner.forward_rows(batch, [[30], [31, 32], [33]])
    for cache, row, out in zip([alone[2], alone[0], joiner], [[30], [31, 32], [33]], outputs):
        reference = cache if cache is not joiner else runner.new_cache()
        if cache is joiner:
            runner.forward(reference, [9, 9, 8])
        torch.testing.assert_close(out.logits, runner.forward(reference, row).logits, atol=1e-5, rtol=1e-5)


def test_rows_of_a_cache_that_never_ran_can_join(tiny):
    """A fresh cache (no forward yet) joins a running batch as empty rows, and a running cache
    joins a fresh batch; the empty row then prefills inside the batch like any other."""
    runner = ModelRunner(tiny.model)
    batch = runner.new_cache()
    runner.forward(batch, [5, 6, 7])
    batch.append_rows(runner.new_cache())
    assert batch.lengths == [3, 0]
    out = runner.forward_rows(batch, [[8], [9, 10, 11]])
    fresh = runner.new_cache()
    torch.testing.assert_close(out[1].logits, runner.forward(fresh, [9, 10, 11]).logits, atol=1e-5, rtol=1e-5)
    empty = runner.new_cache(rows=0)
    empty.append_rows(batch)
    assert empty.lengths == [4, 3]


def test_a_joining_request_takes_a_finished_rows_place(tiny):
    """A request prefilled alone replaces a finished row in place: first a shorter one (the old
    row's stale entries past its length are never read), then one longer than the batch's
    capacity (the buffers grow). Each row's logits stay those of its request run alone."""
    runner = ModelRunner(tiny.model)

    def alone(tokens: list[int], last: int) -> torch.Tensor:
        return runner.forward(runner.new_cache(), tokens).logits[-last:]

    neighbour = list(range(10, 17))
    batch = runner.new_cache(rows=0)
    for prompt in (list(range(3, 35)), neighbour):
        single = runner.new_cache()
        runner.forward(single, prompt)
        batch.append_rows(single)
    capacity = batch.layers[0]._key_buf.shape[-2]
    for newcomer, step in (([9, 9, 8], [32]), ((list(range(3, 30)) * 23)[:600], [33])):
        joining = runner.new_cache()
        runner.forward(joining, newcomer)
        batch.replace_row(0, joining)
        assert batch.lengths == [len(newcomer), len(neighbour)]
        first, second = runner.forward_rows(batch, [[30, 31], step])
        torch.testing.assert_close(first.logits, alone(newcomer + [30, 31], 2), atol=1e-5, rtol=1e-5)
        neighbour = neighbour + step
        torch.testing.assert_close(second.logits, alone(neighbour, 1), atol=1e-5, rtol=1e-5)
    assert batch.layers[0]._key_buf.shape[-2] > capacity


def test_capacity_stops_at_the_models_context(device):
    """Two ragged rows decoded in verify steps to the end of a 300-token context (the batch pads
    the shorter step): the buffers never hold more than the context plus a forward's width, in
    whole blocks of keys (:func:`~specdec.kv_cache.padded_key_length`),
    where they used to double (to 512) once past their first 256 entries. The last forward's
    logits are still those of each request run alone."""
    model = make_tiny_target(num_layers=1, hidden=32, device=device).model
    model.config.max_position_embeddings = 300
    runner = ModelRunner(model)
    tokens = [(list(range(3, 30)) * 10)[:240], list(range(3, 30)) * 8]
    batch = runner.new_cache(rows=0)
    for prompt in tokens:
        single = runner.new_cache()
        runner.forward(single, prompt)
        batch.append_rows(single)
    # Verify 1 + 5 drafts in the long row and 1 + 2 in the other; keep 2 and 1 of them.
    steps = [[5, 6, 7, 8, 9, 10], [11, 12, 13]]
    while len(tokens[0]) < runner.max_length - 1:
        outputs = runner.forward_rows(batch, steps)
        assert batch.layers[0]._key_buf.shape[-2] <= padded_key_length(runner.max_length + len(steps[0]))
        seen = [row + step for row, step in zip(tokens, steps)]
        runner.rollback_rows(batch, [4, 2])
        tokens = [tokens[0] + steps[0][:2], tokens[1] + steps[1][:1]]
    for row, step, out in zip(seen, steps, outputs):
        alone = runner.forward(runner.new_cache(), row).logits[-len(step) :]
        torch.testing.assert_close(out.logits, alone, atol=1e-5, rtol=1e-5)


def test_a_ragged_draft_batch_attends_as_each_request_alone():
    """Requests with 5, 0 and 9 cached positions take two batched appends, the first padded (3, 1
    and 2 real positions); each row's attention equals that request's own over its own cache, the
    padding is never attended by later positions, and ``appended`` hands back a row's real keys."""
    torch.manual_seed(0)
    heads, kv_heads, dim = 4, 2, 8
    caches = []
    for length in (5, 0, 9):
        cache = RequestKV()
        if length:
            cache.append(torch.randn(1, kv_heads, length, dim), torch.randn(1, kv_heads, length, dim))
        caches.append(cache)
    batch = RaggedDraftBatch([[c] for c in caches], room=4, device=torch.device("cpu"))
    counts = [3, 1, 2]
    for width, real in ((3, torch.arange(3)[None] < torch.tensor(counts)[:, None]), (1, torch.ones(3, 1, dtype=torch.bool))):
        q = torch.randn(3, heads, width, dim)
        k, v = torch.randn(3, kv_heads, width, dim), torch.randn(3, kv_heads, width, dim)
        mask = batch.extend(real)
        keys, values = batch.layer(0).append(k, v)
        out = grouped_query_attention(q, keys, values, mask)
        for row, cache in enumerate(caches):
            n = int(real[row].sum())
            own_k, own_v = cache.append(k[row : row + 1, :, :n], v[row : row + 1, :, :n])
            causal = torch.ones(n, cache.length, dtype=torch.bool).tril(cache.length - n)
            alone = grouped_query_attention(q[row : row + 1, :, :n], own_k, own_v, causal)
            torch.testing.assert_close(out[row : row + 1, :, :n], alone)
            torch.testing.assert_close(batch.appended(row, n)[0][0], k[row : row + 1, :, :n])
        assert mask is not None  # the first extend is padded; the second still has padding before it
