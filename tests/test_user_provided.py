"""The built-in ``user_provided`` method: a drafter object written by the user, no plugin package."""

from __future__ import annotations

import pytest
import torch

from specdec import (
    LLM,
    ConfigError,
    DraftProposal,
    PluginError,
    ResourceManager,
    SamplingParams,
    UserProvidedDecodingConfig,
    logits_to_probs,
)
from specdec.testing.conformance import MethodConformance


class BigramDrafter:
    """Samples drafts from its own distribution q: a fixed logits table indexed by the previous
    token (the target's logits on that single token plus noise, so q resembles p without being
    it), shaped by the request's sampling params as the target's logits are."""

    def __init__(self, table: torch.Tensor) -> None:
        self.table = table

    def prepare_draft_tokens(self, requests, resource_manager):
        proposals = []
        for request in requests:
            prev, tokens, probs = request.token_ids[-1], [], []
            for i in range(request.max_draft_len):
                q = logits_to_probs(self.table[prev], request.params)
                prev = request.sample(q, offset=i)
                tokens.append(prev)
                probs.append(q)
            proposals.append(DraftProposal(tokens, torch.stack(probs) if probs else None))
        return proposals


def bigram_table(model, noise: float = 0.5, seed: int = 0) -> torch.Tensor:
    """On the CPU whatever the model's device: a user's drafter may hand the engine CPU probabilities."""
    vocab = model.config.vocab_size
    with torch.inference_mode():
        logits = model(torch.arange(vocab, device=model.device)[:, None]).logits[:, -1].float().cpu()
    return logits + noise * torch.randn(logits.shape, generator=torch.Generator().manual_seed(seed))


class TestUserProvidedSamplingDrafterConformance(MethodConformance):
    """A user drafter that samples from its own q (DraftProposal with probs) passes the suite:
    greedy output equals plain greedy, sampled output follows the target distribution."""

    def make_config(self, target, tmp_path):
        return UserProvidedDecodingConfig(drafter=BigramDrafter(bigram_table(target.model)), max_draft_len=3)


class ListDrafter:
    """Returns plain lists of ints: the two tokens that came before the last one, again."""

    def __init__(self) -> None:
        self.accepted: list[tuple[int, list[int], list[int]]] = []

    def prepare_draft_tokens(self, requests, resource_manager):
        return [r.token_ids[-2:][: r.max_draft_len] for r in requests]

    def accept(self, requests, results):
        for request, result in zip(requests, results):
            self.accepted.append((result.num_accepted, result.next_token, list(request.token_ids)))


def test_drafter_returning_lists_of_ints(tiny):
    """Plain lists of token ids are accepted as proposals (one-hot drafts): greedy output equals
    plain greedy with drafts accepted, and sampling works too."""
    prompt = {"prompt_token_ids": tiny.encode("hello world, hello")}
    params = SamplingParams(max_tokens=24)
    expected = LLM(tiny.model, None, tokenizer=tiny.tokenizer).generate(prompt, params)[0]
    config = UserProvidedDecodingConfig(drafter=ListDrafter(), max_draft_len=2, adaptive_draft_len=False)
    with LLM(tiny.model, config, tokenizer=tiny.tokenizer) as llm:
        got = llm.generate(prompt, params)[0]
        assert got.token_ids == expected.token_ids
        assert got.metrics.num_accepted_tokens > 0
        sampled = llm.generate(prompt, SamplingParams(temperature=1.0, max_tokens=24, seed=1, ignore_eos=True))[0]
        assert len(sampled.token_ids) == 24 and sampled.metrics.num_drafts > 0


def test_accept_called_each_step_with_results(tiny):
    """The drafter's optional ``accept(requests, results)`` runs once per step, after the new
    tokens are appended, with the verification results the metrics count."""
    drafter = ListDrafter()
    prompt = {"prompt_token_ids": tiny.encode("hello world, hello")}
    with LLM(tiny.model, {"method": "user_provided", "drafter": drafter, "max_draft_len": 2}, tokenizer=tiny.tokenizer) as llm:
        out = llm.generate(prompt, SamplingParams(max_tokens=30, ignore_eos=True))[0]
    m = out.metrics
    assert len(drafter.accepted) == m.num_steps > 0
    assert sum(n for n, _, _ in drafter.accepted) == m.num_accepted_tokens > 0
    full = out.prompt_token_ids + out.token_ids
    for num_accepted, next_token, seen in drafter.accepted:
        # Tokens were already appended: the step's next token is the last one seen.
        assert seen[-1] == next_token
        assert seen == full[: len(seen)]
    assert drafter.accepted[-1][2] == full


def test_drafter_without_prepare_draft_tokens_is_refused(tiny):
    """A drafter lacking a callable ``prepare_draft_tokens`` is refused up front with a
    ConfigError naming ``speculative_config.drafter`` (a missing drafter too)."""

    class NotADrafter:
        prepare_draft_tokens = "not callable"

    for drafter in (object(), NotADrafter()):
        with pytest.raises(ConfigError, match=r"^speculative_config\.drafter: .*must implement prepare_draft_tokens"):
            LLM(tiny.model, {"method": "user_provided", "drafter": drafter}, tokenizer=tiny.tokenizer)
    with pytest.raises(ConfigError, match=r"^speculative_config\.drafter: Field required"):
        LLM(tiny.model, {"method": "custom"}, tokenizer=tiny.tokenizer)
    # Built directly, the config object refuses it as well (pydantic's error names the field).
    with pytest.raises(ValueError, match="drafter"):
        UserProvidedDecodingConfig(drafter=object())


def test_wrong_number_of_proposals_is_a_plugin_error(tiny):
    """A drafter returning a proposal count different from the request count fails clearly."""

    class TooMany:
        def prepare_draft_tokens(self, requests, resource_manager):
            return [[] for _ in range(len(requests) + 1)]

    with LLM(tiny.model, UserProvidedDecodingConfig(drafter=TooMany()), tokenizer=tiny.tokenizer) as llm:
        with pytest.raises(PluginError, match="returned 2 proposals for 1 requests"):
            llm.generate({"prompt_token_ids": [5, 6, 7]}, SamplingParams(max_tokens=4))


def test_user_resource_manager_lifecycle(tiny):
    """A ResourceManager passed in the config is the session's manager: add_request and
    free_request bracket each request, the drafter receives it, and close releases it."""
    events: list[str] = []

    class Manager(ResourceManager):
        def add_request(self, request):
            events.append(f"add {request.request_id}")

        def free_request(self, request):
            events.append(f"free {request.request_id}")

    manager = Manager()

    class Drafter:
        def prepare_draft_tokens(self, requests, resource_manager):
            assert resource_manager is manager
            return [[] for _ in requests]

    llm = LLM(tiny.model, UserProvidedDecodingConfig(drafter=Drafter(), resource_manager=manager), tokenizer=tiny.tokenizer)
    assert llm.engine.resource_manager is manager
    llm.generate([{"prompt_token_ids": [5, 6]}, {"prompt_token_ids": [7]}], SamplingParams(max_tokens=3))
    # Both run in one batch: each is added after its prefill and freed when it finishes.
    assert events == ["add 0", "add 1", "free 0", "free 1"]
    llm.close()
    assert manager.released
    with pytest.raises(ConfigError, match=r"speculative_config\.resource_manager"):
        LLM(tiny.model, {"method": "user_provided", "drafter": Drafter(), "resource_manager": object()}, tokenizer=tiny.tokenizer)
