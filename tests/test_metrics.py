"""Metrics counting and the formatting shared by `generate --compare` and `bench`."""

from specdec.bench.report import summary_table
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


def test_lossy_accepted_tokens_are_counted_within_the_accepted_and_summed() -> None:
    """Tokens kept by a rule that is not lossless count among the accepted ones and apart from
    them; merging and ``to_dict`` carry the count, and a lossless step adds none."""
    first = RequestMetrics()
    first.record_step(3, 2, depth=3, num_lossy_accepted=1)
    first.record_step(3, 3, depth=3)
    second = RequestMetrics()
    second.record_step(3, 1, depth=3, num_lossy_accepted=1)
    assert (first.num_accepted_tokens, first.num_lossy_accepted_tokens) == (5, 1)
    first.merge(second)
    assert (first.num_accepted_tokens, first.num_lossy_accepted_tokens) == (6, 2)
    assert first.to_dict()["num_lossy_accepted_tokens"] == 2


def test_bench_table_shows_lossy_acceptances_only_when_there_are_some() -> None:
    row = {"num_turns": 1, "speedup": 1.5, "speedup_ci95": None, "tokens_per_second": 10.0, "mean_accepted_tokens": 2.0,
           "acceptance_rate": 0.5, "num_lossy_accepted_tokens": 0, "acceptance_rate_per_pos": [0.5],
           "outputs_match": None, "overhead_fraction": 0.1}

    def headers(lossy: int) -> list[str]:
        return [str(c.header) for c in summary_table({"overall": {**row, "num_lossy_accepted_tokens": lossy}}, "t").columns]

    assert "lossy acc." not in headers(0)
    assert "lossy acc." in headers(3)


def test_bench_table_shows_prefill_and_cached_tokens_only_when_the_prefix_cache_gave_some() -> None:
    row = {"num_turns": 1, "speedup": 1.5, "speedup_ci95": None, "tokens_per_second": 10.0, "mean_accepted_tokens": 2.0,
           "acceptance_rate": 0.5, "num_lossy_accepted_tokens": 0, "acceptance_rate_per_pos": [0.5],
           "outputs_match": None, "overhead_fraction": 0.1, "prefill_seconds": 0.52, "cached_prompt_tokens": 0.0}

    def table(cached: float) -> tuple[list[str], list[str]]:
        made = summary_table({"overall": {**row, "cached_prompt_tokens": cached}}, "t")
        return [str(c.header) for c in made.columns], [str(cell) for c in made.columns for cell in c._cells]

    assert "cached" not in table(0.0)[0]
    headers, cells = table(384.0)
    assert headers[-2:] == ["prefill", "cached"] and cells[-2:] == ["0.52 s", "384"]
