"""The model runner's extension points for tree methods and hidden-state methods."""

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
