"""The request-level engine API: requests added while others run, per-step deltas, abort, the
bounded queue, failures kept to their request, and cost measurement outside requests."""

from __future__ import annotations

import pytest
from specdec_ngram import NGramDecodingConfig

from specdec import LLM, PluginError, SamplingParams, UserProvidedDecodingConfig
from specdec.detokenize import IncrementalDetokenizer
from specdec.draft_policy import CostMeasurement
from specdec.errors import QueueFullError, RequestFailedError
from specdec.resources import ResourceManager

TEXTS = ("hello world, hello", "abc abd abe ab", "one two three, one two", "the cat sat on the mat. the cat")


@pytest.fixture(scope="module")
def prompts(tiny):
    return [tiny.encode(t) for t in TEXTS]


@pytest.fixture(scope="module")
def alone(tiny, prompts):
    """Each prompt's plain greedy output (24 tokens, EOS ignored), decoded alone."""
    plain = LLM(tiny.model, None, tokenizer=tiny.tokenizer)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    return [plain.generate({"prompt_token_ids": p}, params)[0] for p in prompts]


def _run(engine, steps: int | None = None, deltas: dict[int, list] | None = None) -> dict[int, list]:
    """Step ``engine`` ``steps`` times, or until it is idle; every delta, by request id, added to ``deltas``."""
    deltas = {} if deltas is None else deltas
    for _ in range(steps or 500):
        if steps is None and not engine.has_unfinished_requests():
            return deltas
        for delta in engine.step():
            deltas.setdefault(delta.request_id, []).append(delta)
    if steps is None:
        raise AssertionError("the engine did not finish")
    return deltas


def test_requests_join_a_running_batch_and_decode_as_alone(tiny, prompts, alone):
    """A request added after others have run for a few steps joins the batch; every greedy output
    (fp32, n-gram drafts) equals the prompt decoded alone, and the deltas of a request add up to its
    output: tokens, text, and one final delta with the finish reason."""
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    with LLM(tiny.model, NGramDecodingConfig(max_draft_len=4), tokenizer=tiny.tokenizer, max_batch_size=3) as llm:
        engine = llm.engine
        first = [engine.add_request(p, params) for p in prompts[:2]]
        deltas = _run(engine, steps=3)
        assert engine.num_running == 2 and not engine.num_waiting
        late = [engine.add_request(p, params) for p in prompts[2:]]
        assert engine.num_waiting == 2
        _run(engine, deltas=deltas)
    for rid, expected in zip(first + late, alone):
        got = deltas[rid]
        assert sum((d.new_token_ids for d in got), []) == expected.token_ids
        assert "".join(d.text_delta for d in got) == expected.text
        assert [d.finished for d in got] == [False] * (len(got) - 1) + [True]
        assert got[-1].finish_reason == "length" and got[-1].metrics.num_output_tokens == 24
    assert not engine.running and engine._cache.num_rows == 0  # finished rows are freed once idle


def test_text_deltas_hold_back_a_possible_stop_string(tiny, prompts, alone):
    """With a stop string, no delta ever carries it or text past it: text that could begin it
    waits until it cannot, and the request ends with the text cut before it."""
    full = alone[0].text
    at = next(i for i in range(5, len(full) - 3) if full.find(full[i : i + 3]) == i)
    stop = full[at : at + 3]
    with LLM(tiny.model, None, tokenizer=tiny.tokenizer) as llm:
        llm.engine.add_request(prompts[0], SamplingParams(max_tokens=24, ignore_eos=True, stop=[stop]))
        (deltas,) = _run(llm.engine).values()
    sent = ""
    for delta in deltas:
        sent += delta.text_delta
        assert stop not in sent and full.startswith(sent)
    assert sent == full[:at] and deltas[-1].finish_reason == "stop"


def test_a_stop_string_stays_in_the_text_with_include_stop_str_in_output(tiny, prompts, alone):
    """vLLM's include_stop_str_in_output: the text ends with the stop string that ended it, in the
    deltas and in the final output, and never runs past it."""
    full = alone[0].text
    at = next(i for i in range(5, len(full) - 3) if full.find(full[i : i + 3]) == i)
    stop = full[at : at + 3]
    params = SamplingParams(max_tokens=24, ignore_eos=True, stop=[stop], include_stop_str_in_output=True)
    with LLM(tiny.model, None, tokenizer=tiny.tokenizer) as llm:
        llm.engine.add_request(prompts[0], params)
        (deltas,) = _run(llm.engine).values()
        output = llm.generate({"prompt_token_ids": prompts[0]}, params)[0]
    sent = "".join(delta.text_delta for delta in deltas)
    assert sent == output.text == full[: at + 3] and deltas[-1].finish_reason == "stop"


class _Tracking(ResourceManager):
    def __init__(self) -> None:
        super().__init__()
        self.live: set[int] = set()

    def add_request(self, request):
        self.live.add(request.request_id)

    def free_request(self, request):
        self.live.discard(request.request_id)


class _Repeat:
    def prepare_draft_tokens(self, requests, resource_manager):
        return [r.token_ids[-1:] * r.max_draft_len for r in requests]


def test_abort_frees_the_row_and_drafter_state_at_once(tiny, prompts, alone):
    """Aborting a running request drops its cache row and frees its method state in the same
    call; aborting a waiting one removes it from the queue; the others decode as if alone."""
    manager = _Tracking()
    config = UserProvidedDecodingConfig(drafter=_Repeat(), resource_manager=manager, max_draft_len=3)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    with LLM(tiny.model, config, tokenizer=tiny.tokenizer, max_batch_size=2) as llm:
        engine = llm.engine
        ids = [engine.add_request(p, params) for p in prompts[:3]]
        deltas = _run(engine, steps=2)
        assert engine._cache.num_rows == 2 and manager.live == set(ids[:2])
        delta = engine.abort(ids[0])
        assert delta.finished and delta.finish_reason == "abort" and delta.request_id == ids[0]
        assert engine._cache.num_rows == 1 and manager.live == {ids[1]}
        assert engine.abort(ids[0]) is None  # already gone
        waiting = engine.add_request(prompts[3], params)
        assert engine.abort(waiting).finish_reason == "abort" and engine.num_waiting == 1
        _run(engine, deltas=deltas)
    assert waiting not in deltas
    for rid, expected in ((ids[1], alone[1]), (ids[2], alone[2])):
        assert sum((d.new_token_ids for d in deltas[rid]), []) == expected.token_ids
    assert manager.live == set()


def test_the_queue_is_bounded(tiny, prompts):
    """``max_queue_size`` requests may wait beyond the batch's free rows; one more is refused
    with QueueFullError. ``generate`` over more prompts than that still runs them all, queueing
    as room frees."""
    params = SamplingParams(max_tokens=4)
    with LLM(tiny.model, None, tokenizer=tiny.tokenizer, max_batch_size=2, max_queue_size=1) as llm:
        for p in prompts[:3]:  # two take the free rows at the next step, one waits
            llm.engine.add_request(p, params)
        with pytest.raises(QueueFullError, match="queue is full"):
            llm.engine.add_request(prompts[3], params)
        _run(llm.engine)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        assert [len(o.token_ids) for o in outs] == [4] * len(prompts)


class _FailsFor:
    """Drafts the last token repeated; raises in ``hook`` for requests whose prompt holds ``token``."""

    def __init__(self, token: int, hook: str = "draft") -> None:
        self.token, self.hook = token, hook

    def _check(self, requests):
        if any(self.token in r.token_ids[: r.num_prompt_tokens] for r in requests):
            raise RuntimeError(f"cannot handle token {self.token}")

    def prepare_draft_tokens(self, requests, resource_manager):
        if self.hook == "draft":
            self._check(requests)
        return [r.token_ids[-1:] * r.max_draft_len for r in requests]

    def accept(self, requests, results):
        if self.hook == "accept":
            self._check(requests)


@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("hook", ["draft", "accept"])
def test_a_plugin_failure_ends_only_its_request(tiny, prompts, alone, hook, adaptive):
    """A drafter raising, in the batch, for one request of three: that request ends with
    ``finish_reason="error"`` and a message naming the method and the error; the two beside it
    decode exactly as alone (with the adaptive draft length too, whose step plan was made for
    three); ``generate`` raises a PluginError carrying every output, and the engine serves new
    requests afterwards."""
    bad = tiny.encode("#")[0]
    assert all(bad not in p for p in prompts)
    batch = [prompts[0], [*prompts[1], bad], prompts[2]]
    config = UserProvidedDecodingConfig(drafter=_FailsFor(bad, hook), max_draft_len=3, adaptive_draft_len=adaptive)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    with LLM(tiny.model, config, tokenizer=tiny.tokenizer) as llm:
        with pytest.raises(RequestFailedError, match=r"user_provided.*RuntimeError: cannot handle token.*1 of 3") as info:
            llm.generate([{"prompt_token_ids": p} for p in batch], params)
        assert isinstance(info.value, PluginError)
        outs = info.value.outputs
        assert [o.finish_reason for o in outs] == ["length", "error", "length"]
        assert "cannot handle token" in outs[1].error
        assert outs[0].token_ids == alone[0].token_ids and outs[2].token_ids == alone[2].token_ids
        assert llm.engine._cache.num_rows == 0
        again = llm.generate({"prompt_token_ids": prompts[3]}, params)[0]
        assert again.token_ids == alone[3].token_ids


def test_costs_are_measured_when_the_engine_starts_not_in_a_request(tiny, prompts, monkeypatch):
    """With the adaptive draft length on, the one-request forward costs exist once the LLM is
    built, so a request never waits for them; a batch size not measured yet borrows them and is
    measured when the engine is idle (``idle_work``), one width (at one context) per call, so a
    request arriving meanwhile waits for a few forwards only."""
    with LLM(tiny.model, NGramDecodingConfig(max_draft_len=4), tokenizer=tiny.tokenizer) as llm:
        policy = llm.engine.policy
        assert list(policy.forward_costs) == [1]

        def refuse(*args, **kwargs):
            raise AssertionError("measured inside a request")

        monkeypatch.setattr(CostMeasurement, "step", refuse)
        params = SamplingParams(max_tokens=8)
        llm.generate({"prompt_token_ids": prompts[0]}, params)
        llm.generate([{"prompt_token_ids": p} for p in prompts[:2]], params)
        assert policy.pending_measurements() == [2]
        monkeypatch.undo()
        pieces = 0
        while llm.engine.idle_work():
            pieces += 1
            assert list(policy.forward_costs) == ([1, 2] if pieces == 10 else [1])
        assert pieces == 2 * 5  # widths 1..5, next to a short and a long context


def test_a_failed_forward_ends_the_batch_and_the_engine_goes_on(tiny, prompts, alone, monkeypatch):
    """A failure no plugin can be blamed for (here the target forward raising) ends the requests
    of that step with the error, frees their rows, and the engine decodes the next request as alone."""
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    with LLM(tiny.model, None, tokenizer=tiny.tokenizer) as llm:
        engine = llm.engine
        ids = [engine.add_request(p, params) for p in prompts[:2]]
        engine.step()

        def broken(*args, **kwargs):
            raise RuntimeError("device lost")

        monkeypatch.setattr(engine.runner, "forward_rows", broken)
        deltas = {d.request_id: d for d in engine.step()}
        assert [deltas[i].finish_reason for i in ids] == ["error", "error"]
        assert "RuntimeError: device lost" in deltas[ids[0]].error
        assert not engine.has_unfinished_requests() and engine._cache.num_rows == 0
        monkeypatch.undo()
        assert llm.generate({"prompt_token_ids": prompts[2]}, params)[0].token_ids == alone[2].token_ids


class _Bytes:
    """A byte-level tokenizer: token ids are bytes, so a character may span several tokens."""

    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode("utf-8", errors="replace")


def test_text_deltas_wait_for_whole_characters_and_flush_at_the_end():
    """A character split over tokens is sent once whole; a stop string is cut even when the
    last token ends inside a character; an output ending mid-character keeps what it decodes to."""
    detok = IncrementalDetokenizer(_Bytes(), stop=[": "])
    ids = list("Answer: ".encode()) + list("\u2713".encode())[:1]
    # The stop string completes with a token that ends inside a character (" " and a lead byte).
    sent = "".join(detok.delta(ids[:n], finished=False) for n in range(1, len("Answer:") + 1))
    assert sent == "Answer"  # ":" could begin the stop string
    assert sent + detok.delta(ids, finished=True) == "Answer"
    detok = IncrementalDetokenizer(_Bytes(), stop=[])
    word = list("d\u00e9j\u00e0".encode())
    sent = [detok.delta(word[:n], finished=False) for n in range(1, len(word) + 1)]
    assert "\ufffd" not in "".join(sent) and "".join(sent) == "d\u00e9j\u00e0"
    detok = IncrementalDetokenizer(_Bytes(), stop=[])
    cut = list("ok \u2713".encode())[:-1]
    assert "".join(detok.delta(cut[:n], finished=False) for n in range(1, len(cut) + 1)) == "ok "
    assert detok.delta(cut, finished=True) == _Bytes().decode(cut)[3:]


def test_tiny_temperatures_are_greedy_and_seeds_must_fit_a_generator(tiny, prompts):
    """A temperature below 1e-5 decodes greedily (as vLLM does) instead of dividing logits into
    NaNs; a seed torch.Generator cannot take is refused naming the field."""
    with LLM(tiny.model, None, tokenizer=tiny.tokenizer) as llm:
        greedy = llm.generate({"prompt_token_ids": prompts[0]}, SamplingParams(max_tokens=8))[0]
        tiny_t = llm.generate({"prompt_token_ids": prompts[0]}, SamplingParams(max_tokens=8, temperature=1e-40))[0]
    assert tiny_t.token_ids == greedy.token_ids
    with pytest.raises(ValueError, match="seed"):
        SamplingParams(temperature=1.0, seed=2**64)


def test_requests_with_one_prompt_joining_together_share_its_prefill(tiny, prompts, watch_prefills):
    """The n choices of one prompt (or retries) joining the batch in one step are prefilled by one
    forward, and each still gets exactly what it gets alone: seeded samples, greedy tokens and
    their log-probabilities (fp32, n-gram drafts), and a choice whose first token ends it (a
    stop token) leaves the others their shared prefill."""
    same, other = prompts[0], prompts[1]
    sampled = [SamplingParams(max_tokens=16, ignore_eos=True, temperature=1.0, seed=s, logprobs=2) for s in (1, 2, 3)]
    greedy = SamplingParams(max_tokens=16, ignore_eos=True, logprobs=2)
    with LLM(tiny.model, None, tokenizer=tiny.tokenizer) as plain:
        first = plain.generate({"prompt_token_ids": same}, greedy)[0].token_ids[0]
    stopped = SamplingParams(max_tokens=16, stop_token_ids=[first])
    requests = [(same, sampled[0]), (same, stopped), (same, sampled[1]), (same, greedy), (other, greedy), (same, sampled[2])]
    with LLM(tiny.model, NGramDecodingConfig(max_draft_len=4), tokenizer=tiny.tokenizer, max_batch_size=8) as llm:
        alone = [llm.generate({"prompt_token_ids": p}, params)[0] for p, params in requests]
        forwards = watch_prefills(llm.engine.runner)
        together = llm.generate([{"prompt_token_ids": p} for p, _ in requests], [params for _, params in requests])
    assert forwards == [same, other, same]
    assert together[1].token_ids == [first] and together[1].finish_reason == "stop"
    for got, expected in zip(together, alone, strict=True):
        assert got.token_ids == expected.token_ids
        if expected.logprobs:
            assert [lp.logprob for lp in got.logprobs] == pytest.approx([lp.logprob for lp in expected.logprobs], abs=1e-5)


def test_a_failed_join_ends_the_newcomers_with_a_delta(tiny, prompts, monkeypatch):
    """If adding prefilled newcomers to the batch fails, they and the running requests end with
    the error, each reported in the step's deltas (a server waits for them), and their method
    state is freed."""
    manager = _Tracking()
    config = UserProvidedDecodingConfig(drafter=_Repeat(), resource_manager=manager, max_draft_len=3)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    with LLM(tiny.model, config, tokenizer=tiny.tokenizer, max_batch_size=4) as llm:
        engine = llm.engine
        running = engine.add_request(prompts[0], params)
        engine.step()
        newcomers = [engine.add_request(p, params) for p in prompts[1:3]]

        def broken(*caches):
            raise RuntimeError("out of memory")

        monkeypatch.setattr(engine._cache, "append_rows", broken)
        deltas = {d.request_id: d for d in engine.step()}
        assert set(deltas) == {running, *newcomers}
        assert all(d.finish_reason == "error" and "out of memory" in d.error for d in deltas.values())
        assert manager.live == set() and not engine.has_unfinished_requests()
