"""vLLM's reasoning parsers: a reply's ``<think>`` reasoning apart from its content, the same
whether the reply comes whole or streamed in pieces of any size."""

from __future__ import annotations

import pytest

from specdec.errors import ConfigError
from specdec.reasoning import ReasoningParser, ReasoningStream

CASES = [
    # (parser, reply, reasoning, content)
    ("deepseek_r1", "<think>a < b</think>\n\nSo b.", "a < b", "\n\nSo b."),
    ("deepseek_r1", "a < b</think>So b.", "a < b", "So b."),  # the template opened <think>
    ("deepseek_r1", "still thinking </thi", "still thinking </thi", ""),  # cut off mid-thought
    ("deepseek_r1", "</think>x", "", "x"),
    ("qwen3", "<think>\nhmm\n</think>\n\nYes.", "\nhmm\n", "\n\nYes."),
    ("qwen3", "Yes, <think> is a tag.", None, "Yes, <think> is a tag."),  # thinking off
    ("qwen3", "<thin", None, "<thin"),
    ("qwen3", "<think>never closed", "never closed", ""),
    ("qwen3", "", None, ""),
]


@pytest.mark.parametrize(("name", "reply", "reasoning", "content"), CASES)
def test_a_reply_splits_the_same_whole_and_streamed(name: str, reply: str, reasoning: str | None, content: str) -> None:
    parser = ReasoningParser(name)
    assert parser.split(reply) == (reasoning, content)
    for size in range(1, len(reply) + 1):
        stream, got_reasoning, got_content = ReasoningStream(parser), "", ""
        for start in range(0, len(reply), size):
            more_reasoning, more_content = stream.feed(reply[start : start + size])
            got_reasoning, got_content = got_reasoning + more_reasoning, got_content + more_content
        rest_reasoning, rest_content = stream.finish()
        assert (got_reasoning + rest_reasoning, got_content + rest_content) == (reasoning or "", content), size
        assert stream.reasoned == (reasoning is not None)


def test_reasoning_is_never_held_back_past_a_possible_tag() -> None:
    """Streamed reasoning reaches the client as it comes, but for the characters that may begin
    ``</think>``."""
    stream = ReasoningStream(ReasoningParser("deepseek_r1"))
    assert stream.feed("step one, step two <") == ("step one, step two ", "")
    assert stream.feed("/think>done") == ("", "done")


def test_an_unknown_parser_names_the_field() -> None:
    with pytest.raises(ConfigError, match="reasoning_parser: 'granite'"):
        ReasoningParser("granite")
