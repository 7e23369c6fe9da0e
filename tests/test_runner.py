"""The model runner's extension points for tree methods and hidden-state methods."""

import warnings

import torch

from specdec.runner import ModelRunner, tree_attention


def test_tree_forward_equals_chain_forward_along_every_path(tiny):
    """One forward over a flattened draft tree gives each node the logits of its own chain."""
    runner = ModelRunner(tiny.model)
    prompt = list(range(3, 20))
    # Root 5 with children 6 and 7; 8 is a child of 6; 9 a child of 7.
    tokens, parents = [5, 6, 7, 8, 9], [-1, 0, 0, 1, 2]
    cache = runner.new_cache()
    runner.forward(cache, prompt)
    position_ids, mask = tree_attention(parents, runner.cache_length(cache))
    tree_logits = runner.forward(cache, tokens, position_ids=position_ids, attention_mask=mask).logits
    for path in ([0, 1, 3], [0, 2, 4]):
        chain = runner.new_cache()
        runner.forward(chain, prompt)
        expected = runner.forward(chain, [tokens[i] for i in path]).logits
        torch.testing.assert_close(tree_logits[path], expected, atol=1e-5, rtol=1e-5)


def test_tree_attention_layout():
    """Positions follow depth; each node sees the cache, its ancestors and itself, nothing else."""
    position_ids, mask = tree_attention([-1, 0, 0, 1], cache_length=3)
    assert position_ids.tolist() == [[3, 4, 4, 5]]
    visible = (mask[0, 0] == 0).int().tolist()
    assert visible == [
        [1, 1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0, 1, 0],
        [1, 1, 1, 1, 1, 0, 1],
    ]


def test_batched_tree_rows_equal_chains_and_compact_to_the_accepted_path(tiny):
    """A batch mixing a tree row and a chain row: every tree node gets its own path's logits;
    after moving an accepted path's entries together, the next forward equals one over a cache
    that only ever saw that path."""
    runner = ModelRunner(tiny.model)
    prompts = [list(range(3, 20)), list(range(8, 30))]
    # Row 0: root 4, children 5 and 6, 7 under 5, 8 under 6. Row 1: a chain.
    tree, tree_parents = [4, 5, 6, 7, 8], [-1, 0, 0, 1, 2]
    chain = [9, 10, 11]
    batch = runner.new_cache(rows=0)
    for prompt in prompts:
        single = runner.new_cache()
        runner.forward(single, prompt)
        batch.append_rows(single)
    outputs = runner.forward_rows(batch, [tree, chain], parents=[tree_parents, None])

    def alone(prompt, tokens):
        cache = runner.new_cache()
        runner.forward(cache, prompt)
        return cache, runner.forward(cache, tokens).logits

    for path in ([0, 1, 3], [0, 2, 4]):
        _, expected = alone(prompts[0], [tree[i] for i in path])
        torch.testing.assert_close(outputs[0].logits[path], expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outputs[1].logits, alone(prompts[1], chain)[1], atol=1e-5, rtol=1e-5)

    # Accept root -> 6 -> 8 (row-local 0, 2, 4): move them to follow the prompt directly.
    start = len(prompts[0])
    batch.move_entries(0, [start + 2, start + 4], start + 1)
    runner.rollback_rows(batch, [2, 0])
    assert batch.lengths == [start + 3, len(prompts[1]) + 3]
    after = runner.forward_rows(batch, [[12], [13]])
    path_cache, _ = alone(prompts[0], [4, 6, 8])
    torch.testing.assert_close(after[0].logits, runner.forward(path_cache, [12]).logits, atol=1e-5, rtol=1e-5)


def test_forwards_pass_the_cache_under_the_name_the_installed_transformers_takes(tiny):
    """No deprecation warning from the model for the cache keyword, single or batched.

    transformers 5.24 warns on ``past_key_values`` (removed in 5.40): a runner still passing it
    fails here, and would break when that release lands."""
    runner = ModelRunner(tiny.model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cache = runner.new_cache()
        runner.forward(cache, list(range(3, 12)))
        runner.forward(cache, [4, 5])
        batch = runner.new_cache(rows=0)
        batch.append_rows(cache)
        runner.forward_rows(batch, [[6, 7]])
