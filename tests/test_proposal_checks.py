"""What the engine refuses from a drafter, and from the target: each refusal ends only the request
it belongs to, with a message that says what was expected."""

from __future__ import annotations

import copy
import re

import pytest
import torch

from specdec import LLM, DraftProposal, SamplingParams, UserProvidedDecodingConfig
from specdec.errors import RequestFailedError

SAMPLED = SamplingParams(temperature=0.9, max_tokens=16, ignore_eos=True, seed=0)


class Drafter:
    """Proposes ``make(request)`` for the first request (by id) and nothing for the others."""

    def __init__(self, make) -> None:
        self.make = make

    def prepare_draft_tokens(self, requests, resource_manager):
        return [self.make(r) if r.request_id == 0 else DraftProposal() for r in requests]


def run(tiny, drafter, params=SAMPLED, prompts=("hello world, hello", "abc abc ab")):
    """Generate ``prompts`` with ``drafter``; returns the outputs and the error raised (or None)."""
    config = UserProvidedDecodingConfig(drafter=drafter, max_draft_len=4, adaptive_draft_len=False)
    with LLM(tiny.model, config, tokenizer=tiny.tokenizer) as llm:
        try:
            return llm.generate([{"prompt_token_ids": tiny.encode(p)} for p in prompts], params), None
        except RequestFailedError as exc:
            return exc.outputs, exc


def uniform(vocab: int, n: int) -> torch.Tensor:
    return torch.full((n, vocab), 1.0 / vocab)


@pytest.mark.parametrize(
    ("probs", "message"),
    [
        (lambda v: torch.full((2, v), -1.0), "DraftProposal.probs: negative probabilities"),
        (lambda v: uniform(v, 2).index_fill(1, torch.tensor([3]), float("nan")), "DraftProposal.probs: not finite"),
        (lambda v: uniform(v, 2) * 0.5, "DraftProposal.probs: a row sums to 0.5, not 1"),
        (lambda v: uniform(v, 2).index_fill(1, torch.tensor([5]), 0.0) / (1 - 1 / v), "a drafted token has probability 0"),
        (lambda v: uniform(v, 3), r"DraftProposal.probs: expected shape \[2, \d+\] for 2 drafts, got \[3, \d+\]"),
        (lambda v: torch.ones(2, v, dtype=torch.long), "expected a float tensor"),
    ],
    ids=["negative", "nan", "sum", "q-zero-at-draft", "shape", "integer"],
)
def test_draft_probabilities_are_checked_for_content(tiny, probs, message):
    """Draft probabilities that are not a distribution, or give the drafted token no mass, end
    the request with a PluginError naming the method and the failed check (q = -1 used to make
    rejection sampling accept every draft); the request beside it finishes."""
    vocab = tiny.model.config.vocab_size
    outputs, error = run(tiny, Drafter(lambda r: DraftProposal([5, 6], probs(vocab))))
    assert error is not None
    assert outputs[0].finish_reason == "error" and "user_provided" in outputs[0].error
    assert re.search(message, outputs[0].error), outputs[0].error
    assert outputs[1].finish_reason == "length" and len(outputs[1].token_ids) == 16


def test_valid_draft_probabilities_pass(tiny):
    """A real distribution over the vocabulary (bf16 included) is accepted as it is."""
    vocab = tiny.model.config.vocab_size
    outputs, error = run(tiny, Drafter(lambda r: DraftProposal([5, 6], uniform(vocab, 2).bfloat16())))
    assert error is None and all(o.finish_reason == "length" for o in outputs)


@pytest.mark.parametrize(
    ("item", "message"),
    [
        (None, "proposed None for a request; expected a DraftProposal"),
        (5, "proposed a int for a request; expected a DraftProposal"),
        ("abc", "proposed a str for a request; expected a DraftProposal"),
        (["a", "b"], r"DraftProposal.token_ids: expected a list of int, got an item 'a' \(str\)"),
        ([1.0, 2.5], r"DraftProposal.token_ids: expected a list of int, got an item 1.0 \(float\)"),
        (torch.tensor([1.0, 2.0]), "DraftProposal.token_ids: expected a list of int, got a 1-D torch.float32 tensor"),
        (DraftProposal([1, 2], parents=[-1, 0.5]), r"DraftProposal.parents: expected a list of int, got an item 0.5"),
        (DraftProposal([1, 2], parents=[1, -1]), "parents do not come before their children"),
        ([1, 10**6], "drafted a token id outside"),
    ],
    ids=["none", "number", "string", "strings", "floats", "float-tensor", "float-parents", "parent-order", "range"],
)
def test_a_malformed_proposal_is_a_plugin_error_saying_what_was_expected(tiny, item, message):
    """A drafter returning None, a number, strings, float token ids or float tree parents for a
    request ends that request with a message saying what was expected; the other request finishes."""
    outputs, error = run(tiny, Drafter(lambda r: copy.deepcopy(item)), params=SamplingParams(max_tokens=16, ignore_eos=True))
    assert error is not None
    assert re.search(message, outputs[0].error), outputs[0].error
    assert outputs[1].finish_reason == "length"


@pytest.mark.parametrize(
    ("returned", "message"),
    [(None, "user drafter returned None; expected a list of"), (7, "user drafter returned a int; expected a list of")],
)
def test_a_drafter_returning_no_list_fails_its_requests_clearly(tiny, returned, message):
    """A drafter returning something other than a list of proposals fails the step's requests
    with a message saying what was expected, not a TypeError from deep inside the engine."""
    class Broken:
        def prepare_draft_tokens(self, requests, resource_manager):
            return returned

    outputs, error = run(tiny, Broken(), params=SamplingParams(max_tokens=8))
    assert error is not None and all(o.finish_reason == "error" and message in o.error for o in outputs)


def test_non_finite_target_logits_end_only_their_request(tiny):
    """A target producing NaN logits for one request (here: a token whose embedding is NaN, met
    in its prompt or in its drafts) ends that request with a clear error; the others finish and
    greedy argmax never silently picks from NaNs."""
    model = copy.deepcopy(tiny.model)
    poisoned = tiny.encode("z")[0]
    with torch.no_grad():
        model.get_input_embeddings().weight[poisoned] = float("nan")
    prompts = ["hello world, hello", "zebra", "abc abc ab"]

    def draft_poison(request):
        return DraftProposal([poisoned])

    config = UserProvidedDecodingConfig(drafter=Drafter(draft_poison), max_draft_len=2, adaptive_draft_len=False)
    with LLM(model, config, tokenizer=tiny.tokenizer) as llm:
        with pytest.raises(RequestFailedError) as info:
            llm.generate([{"prompt_token_ids": tiny.encode(p)} for p in prompts], SamplingParams(max_tokens=12, ignore_eos=True))
    outputs = info.value.outputs
    for output in outputs[:2]:  # request 0 met it in a draft, request 1 in its prompt
        assert output.finish_reason == "error" and "NaN or +inf logits" in output.error
    assert outputs[2].finish_reason == "length" and len(outputs[2].token_ids) == 12
