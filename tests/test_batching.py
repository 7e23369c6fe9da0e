"""Batched decoding: per-request stops, parameters and lengths, joining and leaving, and the
batch-size controls of dynamic speculation."""

import pytest

from specdec import LLM, SamplingParams, UserProvidedDecodingConfig
from specdec.errors import ConfigError
from specdec.kv_cache import BatchKVCache


class RecordingDrafter:
    """Drafts the request's last two tokens (often right on repetitive text) and records, per
    call, the batch size and the budget the engine gave each request."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, list[int]]] = []

    def prepare_draft_tokens(self, requests, resource_manager):
        self.calls.append((len(requests), [r.max_draft_len for r in requests]))
        return [(r.token_ids[-2:] * 4)[: r.max_draft_len] for r in requests]


@pytest.fixture(scope="module")
def prompts(tiny):
    texts = ["the cat sat on the mat. the cat", "hello world, hello", "abc abd abe ab", "one two three, one two", "zz yy zz"]
    return [tiny.encode(t) for t in texts]


def _alone(tiny, ids, params):
    return LLM(tiny.model, None, tokenizer=tiny.tokenizer).generate({"prompt_token_ids": ids}, params)[0]


def test_each_request_keeps_its_own_stops_and_limits(tiny, prompts):
    """One batch mixing max_tokens, stop token ids, stop strings and ignore_eos: every request ends
    exactly where it ends when decoded alone, with the same finish reason and text."""
    free = [_alone(tiny, ids, SamplingParams(max_tokens=30, ignore_eos=True)).token_ids for ids in prompts]
    params = [
        SamplingParams(max_tokens=7),
        SamplingParams(max_tokens=30, stop_token_ids=[free[1][5]], ignore_eos=True),
        SamplingParams(max_tokens=30, stop=[tiny.tokenizer.decode(free[2][3:5])], ignore_eos=True),
        SamplingParams(max_tokens=30, ignore_eos=True),
        SamplingParams(max_tokens=1),
    ]
    config = UserProvidedDecodingConfig(drafter=RecordingDrafter(), max_draft_len=4, adaptive_draft_len=False)
    with LLM(tiny.model, config, tokenizer=tiny.tokenizer) as llm:
        batched = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params)
    for ids, p, got in zip(prompts, params, batched):
        expected = _alone(tiny, ids, p)
        assert (got.token_ids, got.finish_reason, got.text) == (expected.token_ids, expected.finish_reason, expected.text)
    assert [o.finish_reason for o in batched] == ["length", "stop", "stop", "length", "length"]


def test_waiting_requests_join_as_running_ones_finish(tiny, prompts):
    """With room for two, five prompts run two at a time: the batch never exceeds two, shrinks to
    one at the end, and every output is the prompt's own plain output."""
    drafter = RecordingDrafter()
    params = [SamplingParams(max_tokens=6 + 4 * i, ignore_eos=True) for i in range(len(prompts))]
    config = UserProvidedDecodingConfig(drafter=drafter, max_draft_len=3, adaptive_draft_len=False)
    with LLM(tiny.model, config, tokenizer=tiny.tokenizer, max_batch_size=2) as llm:
        outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params)
    sizes = [size for size, _ in drafter.calls]
    assert max(sizes) == 2 and sizes[-1] == 1
    assert [o.token_ids for o in outputs] == [_alone(tiny, ids, p).token_ids for ids, p in zip(prompts, params)]
    assert sum(o.metrics.num_accepted_tokens for o in outputs) > 0


def test_a_joining_request_takes_a_finished_rows_place(tiny, prompts, monkeypatch):
    """Five prompts through a batch of two: the first two join in one append, each later one
    takes the row of a request that finished (the rest of the cache is not copied), and rows are
    dropped only once nothing waits. Outputs are each prompt's own plain output."""
    calls = []
    for name in ("append_rows", "select_rows", "replace_row"):
        method = getattr(BatchKVCache, name)
        monkeypatch.setattr(BatchKVCache, name, lambda self, *a, _m=method, _n=name: calls.append(_n) or _m(self, *a))
    params = [SamplingParams(max_tokens=6 + 4 * i, ignore_eos=True) for i in range(len(prompts))]
    with LLM(tiny.model, None, tokenizer=tiny.tokenizer, max_batch_size=2) as llm:
        outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params)
    assert calls == ["append_rows", "replace_row", "replace_row", "replace_row", "select_rows", "select_rows"]
    monkeypatch.undo()
    assert [o.token_ids for o in outputs] == [_alone(tiny, ids, p).token_ids for ids, p in zip(prompts, params)]


def test_max_concurrency_decodes_plainly_above_the_limit(tiny, prompts):
    """Above max_concurrency the drafter is not even called; once the batch shrinks to the limit,
    drafting resumes. Outputs are unchanged."""
    drafter = RecordingDrafter()
    params = [SamplingParams(max_tokens=4, ignore_eos=True)] * 2 + [SamplingParams(max_tokens=20, ignore_eos=True)]
    config = UserProvidedDecodingConfig(drafter=drafter, max_draft_len=3, adaptive_draft_len=False, disable_by_batch_size=1)
    with LLM(tiny.model, config, tokenizer=tiny.tokenizer) as llm:
        outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts[:3]], params)
        assert outputs[0].metrics.num_drafts == 0 and outputs[2].metrics.num_drafts > 0
    assert drafter.calls and all(size == 1 for size, _ in drafter.calls)
    assert [o.token_ids for o in outputs] == [_alone(tiny, ids, p).token_ids for ids, p in zip(prompts, params)]


def test_draft_len_schedule_sets_the_budget_by_batch_size(tiny, prompts):
    """{1: 4, 3: 2}: batches of 2-3 draft at most 2 tokens per request, a lone request 4, and a
    batch of 4 or more none."""
    drafter = RecordingDrafter()
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (3, 8, 13, 18, 60)]
    config = UserProvidedDecodingConfig(
        drafter=drafter, max_draft_len=4, adaptive_draft_len=False, draft_len_schedule={1: 4, 3: 2}
    )
    with LLM(tiny.model, config, tokenizer=tiny.tokenizer) as llm:
        llm.generate([{"prompt_token_ids": ids} for ids in prompts], params)
    budgets = {size: max(max(b) for s, b in drafter.calls if s == size) for size, _ in drafter.calls}
    assert budgets == {3: 2, 2: 2, 1: 4}


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"method": "ngram", "draft_len_schedule": {4: 4}, "max_concurrency": 2}, "mutually exclusive"),
        ({"method": "ngram", "max_draft_len": 2, "draft_len_schedule": {4: 3}}, "draft_len_schedule"),
        ({"method": "ngram", "disable_by_batch_size": 0}, "disable_by_batch_size"),
        ({"method": "ngram", "adaptive_window": 0}, "adaptive_window"),
    ],
)
def test_bad_dynamic_controls_name_the_field(tiny, config, message):
    with pytest.raises(ConfigError, match=message):
        LLM(tiny.model, config, tokenizer=tiny.tokenizer)


def test_sampling_params_per_prompt_must_match_the_prompts(tiny, prompts):
    with LLM(tiny.model, None, tokenizer=tiny.tokenizer) as llm, pytest.raises(ConfigError, match="sampling_params"):
        llm.generate([{"prompt_token_ids": ids} for ids in prompts], [SamplingParams()] * 2)


def test_max_batch_size_must_be_positive(tiny):
    with pytest.raises(ConfigError, match="max_batch_size"):
        LLM(tiny.model, None, tokenizer=tiny.tokenizer, max_batch_size=0)
