"""Plain decoding's log-probabilities are the target's raw distribution: each output token's
log-probability and the likeliest tokens at its position equal a transformers forward over the
prompt and the output so far (fp32), for greedy and sampled requests; a stop ends them with the
tokens; none are computed unless asked for. (Every method's equal plain decoding's: the
conformance suite.)"""

from __future__ import annotations

import pytest
import torch

from specdec import LLM, SamplingParams
from specdec.testing import make_tiny_target


@pytest.fixture(scope="module")
def tiny():
    target = make_tiny_target(seed=0)
    with LLM(target.model, None, tokenizer=target.tokenizer) as llm:
        yield target, llm


@pytest.mark.parametrize("params", [SamplingParams(max_tokens=10, logprobs=4, ignore_eos=True),
                                    SamplingParams(max_tokens=10, logprobs=2, temperature=0.8, seed=3, ignore_eos=True)])
def test_logprobs_are_the_targets_raw_distribution(tiny, params: SamplingParams) -> None:
    target, llm = tiny
    prompt = target.encode("the cat sat on the mat")
    out = llm.generate({"prompt_token_ids": prompt}, params)[0]
    assert len(out.logprobs) == len(out.token_ids) == 10
    with torch.no_grad():
        logits = target.model(torch.tensor([prompt + out.token_ids])).logits[0].float()
    expected = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    for row, (token, lp) in enumerate(zip(out.token_ids, out.logprobs)):
        assert lp.token_id == token
        assert lp.logprob == pytest.approx(float(expected[row, token]), abs=1e-4)
        values, ids = expected[row].topk(params.logprobs)
        assert [t for t, _ in lp.top] == ids.tolist()
        assert [v for _, v in lp.top] == pytest.approx(values.tolist(), abs=1e-4)
    if params.greedy:
        assert all(lp.top[0][0] == lp.token_id for lp in out.logprobs)


def test_a_stop_ends_the_logprobs_with_the_tokens_and_none_unless_asked(tiny) -> None:
    target, llm = tiny
    prompt = target.encode("hello world")
    free = llm.generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=12))[0]
    assert free.logprobs is None
    stop = free.token_ids[5]
    cut = free.token_ids.index(stop) + 1
    out = llm.generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=12, stop_token_ids=[stop], logprobs=0))[0]
    assert out.token_ids == free.token_ids[:cut]
    assert [lp.token_id for lp in out.logprobs] == out.token_ids and all(lp.top == [] for lp in out.logprobs)


def test_logprobs_are_bounded() -> None:
    with pytest.raises(ValueError, match="logprobs"):
        SamplingParams(logprobs=21)
