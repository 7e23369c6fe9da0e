"""Verification rules and sampling transforms, checked against independent references."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from scipy.stats import chi2_contingency, chisquare

from specdec import (
    LLM,
    DraftProposal,
    SamplingParams,
    UserProvidedDecodingConfig,
    VerifyResult,
    hookimpl,
    logits_to_probs,
)
from specdec.plugins import get_registry
from specdec.testing.conformance import P_VALUE_FLOOR, chi_square_p_value, exact_joint_distribution
from specdec.verify import greedy_verify, rejection_sample, verify_one

# -- (a) rejection sampling vs an independent reference -----------------------------------------


def reference_speculative_decode(draft_tokens, draft_probs, target_probs, generator):
    """Rejection sampling as gpt-fast's ``speculative_decode`` writes it (independent of specdec).

    ``draft_probs`` ``[k, V]`` (one-hot rows for deterministic drafts), ``target_probs``
    ``[k + 1, V]``. Returns (number of drafts accepted, next token).
    """
    k = len(draft_tokens)
    tokens = torch.tensor(draft_tokens)
    p = target_probs[torch.arange(k), tokens]
    q = draft_probs[torch.arange(k), tokens]
    accept_draft_prob = torch.minimum(torch.ones(()), p / q)
    rejected_locations = (torch.rand(k, generator=generator) > accept_draft_prob).nonzero()
    if rejected_locations.shape[0] == 0:  # every draft accepted: bonus token from p
        return k, int(torch.multinomial(target_probs[-1], 1, generator=generator))
    n = int(rejected_locations[0])
    new = target_probs[n] - draft_probs[n]
    new = torch.where(new > 0, new, 0.0)
    new = new / new.sum()
    return n, int(torch.multinomial(new, 1, generator=generator))


# Fixed target rows p (k + 1 = 4 rows over a 5-token vocabulary) and draft rows q, chosen so that
# every branch matters: accepted with certainty (p >= q), accepted with probability p/q < 1, a
# draft the target gives zero mass, and residuals that differ clearly from p.
TARGET = torch.tensor(
    [
        [0.10, 0.40, 0.20, 0.25, 0.05],
        [0.30, 0.05, 0.15, 0.10, 0.40],
        [0.05, 0.05, 0.60, 0.20, 0.10],
        [0.25, 0.25, 0.10, 0.30, 0.10],
    ]
)
DRAFT = torch.tensor(
    [
        [0.05, 0.15, 0.50, 0.20, 0.10],
        [0.10, 0.60, 0.10, 0.10, 0.10],
        [0.30, 0.10, 0.40, 0.10, 0.10],
    ]
)
DRAFT_TOKENS = [2, 4, 0]
NUM_DRAWS = 10000


def _draw(fn, draft_tokens, draft_probs, seed, n=NUM_DRAWS):
    generator = torch.Generator().manual_seed(seed)
    return Counter(fn(draft_tokens, draft_probs, TARGET, generator) for _ in range(n))


def _specdec(draft_tokens, draft_probs, target_probs, generator):
    result = rejection_sample(draft_tokens, draft_probs, target_probs, generator)
    return result.num_accepted, result.next_token


def _compare(ours: Counter, ref: Counter) -> tuple[float, float]:
    outcomes = sorted(set(ours) | set(ref))
    n_ours, n_ref = sum(ours.values()), sum(ref.values())
    tv = 0.5 * sum(abs(ours[o] / n_ours - ref[o] / n_ref) for o in outcomes)
    table = [[ours[o] for o in outcomes], [ref[o] for o in outcomes]]
    return tv, float(chi2_contingency(table).pvalue)


@pytest.mark.parametrize(
    ("draft_tokens", "one_hot"),
    [(DRAFT_TOKENS, False), ([3, 1, 2], False), (DRAFT_TOKENS, True), ([1, 1, 2], True)],
    ids=["probs", "probs-other-drafts", "one-hot", "one-hot-other-drafts"],
)
def test_rejection_sample_matches_reference(draft_tokens, one_hot):
    """specdec's rejection_sample gives the same distribution of (accepted count, next token) as
    the gpt-fast style reference, with draft probabilities and with one-hot drafts
    (``draft_probs=None``, compared with the reference given one-hot q): total-variation
    distance < 0.03 and a two-sample chi-square test that does not reject."""
    draft_probs = None if one_hot else DRAFT
    ref_q = torch.nn.functional.one_hot(torch.tensor(draft_tokens), 5).float() if one_hot else DRAFT
    ours = _draw(_specdec, draft_tokens, draft_probs, seed=1)
    ref = _draw(reference_speculative_decode, draft_tokens, ref_q, seed=2)
    assert len(ref) > 5, "the reference saw too few outcomes for the comparison to mean anything"
    tv, p_value = _compare(ours, ref)
    assert tv < 0.03, f"total variation {tv:.3f}"
    assert p_value > P_VALUE_FLOOR, f"two-sample chi-square p={p_value:.2e}"


def test_rejection_sample_first_token_follows_target():
    """With drafts themselves drawn from q, the first emitted token is distributed exactly as the
    target's first row p (the losslessness property), for sampled and one-hot drafts alike."""
    generator = torch.Generator().manual_seed(3)
    firsts: dict[str, Counter] = {"probs": Counter(), "one_hot": Counter()}
    for _ in range(NUM_DRAWS):
        drafts = [int(torch.multinomial(DRAFT[i], 1, generator=generator)) for i in range(3)]
        for kind, probs in (("probs", DRAFT), ("one_hot", None)):
            result = rejection_sample(drafts, probs, TARGET, generator)
            firsts[kind][(drafts[:result.num_accepted] + [result.next_token])[0]] += 1
    for kind, counts in firsts.items():
        observed = [counts[t] for t in range(5)]
        p_value = chisquare(observed, (TARGET[0] * NUM_DRAWS).tolist()).pvalue
        assert p_value > P_VALUE_FLOOR, f"{kind}: first token does not follow p (p={p_value:.2e})"


def test_comparison_detects_a_wrong_residual():
    """The distribution comparison above has power: against the reference, a rejection sampler
    that resamples from p instead of norm(max(p - q, 0)) after a rejection is caught far beyond
    the 0.03 total-variation bound."""

    def wrong(draft_tokens, draft_probs, target_probs, generator):
        k = len(draft_tokens)
        for i, tok in enumerate(draft_tokens):
            if torch.rand((), generator=generator) * draft_probs[i, tok] >= target_probs[i, tok]:
                return i, int(torch.multinomial(target_probs[i], 1, generator=generator))
        return k, int(torch.multinomial(target_probs[k], 1, generator=generator))

    ref = _draw(reference_speculative_decode, DRAFT_TOKENS, DRAFT, seed=1)
    bad = _draw(wrong, DRAFT_TOKENS, DRAFT, seed=2)
    tv, p_value = _compare(ref, bad)
    assert tv > 0.1 and p_value < 1e-6


def test_rejection_sample_edge_cases():
    """No drafts: the bonus token is drawn from p. A draft the target gives zero mass is always
    rejected; a one-hot draft equal to a one-hot target is always accepted; an empty residual
    (p == q) falls back to drawing from p."""
    generator = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.0, 1.0, 0.0]])
    assert rejection_sample([], None, p, generator) == VerifyResult(0, 1)
    target = torch.tensor([[0.0, 0.5, 0.5], [1.0, 0.0, 0.0]])
    for _ in range(50):
        result = rejection_sample([0], None, target, generator)
        assert result.num_accepted == 0 and result.next_token in (1, 2)
    sure = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    assert rejection_sample([2], None, sure, generator) == VerifyResult(1, 1)
    # A draft both p and q give zero mass is rejected; with p == q the residual is empty and
    # the replacement is drawn from p itself.
    same = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])
    for _ in range(20):
        result = rejection_sample([2], same[:1].clone(), same, generator)
        assert result.num_accepted == 0 and result.next_token in (0, 1)


# -- (b) greedy verification ----------------------------------------------------------------------


def _logits_with_argmax(argmaxes: list[int], vocab: int = 6) -> torch.Tensor:
    logits = torch.randn(len(argmaxes), vocab, generator=torch.Generator().manual_seed(len(argmaxes)))
    logits[torch.arange(len(argmaxes)), argmaxes] = 10.0
    return logits


@pytest.mark.parametrize(
    ("drafts", "argmaxes", "expected"),
    [
        ([3, 1, 4], [3, 1, 4, 5], VerifyResult(3, 5)),  # all accepted, bonus token
        ([3, 1, 4], [0, 1, 4, 5], VerifyResult(0, 0)),  # none accepted, the target's token instead
        ([3, 1, 4], [3, 2, 4, 5], VerifyResult(1, 2)),  # partial: stops at the first mismatch
        ([3, 1, 4], [3, 1, 0, 5], VerifyResult(2, 0)),
        ([], [2], VerifyResult(0, 2)),  # no drafts: plain decoding
    ],
)
def test_greedy_verify(drafts, argmaxes, expected):
    """greedy_verify keeps drafts while they equal the target's argmax and then emits the argmax
    after the last kept draft (drafts after a mismatch never count, even if they match)."""
    logits = _logits_with_argmax(argmaxes)
    result = greedy_verify(drafts, logits)
    assert result == expected
    assert result.emitted(DraftProposal(drafts)) == argmaxes[: expected.num_accepted + 1]
    # verify_one dispatches greedy params to greedy_verify.
    assert verify_one(DraftProposal(drafts), logits, SamplingParams(temperature=0), None) == expected


# -- (c) the conformance statistical check can fail -------------------------------------------------


class _FixedDrafter:
    """Always proposes the same tokens (trimmed to the step's budget)."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens

    def prepare_draft_tokens(self, requests, resource_manager):
        return [DraftProposal(self.tokens[: r.max_draft_len]) for r in requests]


class _AcceptEverythingVerifier:
    """A deliberately wrong verifier: keeps every draft and emits the target's argmax."""

    def __init__(self, drafter: _FixedDrafter) -> None:
        self.drafter = drafter

    @hookimpl
    def specdec_verify(self, config, requests, proposals, target_logits):
        if not (isinstance(config, UserProvidedDecodingConfig) and config.drafter is self.drafter):
            return None
        return [VerifyResult(len(p), int(logits[len(p)].argmax())) for p, logits in zip(proposals, target_logits)]


def _sample_joint(llm: LLM, prompt: list[int], params: SamplingParams, n: int) -> dict[tuple[int, ...], int]:
    observed: Counter = Counter()
    for seed in range(n):
        out = llm.generate({"prompt_token_ids": prompt}, params.model_copy(update={"seed": seed}))[0]
        observed[tuple(out.token_ids)] += 1
    return observed


def test_conformance_statistical_check_rejects_a_broken_verifier(tiny):
    """The conformance suite's chi-square check (exact_joint_distribution + chi_square_p_value)
    rejects an engine whose verifier accepts every draft, while the same check, same drafter and
    same seeds accept the core's correct verifier: the check has power, it is not vacuous."""
    prompt = tiny.encode("hello world, hello")
    params = SamplingParams(temperature=1.0, top_k=3, max_tokens=4, ignore_eos=True)
    n = 400
    expected = exact_joint_distribution(tiny.model, prompt, params, 4)
    assert sum(expected.values()) == pytest.approx(1.0, abs=1e-4)
    plain_greedy = LLM(tiny.model, None, tokenizer=tiny.tokenizer).generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=8))[0]
    drafter = _FixedDrafter(plain_greedy.token_ids[1:4])
    config = UserProvidedDecodingConfig(drafter=drafter, max_draft_len=3)

    with LLM(tiny.model, config, tokenizer=tiny.tokenizer) as llm:
        correct = _sample_joint(llm, prompt, params, n)
        metrics = llm.get_metrics()
    assert 0 < metrics.num_accepted_tokens < metrics.num_draft_tokens
    assert chi_square_p_value(correct, expected, n) > P_VALUE_FLOOR

    registry = get_registry()
    registry.register_plugin(_AcceptEverythingVerifier(drafter), name="accept-everything")
    try:
        with LLM(tiny.model, config, tokenizer=tiny.tokenizer) as llm:
            broken = _sample_joint(llm, prompt, params, n)
            metrics = llm.get_metrics()
    finally:
        registry.unregister_plugin("accept-everything")
    assert metrics.num_accepted_tokens == metrics.num_draft_tokens > 0, "the broken verifier was not used"
    p_value = chi_square_p_value(broken, expected, n)
    assert p_value < 1e-12, f"the check failed to reject a broken verifier (p={p_value:.2e})"


# -- (d) sampling transforms ----------------------------------------------------------------------


def test_top_k_keeps_exactly_k_tokens():
    """top_k keeps exactly the k most likely tokens, renormalized; the rest get probability 0."""
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    for k in (1, 2, 5, 49):
        probs = logits_to_probs(logits, SamplingParams(temperature=0.7, top_k=k))
        assert ((probs > 0).sum(-1) == k).all()
        kept = probs > 0
        assert torch.equal(kept, torch.zeros_like(kept).scatter(-1, logits.topk(k, -1).indices, True))
        assert torch.allclose(probs.sum(-1), torch.ones(3))
        full = torch.softmax(logits / 0.7, -1)
        expected = torch.where(kept, full, 0.0)
        assert torch.allclose(probs, expected / expected.sum(-1, keepdim=True), atol=1e-6)
    # top_k >= vocab (or 0) keeps everything.
    assert (logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=50)) > 0).all()
    assert (logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=0)) > 0).all()


@pytest.mark.parametrize("top_p", [0.1, 0.5, 0.65, 0.7, 0.9, 0.99])
def test_top_p_keeps_smallest_set_reaching_p(top_p):
    """top_p keeps the smallest set of most likely tokens whose mass reaches top_p."""
    base = torch.tensor([0.40, 0.25, 0.15, 0.10, 0.06, 0.04])
    logits = base.log()[torch.tensor([3, 0, 5, 1, 4, 2])]  # shuffled, so order is not assumed
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=top_p))
    order = torch.argsort(logits, descending=True)
    mass, size = 0.0, 0
    for p in logits.softmax(-1)[order].tolist():  # the reference: add tokens until mass >= top_p
        size += 1
        mass += p
        if mass >= top_p - 1e-6:
            break
    kept = set(order[:size].tolist())
    assert {i for i in range(6) if probs[i] > 0} == kept
    assert probs.sum().item() == pytest.approx(1.0)
    expected = logits.softmax(-1) * torch.tensor([i in kept for i in range(6)])
    assert torch.allclose(probs, expected / expected.sum(), atol=1e-6)


def test_temperature_zero_is_one_hot_argmax():
    """temperature 0 (greedy) gives a one-hot distribution on the argmax, per row."""
    logits = torch.randn(4, 20, generator=torch.Generator().manual_seed(1))
    probs = logits_to_probs(logits, SamplingParams(temperature=0.0, top_k=3, top_p=0.5))
    assert torch.equal(probs, torch.nn.functional.one_hot(logits.argmax(-1), 20).float())


def test_temperature_scales_logits():
    """A positive temperature divides the logits before the softmax."""
    logits = torch.tensor([1.0, 2.0, 3.0])
    for t in (0.5, 1.0, 2.0):
        assert torch.allclose(logits_to_probs(logits, SamplingParams(temperature=t)), torch.softmax(logits / t, -1))
    assert logits_to_probs(logits.half(), SamplingParams(temperature=1.0)).dtype == torch.float32
