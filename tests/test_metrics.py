"""Metrics formatting shared by `generate --compare` and `bench`."""

from specdec.metrics import format_rates_per_pos


def test_rates_per_pos_keep_zeros_and_mark_a_later_accepting_position() -> None:
    """A chain position that never accepted stays visible; ``..`` marks accepted positions past
    the shown ones, and a tree's all-zero tail past its depth is dropped."""
    assert format_rates_per_pos([]) == "-"
    assert format_rates_per_pos([0.5, 0.0, 0.0]) == "0.50 0.00 0.00"
    assert format_rates_per_pos([0.9, 0.5, 0.2, 0.1, 0.05, 0.01]) == "0.90 0.50 0.20 0.10 0.05 .."
    assert format_rates_per_pos([0.9, 0.5, 0.2, 0.1, 0.05, 0.0, 0.0]) == "0.90 0.50 0.20 0.10 0.05"
