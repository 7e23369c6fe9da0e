"""The draft prefills a request's row only when the engine first drafts for it, catches a row up
after paused steps in a forward of its own, and neither is mistaken for the per-token cost of
drafting."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from specdec import LLM, Request, SamplingParams
from specdec.draft_policy import ContextCost, ForwardCost
from specdec.models import load_model
from specdec_draft_target.drafter import DraftModel


def config(draft: Path, **options: object) -> dict:
    """The draft model drafting every step it is asked to (no suffix drafts in its place)."""
    return {"method": "draft_target", "speculative_model": str(draft), "max_draft_len": 2, "use_sa_spec": False, **options}


def test_a_request_never_drafted_for_costs_the_draft_nothing(tiny, small_draft_dir: Path) -> None:
    """With forwards wider than one token costing 50 times one, the policy never drafts: the
    draft model then runs no forward at all, not even the prompt's prefill."""
    prompt = {"prompt_token_ids": tiny.encode("hello world, hello world, hello")}
    params = SamplingParams(max_tokens=24)
    plain = LLM(tiny.model, None, tokenizer=tiny.tokenizer).generate(prompt, params)[0]
    with LLM(tiny.model, config(small_draft_dir), tokenizer=tiny.tokenizer) as llm:
        never = ForwardCost([1.0, 50.0, 50.0], base_seconds=1.0)
        llm.engine.policy.forward_costs[1] = ContextCost((128, 1024), (never, never))
        calls = []
        draft_model = llm.engine.resource_manager.drafter.runner.model
        draft_model.register_forward_hook(lambda *_: calls.append(1))
        got = llm.generate(prompt, params)[0]
    assert got.token_ids == plain.token_ids and got.metrics.num_drafts == 0
    assert calls == []


def test_prefill_time_is_kept_out_of_the_drafting_cost(tiny, small_draft_dir: Path) -> None:
    """A prefill made slow by 0.4 s lands in the request's drafting time, but the engine's
    per-token drafting estimate, which decides whether drafting pays, stays at what the draft's
    chain forwards cost (counted in, it would be at least 0.4 s over 2 tokens)."""
    with LLM(tiny.model, config(small_draft_dir), tokenizer=tiny.tokenizer) as llm:
        drafter = llm.engine.resource_manager.drafter
        forward = drafter.runner.forward

        def slow_prefill(*args, **kwargs):
            time.sleep(0.4)
            return forward(*args, **kwargs)

        drafter.runner.forward = slow_prefill
        got = llm.generate({"prompt_token_ids": tiny.encode("hello world")}, SamplingParams(max_tokens=4))[0]
        assert got.metrics.num_drafts >= 1 and got.metrics.time_draft >= 0.4
        assert llm.engine.policy.draft_time[1].seconds < 0.05


def test_rows_prefilled_late_stay_lossless(tiny, small_draft_dir: Path) -> None:
    """Drafting is off while more than one request runs (``max_concurrency`` 1), so the last
    request to finish is first drafted for dozens of tokens into its output: its row is prefilled
    then, and every request's greedy output still equals its own plain output (fp32)."""
    prompts = [tiny.encode(text) for text in ("hello world, hello", "the cat sat on", "a b c a b c a")]
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (12, 30, 80)]
    plain = LLM(tiny.model, None, tokenizer=tiny.tokenizer)
    expected = [plain.generate({"prompt_token_ids": p}, s)[0].token_ids for p, s in zip(prompts, params)]
    options = config(small_draft_dir, max_concurrency=1, adaptive_draft_len=False)
    with LLM(tiny.model, options, tokenizer=tiny.tokenizer) as llm:
        prefilled = []
        drafter = llm.engine.resource_manager.drafter
        prefill = drafter._prefill
        drafter._prefill = lambda request, state: prefilled.append(len(request.token_ids)) or prefill(request, state)
        got = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    assert [g.token_ids for g in got] == expected
    assert got[2].metrics.num_drafts > 0 and prefilled == [len(prompts[2]) + 30]


def test_rows_behind_catch_up_apart_and_draft_as_if_never_paused(tiny, small_draft_dir: Path) -> None:
    """Two rows draft; then one gets six tokens it was not drafted for (drafting was paused for
    it) and the other only its bonus token. The next step catches the first row up in a forward
    of its own, timed as sync work, and both rows draft what the draft would from scratch."""
    model, _ = load_model(str(small_draft_dir), torch.float32, "cpu")
    reference, _ = load_model(str(small_draft_dir), torch.float32, "cpu")
    drafter = DraftModel(model, len(tiny.tokenizer))
    texts = ("hello world, hello", "the cat sat on")
    requests = [Request(i, tiny.encode(t), len(tiny.encode(t)), SamplingParams(max_tokens=64), None)
                for i, t in enumerate(texts)]
    for request in requests:
        request.method_state = drafter.add(request)
        request.max_draft_len = 3
    drafter.propose(requests)
    prefilled = drafter.setup_clock.seconds
    requests[0].token_ids += tiny.encode(" the mat, the cat")[:6]
    requests[1].token_ids.append(tiny.encode("x")[0])
    got = [p.token_ids for p in drafter.propose(requests)]
    assert drafter.setup_clock.seconds > prefilled
    assert got == [greedy(reference, r.token_ids, 3) for r in requests]


def test_a_newcomer_takes_the_row_of_a_request_that_left(tiny, small_draft_dir: Path) -> None:
    """The engine puts a new request in the place of one that finished: the draft writes the
    newcomer's prefill over that row, copies no other row (no ``select_rows``), and both rows
    draft what the draft would from scratch."""
    model, _ = load_model(str(small_draft_dir), torch.float32, "cpu")
    reference, _ = load_model(str(small_draft_dir), torch.float32, "cpu")
    drafter = DraftModel(model, len(tiny.tokenizer))
    texts = ("hello world, hello", "the cat sat on", "a b c a b c a b")
    requests = [Request(i, tiny.encode(t), len(tiny.encode(t)), SamplingParams(max_tokens=64), None)
                for i, t in enumerate(texts)]
    for request in requests:
        request.method_state = drafter.add(request)
        request.max_draft_len = 3
    drafter.propose(requests[:2])
    selected = []
    select_rows = drafter.cache.select_rows
    drafter.cache.select_rows = lambda rows: selected.append(rows) or select_rows(rows)
    batch = [requests[2], requests[1]]
    got = [p.token_ids for p in drafter.propose(batch)]
    assert selected == [] and drafter.rows == [2, 1]
    assert got == [greedy(reference, r.token_ids, 3) for r in batch]


def greedy(model: torch.nn.Module, ids: list[int], count: int) -> list[int]:
    """``count`` greedy tokens of ``model`` after ``ids``, each from a full forward (no cache)."""
    out = list(ids)
    with torch.no_grad():
        for _ in range(count):
            out.append(int(model(torch.tensor([out])).logits[0, -1].argmax()))
    return out[len(ids):]
