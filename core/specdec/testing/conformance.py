"""The conformance suite every method plugin runs.

Subclass :class:`MethodConformance` in a test module and implement ``make_config``::

    from specdec.testing.conformance import MethodConformance

    class TestMyMethod(MethodConformance):
        def make_config(self, target, tmp_path):
            return MyMethodConfig(max_draft_len=4)

pytest then runs every ``test_*`` below against the method, on a tiny random fp32 model:

- greedy output equals plain greedy output token for token, with drafts actually accepted;
- sampled output follows the target distribution (chi-square test against the exact joint
  distribution of the first tokens, with both acceptances and rejections observed), in the
  default configuration (adaptive draft length on, no seed), plain and under logits processors;
- a seeded sampled request gives plain decoding's output for its seed, alone, batched and again;
- prompts decoded as a batch (ragged acceptance, requests leaving and joining) give each
  prompt's own plain greedy output;
- a stop token inside a run of accepted drafts ends the output exactly where plain decoding does;
- under logits processors (penalties, ``logit_bias``, ``min_tokens``, ``bad_words``, a grammar),
  greedy and seeded output are plain processed decoding's, and sampled output follows the
  processed distribution;
- metrics add up; resources are released when the ``LLM`` closes;
- with suffix drafts over the method (``use_sa_spec``, on by default for a model drafter), greedy
  and seeded output stay plain decoding's. The other tests run the method's own drafts.
"""

from __future__ import annotations

import gc
import itertools
from pathlib import Path
from typing import Any

import pytest
import torch

from specdec import LLM, Request, SamplingParams, SpeculativeConfig, StructuredOutputsParams, VerifyRows
from specdec.logits_processing import LogitsProcessing
from specdec.testing.device import device_under_test
from specdec.testing.tiny import TinyTarget, make_tiny_target

#: Reject the null hypothesis "speculative sampling follows the target" below this p-value.
P_VALUE_FLOOR = 1e-3


def exact_joint_distribution(model: Any, prompt_ids: list[int], params: SamplingParams, length: int,
                             processing: LogitsProcessing | None = None) -> dict[tuple[int, ...], float]:
    """P(first ``length`` tokens) under ``model`` and ``params``, by enumerating prefixes; with
    ``processing``, the logits processors ``params`` ask for shape each prefix's logits as they
    shape plain decoding's.

    Only practical with ``top_k`` set (at most ``top_k ** length`` outcomes).
    """
    from specdec.sampling import logits_to_probs

    dist: dict[tuple[int, ...], float] = {(): 1.0}
    with torch.inference_mode():
        for _ in range(length):
            nxt: dict[tuple[int, ...], float] = {}
            for prefix, mass in dist.items():
                ids = torch.tensor([prompt_ids + list(prefix)], device=model.device)
                logits = model(ids).logits[0, -1]
                processors = processing.for_request(prompt_ids, params) if processing is not None else None
                if processors is not None:
                    processors.accept(prefix)
                    request = Request(0, prompt_ids + list(prefix), len(prompt_ids), params)
                    logits = processors.apply(logits[None], VerifyRows.of(request))[0]
                probs = logits_to_probs(logits, params)
                for tok in probs.nonzero().flatten().tolist():
                    nxt[prefix + (tok,)] = mass * float(probs[tok])
            dist = nxt
    return dist


def chi_square_p_value(observed: dict[tuple[int, ...], int], expected: dict[tuple[int, ...], float], n: int) -> float:
    """Pearson chi-square p-value; outcomes expected fewer than 5 times are pooled."""
    from scipy.stats import chisquare

    obs, exp = [], []
    pooled_obs, pooled_exp = 0, 0.0
    for outcome, prob in expected.items():
        if prob * n >= 5:
            obs.append(observed.get(outcome, 0))
            exp.append(prob * n)
        else:
            pooled_obs += observed.get(outcome, 0)
            pooled_exp += prob * n
    pooled_obs += sum(c for o, c in observed.items() if o not in expected)
    if pooled_exp > 0 or pooled_obs:
        obs.append(pooled_obs)
        exp.append(max(pooled_exp, 1e-9))
    scale = sum(obs) / sum(exp)
    return float(chisquare(obs, [e * scale for e in exp]).pvalue)


def _updated(config: SpeculativeConfig | dict[str, Any], **update: Any) -> SpeculativeConfig | dict[str, Any]:
    """``config`` (a config object or a dict) with ``update`` applied."""
    if isinstance(config, dict):
        return {**config, **update}
    return config.model_copy(update=update)


def fixed_draft_len(config: SpeculativeConfig | dict[str, Any]) -> SpeculativeConfig | dict[str, Any]:
    """``config`` with the adaptive draft length off, so every proposal is verified in full."""
    return _updated(config, adaptive_draft_len=False)


def own_drafts(config: SpeculativeConfig | dict[str, Any]) -> SpeculativeConfig | dict[str, Any]:
    """``config`` without suffix drafts over the method, unless it sets ``use_sa_spec`` itself."""
    chosen = "use_sa_spec" in (config if isinstance(config, dict) else config.model_fields_set)
    return config if chosen else _updated(config, use_sa_spec=False)


def with_suffix_drafts(config: SpeculativeConfig | dict[str, Any], threshold: int = 2) -> SpeculativeConfig | dict[str, Any]:
    """``config`` taking suffix drafts over the method's where the match is long (``use_sa_spec``)."""
    return _updated(config, use_sa_spec=True, sa_spec_threshold=threshold)


def recorded_proposals(monkeypatch: pytest.MonkeyPatch, resources: type) -> list[tuple[list[int], Any]]:
    """Record every proposal ``resources.propose(self, requests)`` returns, with its request's
    tokens at the time, as ``(token_ids, proposal)``, in order."""
    seen: list[tuple[list[int], Any]] = []
    propose = resources.propose

    def recording(self: Any, requests: list[Request]) -> list[Any]:
        proposals = propose(self, requests)
        seen.extend((list(r.token_ids), p) for r, p in zip(requests, proposals))
        return proposals

    monkeypatch.setattr(resources, "propose", recording)
    return seen


def setup_seconds_by_phase(llm: LLM, first: list[int], second: list[int], steady_steps: int = 3) -> list[float]:
    """The method's ``setup_seconds`` after each phase of a run on ``llm``'s engine: request
    ``first`` joins and takes one step, then ``steady_steps`` steps, then request ``second`` joins
    the running batch and one step runs. A method whose catch-ups are setup reports a rise after
    the first and third phases and none after the steady one."""
    engine = llm.engine
    params = SamplingParams(max_tokens=steady_steps + 8, ignore_eos=True)
    readings = []
    engine.add_request(first, params)
    engine.step()
    readings.append(engine.resource_manager.setup_seconds())
    for _ in range(steady_steps):
        engine.step()
    readings.append(engine.resource_manager.setup_seconds())
    engine.add_request(second, params)
    engine.step()
    readings.append(engine.resource_manager.setup_seconds())
    return readings


class MethodConformance:
    """Base class of a method's conformance tests. Subclasses implement :meth:`make_config`."""

    #: Sampled-distribution test: samples drawn and tokens per sample.
    num_samples: int = 2000
    sample_length: int = 4
    sampling = SamplingParams(temperature=1.0, top_k=3, max_tokens=4)
    #: Requests the sampled-distribution tests decode together: a wide batch costs a tiny model
    #: little more per step than one request, so the samples come in far fewer steps.
    sample_batch_size: int = 64

    def make_config(self, target: TinyTarget, tmp_path: Path) -> SpeculativeConfig | dict[str, Any]:
        raise NotImplementedError

    def make_target(self) -> TinyTarget:
        """The tiny target on the device under test (``SPECDEC_TEST_DEVICE``, ``cpu`` unless set)."""
        return make_tiny_target(seed=0, device=device_under_test())

    # -- fixtures -------------------------------------------------------------------------------

    # Class-scoped fixtures are classmethods (pytest's rule); they call the hooks on an instance.

    @pytest.fixture(scope="class")
    @classmethod
    def target(cls) -> TinyTarget:
        return cls().make_target()

    @pytest.fixture(scope="class")
    @classmethod
    def config(cls, target: TinyTarget, tmp_path_factory: pytest.TempPathFactory) -> Any:
        """The method's config, drafting on its own: suffix drafts over it (on by default for a
        model drafter) would take most steps of a tiny random model's repetitive output, and the
        tests would prove little about the method. :meth:`test_suffix_drafts_over_the_method_stay_lossless`
        turns them on; a config that sets ``use_sa_spec`` itself keeps its choice."""
        return own_drafts(cls().make_config(target, tmp_path_factory.mktemp("method")))

    @pytest.fixture(scope="class")
    @classmethod
    def plain(cls, target: TinyTarget) -> LLM:
        return LLM(target.model, None, tokenizer=target.tokenizer)

    @pytest.fixture
    def spec(self, target: TinyTarget, config: Any) -> LLM:
        # Fixed draft length: on a tiny model the measured forward costs are noise, and the
        # adaptive policy could skip the very drafts these tests need verified.
        llm = LLM(target.model, fixed_draft_len(config), tokenizer=target.tokenizer)
        yield llm
        llm.close()

    @pytest.fixture(scope="class")
    @classmethod
    def prompts(cls, target: TinyTarget, plain: LLM) -> list[list[int]]:
        """Prompts whose continuation repeats something earlier, so drafts can be accepted."""
        out = []
        for text in ("the cat sat on the mat. the cat", "hello world, hello", "abc abd abe ab", "one two three, one two"):
            ids = target.encode(text)
            cont = plain.generate({"prompt_token_ids": ids}, SamplingParams(max_tokens=12))[0].token_ids
            out.append(ids + cont + ids)
            out.append(ids)
        return out

    # -- tests ----------------------------------------------------------------------------------

    def test_greedy_output_equals_plain_greedy(self, plain: LLM, spec: LLM, prompts: list[list[int]]) -> None:
        """Greedy speculative output is token-for-token the plain greedy output (fp32)."""
        params = SamplingParams(max_tokens=48)
        accepted = 0
        for ids in prompts:
            expected = plain.generate({"prompt_token_ids": ids}, params)[0]
            got = spec.generate({"prompt_token_ids": ids}, params)[0]
            assert got.token_ids == expected.token_ids, f"prompt {ids}"
            assert got.finish_reason == expected.finish_reason
            accepted += got.metrics.num_accepted_tokens
        assert accepted > 0, "no draft token was ever accepted: the test would prove nothing"

    def _sampled_outcomes(self, target: TinyTarget, config: Any, prompt: list[int],
                          params: SamplingParams | None = None) -> tuple[dict[tuple[int, ...], int], Any, Any]:
        """``num_samples`` unseeded outputs of ``prompt`` in one ``generate`` call (the requests
        run in batches), counted; the metrics; and the engine's logits processing. ``params``
        default to :attr:`sampling` for :attr:`sample_length` tokens."""
        observed: dict[tuple[int, ...], int] = {}
        params = params or self.sampling.model_copy(update={"max_tokens": self.sample_length, "ignore_eos": True})
        llm = LLM(target.model, config, tokenizer=target.tokenizer, max_batch_size=self.sample_batch_size)
        try:
            torch.manual_seed(0)
            for out in llm.generate([{"prompt_token_ids": prompt}] * self.num_samples, params):
                key = tuple(out.token_ids)
                observed[key] = observed.get(key, 0) + 1
            return observed, llm.get_metrics(), llm.engine.processing
        finally:
            llm.close()

    def _sampled_outcomes_that_verify(self, target: TinyTarget, config: Any, prompt: list[int],
                                      params: SamplingParams | None = None) -> tuple[dict[tuple[int, ...], int], Any]:
        """:meth:`_sampled_outcomes` that saw drafts both accepted and rejected, and the engine's
        logits processing. The adaptive policy follows measured timings: on a busy
        machine it may find that drafting does not pay at this batch size and verify too few
        drafts to prove anything. Then the samples are drawn again at the fixed draft length,
        which verifies the same way."""
        observed, metrics, processing = self._sampled_outcomes(target, config, prompt, params)
        if not 0 < metrics.num_accepted_tokens < metrics.num_draft_tokens:
            observed, metrics, processing = self._sampled_outcomes(target, fixed_draft_len(config), prompt, params)
        assert 0 < metrics.num_accepted_tokens < metrics.num_draft_tokens, (
            "the samples saw no acceptance or no rejection: the test would prove nothing"
        )
        return observed, processing

    def test_sampled_output_follows_target_distribution(self, target: TinyTarget, config: Any, prompts: list[list[int]]) -> None:
        """Speculative sampling draws from the target's own distribution (chi-square), in the
        configuration users get: the adaptive draft length on and no seed (rejection sampling)."""
        prompt = prompts[0]
        observed, _ = self._sampled_outcomes_that_verify(target, config, prompt)
        expected = exact_joint_distribution(target.model, prompt, self.sampling, self.sample_length)
        p_value = chi_square_p_value(observed, expected, self.num_samples)
        assert p_value > P_VALUE_FLOOR, f"sampled outputs do not follow the target (p={p_value:.2e})"

    def test_seeded_output_is_reproducible(self, target: TinyTarget, config: Any, plain: LLM, prompts: list[list[int]]) -> None:
        """A seeded sampled request gives plain decoding's output for that seed, token for token
        (fp32): alone and batched in the default configuration (the adaptive draft length
        choosing), batched with every proposal verified in full, and again."""
        params = [
            self.sampling.model_copy(update={"max_tokens": 24, "ignore_eos": True, "seed": 1000 + i})
            for i in range(len(prompts))
        ]
        requests = [{"prompt_token_ids": ids} for ids in prompts]
        expected = [o.token_ids for o in plain.generate(requests, params)]
        with LLM(target.model, config, tokenizer=target.tokenizer, max_batch_size=3) as llm:
            alone = [llm.generate(r, p)[0].token_ids for r, p in zip(requests, params)]
            batched = [o.token_ids for o in llm.generate(requests, params)]
        with LLM(target.model, fixed_draft_len(config), tokenizer=target.tokenizer, max_batch_size=3) as llm:
            full = llm.generate(requests, params)
            again = [o.token_ids for o in llm.generate(requests, params)]
        assert alone == expected
        assert batched == expected
        assert [o.token_ids for o in full] == expected
        assert again == expected
        assert sum(o.metrics.num_accepted_tokens for o in full) > 0, "no draft was accepted: the test would prove little"

    def test_batched_greedy_equals_each_prompts_plain_greedy(
        self, target: TinyTarget, config: Any, plain: LLM, prompts: list[list[int]]
    ) -> None:
        """Prompts decoded together, with ragged acceptance, requests leaving the batch and
        waiting ones joining it, each give exactly their own plain greedy output (fp32)."""
        params = [SamplingParams(max_tokens=12 + 5 * i) for i in range(len(prompts))]
        expected = [plain.generate({"prompt_token_ids": ids}, p)[0].token_ids for ids, p in zip(prompts, params)]
        llm = LLM(target.model, fixed_draft_len(config), tokenizer=target.tokenizer, max_batch_size=3)
        try:
            outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params)
        finally:
            llm.close()
        assert [o.token_ids for o in outputs] == expected
        assert sum(o.metrics.num_accepted_tokens for o in outputs) > 0, "no draft was accepted in the batch"

    def test_suffix_drafts_over_the_method_stay_lossless(
        self, target: TinyTarget, config: Any, plain: LLM, prompts: list[list[int]]
    ) -> None:
        """With ``use_sa_spec``, steps whose match is long take the suffix draft and the others the
        method's, and the method's state follows: greedy output batched and alone, and seeded
        sampled output batched, are plain decoding's token for token (fp32)."""
        requests = [{"prompt_token_ids": ids} for ids in prompts]
        greedy = [SamplingParams(max_tokens=12 + 5 * i) for i in range(len(prompts))]
        seeded = [self.sampling.model_copy(update={"max_tokens": 24, "ignore_eos": True, "seed": 2000 + i})
                  for i in range(len(prompts))]
        expected_greedy = [o.token_ids for o in plain.generate(requests, greedy)]
        expected_seeded = [o.token_ids for o in plain.generate(requests, seeded)]
        with LLM(target.model, fixed_draft_len(with_suffix_drafts(config)), tokenizer=target.tokenizer,
                 max_batch_size=3) as llm:
            batched = llm.generate(requests, greedy)
            taken = llm.engine.suffix_drafts.taken
            alone = [llm.generate(r, p)[0].token_ids for r, p in zip(requests, greedy)]
            sampled = [o.token_ids for o in llm.generate(requests, seeded)]
        assert [o.token_ids for o in batched] == expected_greedy
        assert alone == expected_greedy
        assert sampled == expected_seeded
        drafts = sum(o.metrics.num_drafts for o in batched)
        assert 0 < taken < drafts, f"{taken} of {drafts} drafts were suffix drafts: the test needs both kinds"
        assert sum(o.metrics.num_accepted_tokens for o in batched) > 0

    #: The penalties the logits-processor tests apply (a drafter that only repeats tokens can
    #: turn them off to get drafts accepted at all).
    penalties = {"repetition_penalty": 1.1, "frequency_penalty": 0.1, "presence_penalty": 0.1}

    def processed(self, prompt: list[int]) -> SamplingParams:
        """Every built-in logits processor but the grammar, mild enough that drafts still pass."""
        return SamplingParams(max_tokens=24, logit_bias={prompt[-1]: 0.5}, min_tokens=6, bad_words=["zq"], **self.penalties)

    #: The grammar the conformance tests constrain output to (over the tiny tokenizer's characters).
    grammar = StructuredOutputsParams(grammar='start: w (" " w)* "."\nw: /[a-z]{1,7}/')

    def test_logits_processors_keep_output_lossless(
        self, target: TinyTarget, config: Any, plain: LLM, prompts: list[list[int]]
    ) -> None:
        """Penalties, ``logit_bias``, ``min_tokens`` and ``bad_words`` (each verify row processed
        from its own prefix), and a grammar (drafts it forbids cut before the forward): greedy
        output, alone and batched, and seeded sampled output are plain processed decoding's,
        token for token (fp32)."""
        requests = [{"prompt_token_ids": ids} for ids in prompts]
        cases = {
            "processors": [self.processed(ids) for ids in prompts],
            "grammar": [SamplingParams(max_tokens=24, structured_outputs=self.grammar)] * len(prompts),
        }
        with LLM(target.model, fixed_draft_len(config), tokenizer=target.tokenizer, max_batch_size=3) as llm:
            for name, greedy in cases.items():
                seeded = [p.model_copy(update={"temperature": 1.0, "top_k": 3, "seed": 3000 + i}) for i, p in enumerate(greedy)]
                for params in (greedy, seeded):
                    expected = plain.generate(requests, params)
                    batched = llm.generate(requests, params)
                    assert [o.token_ids for o in batched] == [o.token_ids for o in expected], name
                    assert sum(o.metrics.num_accepted_tokens for o in batched) > 0, f"{name}: no draft was accepted"
                alone = [llm.generate(r, p)[0].token_ids for r, p in zip(requests[:2], greedy)]
                assert alone == [o.token_ids for o in plain.generate(requests[:2], greedy[:2])], name

    def test_processed_sampling_follows_the_processed_target_distribution(
        self, target: TinyTarget, config: Any, prompts: list[list[int]]
    ) -> None:
        """Sampled output under penalties (each verify row processed from its own prefix) follows the processed target distribution (chi-square), in the default
        configuration and without a seed (rejection sampling).

        (Seeded sampling needs no chi-square per method: seeded output is plain decoding's token
        for token, :meth:`test_seeded_output_is_reproducible`, and plain seeded draws follow the
        target, which the core's own tests check.)"""
        prompt = prompts[0]
        params = self.sampling.model_copy(update={
            "max_tokens": self.sample_length, "ignore_eos": True, **self.penalties})
        observed, processing = self._sampled_outcomes_that_verify(target, config, prompt, params)
        expected = exact_joint_distribution(target.model, prompt, params, self.sample_length, processing)
        p_value = chi_square_p_value(observed, expected, self.num_samples)
        assert p_value > P_VALUE_FLOOR, f"processed sampled outputs do not follow the target (p={p_value:.2e})"

    def test_logprobs_equal_plain_decodings(self, plain: LLM, spec: LLM, prompts: list[list[int]]) -> None:
        """Each output token's log-probability and the top 3 at its position are plain decoding's
        (fp32): they come from the verify forward's row that chose the token, the row plain
        decoding chose it from, including under a stop token met inside accepted drafts."""
        accepted = 0
        for ids in prompts:
            for params in (SamplingParams(max_tokens=24, logprobs=3), SamplingParams(max_tokens=24, logprobs=0)):
                expected = plain.generate({"prompt_token_ids": ids}, params)[0]
                got = spec.generate({"prompt_token_ids": ids}, params)[0]
                assert got.token_ids == expected.token_ids
                assert [lp.token_id for lp in got.logprobs] == got.token_ids
                for mine, theirs in zip(got.logprobs, expected.logprobs, strict=True):
                    assert mine.logprob == pytest.approx(theirs.logprob, abs=1e-4)
                    assert [t for t, _ in mine.top] == [t for t, _ in theirs.top] and len(mine.top) == params.logprobs
                    assert [v for _, v in mine.top] == pytest.approx([v for _, v in theirs.top], abs=1e-4)
                accepted += got.metrics.num_accepted_tokens
        assert accepted > 0, "no draft token was ever accepted: the test would prove nothing"

    def test_stop_token_inside_accepted_drafts(self, plain: LLM, spec: LLM, prompts: list[list[int]]) -> None:
        """A stop token met inside a run of accepted drafts ends output exactly as plain decoding."""
        checked = 0
        for ids in prompts:
            free = spec.generate({"prompt_token_ids": ids}, SamplingParams(max_tokens=32))[0]
            tokens = free.token_ids
            for cut in range(3, len(tokens)):
                stop = tokens[cut]
                if stop in tokens[:cut]:
                    continue
                params = SamplingParams(max_tokens=32, stop_token_ids=[stop])
                got = spec.generate({"prompt_token_ids": ids}, params)[0]
                assert got.token_ids == plain.generate({"prompt_token_ids": ids}, params)[0].token_ids
                assert got.token_ids == tokens[: cut + 1] and got.finish_reason == "stop"
                checked += 1
                break
        assert checked, "no prompt offered a usable stop token"

    def test_metrics_add_up(self, spec: LLM, prompts: list[list[int]]) -> None:
        """Counts obey vLLM's definitions, per request and in the aggregate."""
        spec.reset_metrics()
        outputs = spec.generate([{"prompt_token_ids": ids} for ids in prompts], SamplingParams(max_tokens=24, ignore_eos=True))
        for out in outputs:
            m = out.metrics
            assert m.num_output_tokens == len(out.token_ids) == 24
            # One token from prefill, then per step the accepted drafts plus one.
            assert len(out.token_ids) == 1 + m.num_steps + m.num_accepted_tokens
            assert m.num_accepted_tokens <= m.num_draft_tokens and m.num_drafts <= m.num_steps
            assert sum(m.num_accepted_tokens_per_pos) == m.num_accepted_tokens
            assert all(a >= b for a, b in itertools.pairwise(m.num_accepted_tokens_per_pos))
            if m.num_drafts:
                assert m.mean_acceptance_length == pytest.approx(1 + m.num_accepted_tokens / m.num_drafts)
                assert m.acceptance_rate == pytest.approx(m.num_accepted_tokens / m.num_draft_tokens)
            assert m.time_draft + m.time_forward + m.time_verify <= m.time_decode
        total = spec.get_metrics()
        assert total.num_accepted_tokens == sum(o.metrics.num_accepted_tokens for o in outputs)
        assert total.num_draft_tokens == sum(o.metrics.num_draft_tokens for o in outputs)
        assert total.num_drafts == sum(o.metrics.num_drafts for o in outputs)

    def test_resources_released_on_close(self, target: TinyTarget, config: Any, prompts: list[list[int]]) -> None:
        """Per-request state is dropped when a request ends, and everything on close."""
        llm = LLM(target.model, config, tokenizer=target.tokenizer)
        manager = llm.engine.resource_manager
        llm.generate({"prompt_token_ids": prompts[0]}, SamplingParams(max_tokens=8))
        llm.close()
        assert manager.released and llm.engine.resource_manager is None
        with pytest.raises(Exception, match="closed"):
            llm.generate({"prompt_token_ids": prompts[0]}, SamplingParams(max_tokens=8))
        del llm
        gc.collect()
