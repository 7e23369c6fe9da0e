"""Run every prompt plainly, speculatively and (optionally) with transformers' peer and with plain
decoding on eager forwards (what CUDA graphs gain), interleaved.

All modes share one loaded model. Before timing, each mode runs once (warm-up). For multi-turn
prompts every mode answers the same conversation: later turns carry the plain decoding's
earlier answers, so each mode processes identical inputs.

With a batch size above 1, prompts of one category and turn run together in batches, each mode
on the same batch in turn; a request's time is its batch's wall time divided by the batch size,
so throughput sums (output tokens over wall time) stay exact per category and overall.

``repeats`` runs every turn (or batch) that many rounds, each round every mode once with the
order rotating, and keeps every round: a shared machine's speed drifts by ten percent over
seconds, so one pair of runs per batch can tell little from noise. Before each repeat, the
speculative engine forgets its finished requests (:meth:`~specdec.engine.Engine.forget_finished`):
a drafter that remembers outputs (suffix drafts, a public n-gram pool) would otherwise draft
the repeat from its own earlier answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from specdec.bench.dataset import Question
from specdec.errors import ConfigError
from specdec.llm import LLM
from specdec.metrics import RequestMetrics
from specdec.sampling import SamplingParams

PLAIN, SPEC, HF, HF_STATIC, EAGER = "plain", "spec", "hf", "hf_static", "eager"


@dataclass
class Run:
    """One timed generation of one turn in one mode."""

    tokens: list[int]
    seconds: float
    #: specdec's own metrics (``None`` for transformers' peer).
    metrics: RequestMetrics | None = None


@dataclass
class TurnResult:
    question_id: str
    category: str
    turn: int
    runs: dict[str, Run]
    #: Which of the ``repeats`` rounds of this turn (0 for the first).
    round: int = 0
    #: Which batch of the run the request was timed in; ``None`` at batch size 1, where each
    #: turn is timed alone. Requests of one batch and round share one timing.
    batch: int | None = None

    @property
    def timing(self) -> tuple:
        """Identifies the timed run this result's seconds come from."""
        if self.batch is None:
            return (self.question_id, self.turn, self.round)
        return (self.batch, self.round)


class HFPeer:
    """transformers' own ``generate`` with the method's equivalent option."""

    def __init__(self, llm: LLM, kwargs: dict[str, Any], params: SamplingParams) -> None:
        self.model = llm.model
        self.tokenizer = llm.tokenizer
        self.kwargs = kwargs
        sampling = {"do_sample": False} if params.greedy else {
            "do_sample": True, "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k or None,
            "min_p": params.min_p or None,
        }
        eos = sorted(llm.engine.stops.eos_token_ids)
        self.base = {"pad_token_id": eos[0] if eos else None, "eos_token_id": eos or None, **sampling}
        self.ignore_eos = params.ignore_eos

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], max_tokens: int) -> Run:
        input_ids = torch.tensor([prompt_ids], device=self.model.device)
        start = time.perf_counter()
        length = {"max_new_tokens": max_tokens, "min_new_tokens": max_tokens if self.ignore_eos else None}
        out = self.model.generate(input_ids, attention_mask=torch.ones_like(input_ids), **length, **self.base, **self.kwargs)
        tokens = out[0, len(prompt_ids):].tolist()  # on the host: the clock stops once the GPU is done
        return Run(tokens, time.perf_counter() - start)


def _run_llm(llm: LLM, prompt_ids: list[int], params: SamplingParams) -> Run:
    return _run_llm_batch(llm, [prompt_ids], params)[0]


def _run_llm_batch(llm: LLM, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]) -> list[Run]:
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params)
    share = (time.perf_counter() - start) / len(prompts)
    return [Run(out.token_ids, share, out.metrics) for out in outputs]


def run_benchmark(
    plain: LLM,
    spec: LLM,
    hf: HFPeer | None,
    questions: list[Question],
    params: SamplingParams,
    max_turns: int,
    on_turn: Callable[[TurnResult], None] | None = None,
    repeats: int = 1,
    eager: LLM | None = None,
    hf_static: HFPeer | None = None,
) -> list[TurnResult]:
    """Every turn in every mode; ``eager`` (plain decoding with every forward eager) times what
    the captured forwards of ``plain`` and ``spec`` gain, ``hf_static`` transformers' plain
    decoding with a static cache (compiled, on CUDA)."""
    runners: dict[str, Callable[[list[int], SamplingParams], Run]] = {
        PLAIN: lambda ids, p: _run_llm(plain, ids, p),
        SPEC: lambda ids, p: _run_llm(spec, ids, p),
    }
    if (hf is not None or hf_static is not None) and any(q.structured_outputs or q.tools for q in questions):
        raise ConfigError("--baseline hf: transformers' generate cannot follow the prompts' structured_outputs; "
                          "leave the hf baseline out for this prompt set")
    if hf is not None:
        runners[HF] = lambda ids, p: hf.generate(ids, p.max_tokens)
    if eager is not None:
        runners[EAGER] = lambda ids, p: _run_llm(eager, ids, p)
    if hf_static is not None:
        runners[HF_STATIC] = lambda ids, p: hf_static.generate(ids, p.max_tokens)
    spec.warmup()
    # A few tokens only: a drafter that remembers earlier outputs (suffix decoding, a public
    # n-gram pool) must not meet the first question's answer before it is timed.
    # Two prompt lengths: transformers' compiled static cache is sized per call, and torch.compile
    # recompiles for the second size seen (then for any size), which must not be timed either.
    warm = plain.encode(questions[0].turns[0], chat=True)
    for run in runners.values():
        for length in (len(warm) // 2, len(warm) // 4):
            run(warm[: max(length, 1)], params.model_copy(update={"max_tokens": 8}))

    results = []
    order = list(runners)
    for q in questions:
        messages: list[dict[str, str]] = []
        for turn, text in enumerate(q.turns[:max_turns]):
            messages.append({"role": "user", "content": text})
            prompt_ids = q.encode(plain, messages)
            rounds = []
            for round_ in range(repeats):
                if round_:  # a drafter that remembers outputs must not copy this turn's last answer
                    spec.engine.forget_finished()
                runs = {mode: runners[mode](prompt_ids, q.params(params)) for mode in order}
                # Rotate which mode goes first so drift in machine speed does not favour one.
                order = order[1:] + order[:1]
                rounds.append(TurnResult(q.question_id, q.category, turn, runs, round_))
                if on_turn:
                    on_turn(rounds[-1])
            results += rounds
            answer = plain.tokenizer.decode(rounds[0].runs[PLAIN].tokens, skip_special_tokens=True)
            messages.append({"role": "assistant", "content": answer})
    return results


def run_batched_benchmark(
    plain: LLM,
    spec: LLM,
    questions: list[Question],
    params: SamplingParams,
    max_turns: int,
    batch_size: int,
    on_turn: Callable[[TurnResult], None] | None = None,
    repeats: int = 1,
    eager: LLM | None = None,
) -> list[TurnResult]:
    """Throughput of plain and speculative batched decoding (and ``eager`` plain decoding) on
    the same batches, interleaved."""
    llms = {PLAIN: plain, SPEC: spec, **({EAGER: eager} if eager is not None else {})}
    for llm in llms.values():
        llm.warmup(batch_size)
    warm = plain.encode(questions[0].turns[0], chat=True)
    for llm in llms.values():
        _run_llm_batch(llm, [warm] * min(batch_size, len(questions)), params.model_copy(update={"max_tokens": 8}))

    conversations: dict[str, list[dict[str, str]]] = {q.question_id: [] for q in questions}
    categories = list(dict.fromkeys(q.category for q in questions))
    results = []
    order = list(llms)
    batch_index = 0
    for turn in range(max_turns):
        for category in categories:
            group = [q for q in questions if q.category == category and len(q.turns) > turn]
            for start in range(0, len(group), batch_size):
                batch = group[start : start + batch_size]
                prompts = []
                for q in batch:
                    conversations[q.question_id].append({"role": "user", "content": q.turns[turn]})
                    prompts.append(q.encode(plain, conversations[q.question_id]))
                rounds = []
                for round_ in range(repeats):
                    if round_:  # a drafter that remembers outputs must not copy these turns' last answers
                        llms[SPEC].engine.forget_finished()
                    runs = {mode: _run_llm_batch(llms[mode], prompts, [q.params(params) for q in batch]) for mode in order}
                    order = order[1:] + order[:1]
                    rounds.append(runs)
                    for i, q in enumerate(batch):
                        result = TurnResult(
                            q.question_id, category, turn, {mode: runs[mode][i] for mode in runs}, round_, batch_index
                        )
                        results.append(result)
                        if on_turn:
                            on_turn(result)
                for i, q in enumerate(batch):
                    answer = plain.tokenizer.decode(rounds[0][PLAIN][i].tokens, skip_special_tokens=True)
                    conversations[q.question_id].append({"role": "assistant", "content": answer})
                batch_index += 1
    return results
