"""The runner's grouped-query attention gives what transformers' ``sdpa`` gives, without its copies."""

import copy

import pytest
import torch
from transformers.integrations.sdpa_attention import repeat_kv

from specdec.attention import MIN_BLOCK_ROWS, PACKED_SDPA, block_padding, grouped_query_attention, packed_gqa_attention
from specdec.runner import ModelRunner


class _Grouped(torch.nn.Module):
    num_key_value_groups = 3


@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("boolean", [False, True])
def test_packed_attention_equals_attention_over_repeated_heads(per_head, boolean):
    """Each query head attends to its group's key/value head under its own mask row, as with
    ``repeat_kv``, for shared and per-head masks, additive and boolean."""
    torch.manual_seed(0)
    batch, kv_heads, groups, length, kv, dim = 2, 2, 3, 4, 11, 8
    query = torch.randn(batch, kv_heads * groups, length, dim)
    key, value = torch.randn(batch, kv_heads, kv, dim), torch.randn(batch, kv_heads, kv, dim)
    allowed = torch.rand(batch, kv_heads * groups if per_head else 1, length, kv) < 0.7
    allowed[..., 0] = True
    mask = allowed if boolean else torch.zeros(allowed.shape).masked_fill_(~allowed, torch.finfo(torch.float32).min)
    out, _ = packed_gqa_attention(_Grouped(), query, key, value, mask, scaling=0.3)
    expected = torch.nn.functional.scaled_dot_product_attention(
        query, repeat_kv(key, groups), repeat_kv(value, groups), attn_mask=mask, scale=0.3
    )
    torch.testing.assert_close(out, expected.transpose(1, 2), atol=1e-6, rtol=1e-6)


def test_single_token_without_mask_folds_heads():
    """Plain decoding's one query token with no mask (transformers would pass ``enable_gqa``, which
    PyTorch's CPU attention serves by repeating the keys and values) attends like repeated heads."""
    torch.manual_seed(0)
    query = torch.randn(2, 6, 1, 8)
    key, value = torch.randn(2, 2, 13, 8), torch.randn(2, 2, 13, 8)
    out, _ = packed_gqa_attention(_Grouped(), query, key, value, None, scaling=0.3)
    expected = torch.nn.functional.scaled_dot_product_attention(query, repeat_kv(key, 3), repeat_kv(value, 3), scale=0.3)
    torch.testing.assert_close(out, expected.transpose(1, 2), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("mask_shape", [None, (4, 13), (1, 1, 4, 13), (2, 6, 4, 13)])
def test_grouped_query_attention_equals_repeated_heads(mask_shape):
    """The public helper (draft heads use it) takes no mask, a 2-D causal-style mask, a shared
    4-D mask or a per-head one, and attends as keys and values repeated per head do."""
    torch.manual_seed(0)
    query = torch.randn(2, 6, 4, 8)
    key, value = torch.randn(2, 2, 13, 8), torch.randn(2, 2, 13, 8)
    mask = None
    if mask_shape is not None:
        mask = torch.rand(mask_shape) < 0.7
        mask[..., 0] = True
    out = grouped_query_attention(query, key, value, mask)
    expected = torch.nn.functional.scaled_dot_product_attention(query, repeat_kv(key, 3), repeat_kv(value, 3), attn_mask=mask)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-6)


def test_layers_sharing_a_mask_fold_it_once_and_never_stale():
    """Layers of one forward pass the same mask object: the folded copy is reused for it, and only
    for it: a new mask, or the same one changed in place, gives its own attention."""
    torch.manual_seed(0)
    query = torch.randn(1, 6, 4, 8)
    key, value = torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8)

    def expected(mask):
        return torch.nn.functional.scaled_dot_product_attention(
            query, repeat_kv(key, 3), repeat_kv(value, 3), attn_mask=mask
        ).transpose(1, 2)

    def attend(mask):
        return packed_gqa_attention(_Grouped(), query, key, value, mask)[0]

    mask = torch.zeros(1, 1, 4, 9)
    mask[..., 5:] = torch.finfo(torch.float32).min
    first = attend(mask)
    assert torch.equal(attend(mask), first)
    torch.testing.assert_close(first, expected(mask), atol=1e-6, rtol=1e-6)
    other = torch.zeros(1, 1, 4, 9)
    torch.testing.assert_close(attend(other), expected(other), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(attend(mask), expected(mask), atol=1e-6, rtol=1e-6)
    mask[..., 5:] = 0.0
    torch.testing.assert_close(attend(mask), expected(mask), atol=1e-6, rtol=1e-6)


def test_runner_switches_sdpa_models_only(tiny):
    model = copy.deepcopy(tiny.model)
    ModelRunner(model)
    assert model.config._attn_implementation == PACKED_SDPA
    eager = copy.deepcopy(tiny.model)
    eager.set_attn_implementation("eager")
    ModelRunner(eager)
    assert eager.config._attn_implementation == "eager"


def test_runner_forwards_match_transformers_sdpa(tiny):
    """Batch-1 one-token and verify forwards over a cache (transformers builds the latter's causal mask), ragged batched
    rows and draft trees give the logits of the same model on transformers' own ``sdpa``."""
    model = copy.deepcopy(tiny.model)
    # The shared tiny model may have met a runner already (which switched it); start from sdpa.
    model.set_attn_implementation("sdpa")
    runner = ModelRunner(model)
    assert runner.model.config._attn_implementation == PACKED_SDPA

    def with_sdpa(step):
        runner.model.set_attn_implementation("sdpa")
        try:
            return step()
        finally:
            runner.model.set_attn_implementation(PACKED_SDPA)

    prompts = [list(range(3, 30)), list(range(5, 14)), [3 + i % 30 for i in range(41)]]

    def batch_1():
        cache = runner.new_cache()
        runner.forward(cache, prompts[0])
        one = runner.forward(cache, [7]).logits
        return torch.cat([one, runner.forward(cache, [4, 9, 11, 6]).logits])

    def batched():
        cache = runner.new_cache(3)
        runner.forward_rows(cache, prompts)
        chains = runner.forward_rows(cache, [[4, 9, 11], [6], [8, 8]])
        trees = runner.forward_rows(cache, [[5, 6, 7, 8], [9, 10], [3]], parents=[[-1, 0, 0, 1], None, [-1]])
        return torch.cat([o.logits for o in chains + trees])

    for step in (batch_1, batched):
        torch.testing.assert_close(step(), with_sdpa(step), atol=1e-5, rtol=1e-5)


def test_no_block_of_folded_query_rows_is_left_with_fewer_than_four() -> None:
    """Plain decoding with 3 query heads per key/value head folds into 3 rows, an 11-token verify
    into 33 (a last block of one): both are padded so that every block of PyTorch's CPU flash
    attention has 4 rows at least, the path every wider block takes."""
    assert block_padding(3) == 1 and block_padding(1) == 3
    assert block_padding(33) == 3 and block_padding(66) == 2  # blocks of 32: 1 and 2 left over
    assert block_padding(321) == 3  # blocks of 64 from 192 rows
    assert [block_padding(rows) for rows in (4, 9, 32, 36, 191, 192)] == [0] * 6
    for rows in range(1, 2000):
        padded = rows + block_padding(rows)
        split = 256 if padded >= 768 else 64 if padded >= 192 else 32
        assert not 0 < padded % split < MIN_BLOCK_ROWS and padded - rows < MIN_BLOCK_ROWS


def test_padded_rows_leave_every_query_row_unchanged() -> None:
    """The padding rows are dropped again: each row's output is the one unpadded attention gives."""
    torch.manual_seed(0)
    query, key, value = torch.randn(2, 6, 1, 16), torch.randn(2, 2, 40, 16), torch.randn(2, 2, 40, 16)
    mask = torch.zeros(2, 1, 1, 40)
    mask[0, ..., 30:] = float("-inf")
    want = torch.nn.functional.scaled_dot_product_attention(query, key.repeat_interleave(3, 1), value.repeat_interleave(3, 1), attn_mask=mask)
    torch.testing.assert_close(grouped_query_attention(query, key, value, mask), want, atol=1e-6, rtol=1e-5)
