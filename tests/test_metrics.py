"""Metrics counting and the formatting shared by `generate --compare` and `bench`."""

from specdec.metrics import RequestMetrics, format_rates_per_pos


def test_rates_per_pos_keep_zeros_and_mark_a_later_accepting_position() -> None:
    """A chain position that never accepted stays visible; ``..`` marks accepted positions past
    the shown ones, and an all-zero tail is dropped."""
    assert format_rates_per_pos([]) == "-"
    assert format_rates_per_pos([0.5, 0.0, 0.0]) == "0.50 0.00 0.00"
    assert format_rates_per_pos([0.9, 0.5, 0.2, 0.1, 0.05, 0.01]) == "0.90 0.50 0.20 0.10 0.05 .."
    assert format_rates_per_pos([0.9, 0.5, 0.2, 0.1, 0.05, 0.0, 0.0]) == "0.90 0.50 0.20 0.10 0.05"


def test_per_position_counts_have_one_entry_per_depth() -> None:
    """A chain counts one position per draft token; a tree one per level of its deepest path, not
    per node, so a 12-node tree of depth 3 reports 3 positions; steps without a draft count as
    steps only."""
    chain = RequestMetrics()
    chain.record_step(4, 2, depth=4)
    chain.record_step(0, 0, depth=0)
    assert chain.num_accepted_tokens_per_pos == [1, 1, 0, 0]
    assert (chain.num_steps, chain.num_drafts, chain.acceptance_rate_per_pos) == (2, 1, [1.0, 1.0, 0.0, 0.0])
    tree = RequestMetrics()
    tree.record_step(12, 3, depth=3)
    tree.record_step(12, 1, depth=2)
    assert tree.num_accepted_tokens_per_pos == [2, 1, 1]
    assert tree.acceptance_rate_per_pos == [1.0, 0.5, 0.5]
