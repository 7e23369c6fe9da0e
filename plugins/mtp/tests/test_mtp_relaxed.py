"""MTP's relaxed acceptance inside thinking spans (TensorRT-LLM's definition), which is not lossless.

The verify function is checked on hand-made logits: inside a span a near-miss draft (the
target's second token, within ``relaxed_delta`` of the first) is kept and counted as
lossy-accepted, outside it is not, and a draft that closes the span is the last one relaxed.
An engine run with the tiny DeepSeek-V3 target, whose tokenizer has ``<think>`` and ``</think>``,
then checks the same end to end: outside a span the output is plain greedy decoding's.
"""

from __future__ import annotations

import json
import logging

import pytest
import torch
from mtp_tiny import load_target
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from specdec import LLM, ConfigError, DraftProposal, Request, SamplingParams, VerifyResult
from specdec.testing.conformance import fixed_draft_len
from specdec.testing.tiny import tiny_tokenizer
from specdec_mtp.relaxed import ThinkingSpan, relaxed_verify, thinking_tokens

VOCAB = 8
BEGIN, END = 6, 7
GREEDY = SamplingParams(temperature=0.0)


def rows(*tops: tuple[int, int]) -> torch.Tensor:
    """Logits ``[len(tops), VOCAB]``: in each row ``first`` leads with 2.0, ``second`` trails it by 0.5
    (a log-probability gap of 0.5 at temperature 1), every other token at -5."""
    logits = torch.full((len(tops), VOCAB), -5.0)
    for row, (first, second) in enumerate(tops):
        logits[row, first], logits[row, second] = 2.0, 1.5
    return logits


def verify(token_ids: list[int], drafts: list[int], logits: torch.Tensor, topk: int = 2, delta: float = 0.6,
           params: SamplingParams = GREEDY) -> VerifyResult:
    request = Request(0, token_ids, 1, params)
    return relaxed_verify([request], [DraftProposal(drafts)], [logits], [ThinkingSpan(BEGIN, END)], topk, delta)[0]


def test_near_miss_is_kept_inside_a_span_and_counted_as_lossy() -> None:
    """Draft 0 is the target's second token (gap 0.5 <= delta 0.6): kept, lossy; draft 1 is the
    argmax after it: kept by the exact rule; the next token is the argmax after both."""
    logits = rows((1, 2), (3, 4), (5, 0))
    assert verify([0, BEGIN, 4], [2, 3], logits) == VerifyResult(2, 5, num_lossy_accepted=1)


@pytest.mark.parametrize(
    ("token_ids", "topk", "delta"),
    [([0, 4], 2, 0.6), ([0, BEGIN, 4, END, 4], 2, 0.6), ([0, BEGIN, 4], 1, 0.6), ([0, BEGIN, 4], 2, 0.4)],
    ids=["no-span", "span-closed", "not-in-topk", "gap-over-delta"],
)
def test_near_miss_is_rejected_outside_a_span_or_the_bounds(token_ids: list[int], topk: int, delta: float) -> None:
    """Outside a span, or when the draft is not among the top ``topk`` or trails by more than
    ``delta``, verification is the exact one: the draft goes and the argmax follows."""
    assert verify(token_ids, [2, 3], rows((1, 2), (3, 4), (5, 0)), topk, delta) == VerifyResult(0, 1)


def test_a_draft_closing_the_span_is_relaxed_and_the_next_one_is_not() -> None:
    """The end token drafted as a near miss is still inside the span; the near miss after it is not."""
    logits = rows((1, END), (3, 4), (5, 0))
    assert verify([0, BEGIN], [END, 4], logits) == VerifyResult(1, 3, num_lossy_accepted=1)


def test_a_span_opened_by_a_draft_relaxes_the_drafts_after_it() -> None:
    logits = rows((BEGIN, 0), (1, 2), (5, 0))
    assert verify([0, 4], [BEGIN, 2], logits) == VerifyResult(2, 5, num_lossy_accepted=1)


def test_sampled_requests_keep_near_misses_inside_and_follow_the_core_outside() -> None:
    """At temperature 1 the core's rejection sampling keeps the near miss (p about 0.38) only
    sometimes; inside a span it is always kept, lossy exactly when the core would have rejected it.
    A token the request's own top-k excludes is never kept, however wide the bounds."""
    torch.manual_seed(0)
    sampled = SamplingParams(temperature=1.0)
    logits = rows((1, 2), (3, 4))
    inside = [verify([0, BEGIN], [2], logits, params=sampled) for _ in range(200)]
    assert all(r.num_accepted == 1 for r in inside)
    assert 0 < sum(r.num_lossy_accepted for r in inside) < 200
    outside = [verify([0], [2], logits, params=sampled) for _ in range(200)]
    assert {r.num_accepted for r in outside} == {0, 1} and not any(r.num_lossy_accepted for r in outside)
    top1 = SamplingParams(temperature=1.0, top_k=1)
    assert verify([0, BEGIN], [2], logits, topk=VOCAB, delta=1e9, params=top1) == VerifyResult(0, 1)


def test_span_tracking_reads_only_new_tokens() -> None:
    span = ThinkingSpan(BEGIN, END)
    tokens = [0, BEGIN, 3]
    assert span.after(tokens)
    tokens += [4, END]
    assert not span.after(tokens) and span.scanned == 5
    tokens += [BEGIN]
    assert span.after(tokens)


def test_thinking_tokens_default_to_the_tokenizers_and_errors_name_the_field() -> None:
    tokenizer = tiny_tokenizer()
    with pytest.raises(ConfigError, match="begin_thinking_phase_token: .* no <think>"):
        thinking_tokens(None, None, tokenizer, len(tokenizer))
    assert thinking_tokens(4, 5, tokenizer, len(tokenizer)) == (4, 5)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    size = len(tokenizer)
    assert thinking_tokens(None, None, tokenizer, size) == (size - 2, size - 1)
    with pytest.raises(ConfigError, match="end_thinking_phase_token: token id 99 is outside"):
        thinking_tokens(None, 99, tokenizer, size)


def thinking_tokenizer() -> tuple[PreTrainedTokenizerFast, int, int]:
    """The tiny tokenizer with ``!`` and ``?`` renamed ``<think>`` and ``</think>`` (the model's
    vocabulary stays the same); returns it and the two ids."""
    tiny = tiny_tokenizer()
    state = json.loads(tiny.backend_tokenizer.to_str())
    vocab = state["model"]["vocab"]
    vocab["<think>"], vocab["</think>"] = vocab.pop("!"), vocab.pop("?")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(state)), pad_token="<pad>", bos_token="<s>", eos_token="</s>"
    )
    return tokenizer, vocab["<think>"], vocab["</think>"]


def test_engine_relaxes_only_inside_thinking_spans(caplog: pytest.LogCaptureFixture) -> None:
    """With every draft inside a span passing the relaxed test, prompts that open a span keep all
    their drafts, some the target would not have picked (counted as lossy), while prompts with no
    span or a closed one give plain greedy decoding's output and count none."""
    target = load_target(1, "cpu")
    tokenizer, begin, end = thinking_tokenizer()
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    plain_prompts = [[5, 9, 13, 22, 5, 9], [7, 8, begin, 11, end, 12]]
    thinking_prompts = [[7, 8, begin, 11, 12], [begin, 20, 3, 4]]
    prompts = [{"prompt_token_ids": p} for p in [*plain_prompts, *thinking_prompts]]
    with LLM(target.model, tokenizer=tokenizer) as plain:
        expected = [o.token_ids for o in plain.generate(prompts[:2], params)]
    assert not any(begin in out for out in expected), "the plain outputs open a span: pick other prompts"
    config = {"decoding_type": "MTP", "max_draft_len": 3, "use_relaxed_acceptance_for_thinking": True,
              "relaxed_topk": 1000, "relaxed_delta": 1e9}
    caplog.set_level(logging.WARNING, logger="specdec_mtp")
    with LLM(target.model, fixed_draft_len(config), tokenizer=tokenizer) as llm:
        assert "NOT the target's" in caplog.text
        outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs[:2]] == expected
    assert [o.metrics.num_lossy_accepted_tokens for o in outs[:2]] == [0, 0]
    assert all(o.metrics.num_accepted_tokens > 0 for o in outs[:2])
    for out in outs[2:]:
        assert end not in out.token_ids, "an output closes its span: pick other prompts"
        assert out.metrics.num_accepted_tokens == out.metrics.num_draft_tokens
    assert 0 < sum(o.metrics.num_lossy_accepted_tokens for o in outs[2:])
