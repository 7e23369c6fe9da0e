"""Verification rules and sampling transforms, checked against independent references."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from scipy.stats import chi2_contingency, chisquare

from specdec import (
    LLM,
    DraftProposal,
    Request,
    RequestFailedError,
    SamplingParams,
    UserProvidedDecodingConfig,
    VerifyResult,
    hookimpl,
    kernels,
    logits_to_probs,
)
from specdec.errors import VerifyInputError
from specdec.plugins import get_registry
from specdec.sampling import PositionNoise, greedy_tokens
from specdec.testing.conformance import P_VALUE_FLOOR, chi_square_p_value, exact_joint_distribution
from specdec.verify import target_picks, verify_requests

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


def _exponential(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    return torch.rand(shape, generator=generator).neg_().log1p_().neg_()


def rejection_sample(draft_tokens, draft_probs, target_probs, generator) -> VerifyResult:
    """specdec's rejection sampling for one request (a batch of 1)."""
    return _rejection_batch([draft_tokens], draft_probs, target_probs, generator)[0]


def _rejection_batch(drafts: list[list[int]], draft_probs, target_probs, generator) -> list[VerifyResult]:
    """specdec's rejection sampling for one request per row of ``drafts`` (all of length k, same
    ``q`` and ``p``), verified as one batch with fresh random numbers per row."""
    n, k, vocab = len(drafts), len(drafts[0]), target_probs.shape[-1]
    q = draft_probs.expand(n, k, vocab) if draft_probs is not None else None
    out = kernels.rejection_accept(
        torch.tensor(drafts, dtype=torch.long).view(n, k), torch.full((n,), k), q, target_probs.expand(n, k + 1, vocab),
        torch.rand(n, k, generator=generator), _exponential((n, vocab), generator),
    )
    next_tokens = out.output_ids.gather(1, out.num_accepted[:, None])[:, 0]
    return [VerifyResult(a, t) for a, t in zip(out.num_accepted.tolist(), next_tokens.tolist())]


def _specdec_draws(draft_tokens, draft_probs, seed, n=NUM_DRAWS) -> Counter:
    generator = torch.Generator().manual_seed(seed)
    return Counter((r.num_accepted, r.next_token) for r in _rejection_batch([draft_tokens] * n, draft_probs, TARGET, generator))


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
    """specdec's rejection sampling gives the same distribution of (accepted count, next token) as
    the gpt-fast style reference, with draft probabilities and with one-hot drafts
    (``draft_probs=None``, compared with the reference given one-hot q): total-variation
    distance < 0.03 and a two-sample chi-square test that does not reject."""
    draft_probs = None if one_hot else DRAFT
    ref_q = torch.nn.functional.one_hot(torch.tensor(draft_tokens), 5).float() if one_hot else DRAFT
    ours = _specdec_draws(draft_tokens, draft_probs, seed=1)
    ref = _draw(reference_speculative_decode, draft_tokens, ref_q, seed=2)
    assert len(ref) > 5, "the reference saw too few outcomes for the comparison to mean anything"
    tv, p_value = _compare(ours, ref)
    assert tv < 0.03, f"total variation {tv:.3f}"
    assert p_value > P_VALUE_FLOOR, f"two-sample chi-square p={p_value:.2e}"


def test_rejection_sample_first_token_follows_target():
    """With drafts themselves drawn from q, the first emitted token is distributed exactly as the
    target's first row p (the losslessness property), for sampled and one-hot drafts alike."""
    generator = torch.Generator().manual_seed(3)
    drafts = torch.stack([torch.multinomial(DRAFT[i], NUM_DRAWS, replacement=True, generator=generator) for i in range(3)], 1)
    for kind, probs in (("probs", DRAFT), ("one_hot", None)):
        results = _rejection_batch(drafts.tolist(), probs, TARGET, generator)
        counts = Counter((row[: r.num_accepted] + [r.next_token])[0] for row, r in zip(drafts.tolist(), results))
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
    """Greedy verification keeps drafts while they equal the target's argmax and then emits the
    argmax after the last kept draft (drafts after a mismatch never count, even if they match)."""
    logits = _logits_with_argmax(argmaxes)
    result = verify_requests([_request(0, SamplingParams(temperature=0))], [DraftProposal(drafts)], [logits])[0]
    assert result == expected
    assert result.emitted(DraftProposal(drafts)) == argmaxes[: expected.num_accepted + 1]


# -- (b2) a batch of requests ---------------------------------------------------------------------


def _request(request_id: int, params: SamplingParams, seed: int | None = None, vocab: int = 9) -> Request:
    noise = PositionNoise(seed, vocab) if seed is not None else None
    return Request(request_id, [1, 2, 3], 3, params, noise)


def _mixed_step(seed_offset: int = 0):
    """Six requests of one step: greedy and sampled, with and without draft probs, with
    different params, draft lengths (0 to 4) and their own seeds."""
    g = torch.Generator().manual_seed(11)
    vocab = 9
    specs = [  # (params, number of drafts, draft probs given)
        (SamplingParams(temperature=0), 3, False),
        (SamplingParams(temperature=1.0, top_k=4), 4, True),
        (SamplingParams(temperature=0.7), 2, False),
        (SamplingParams(temperature=0), 0, False),
        (SamplingParams(temperature=1.3, top_p=0.8), 0, True),
        (SamplingParams(temperature=1.0), 3, True),
    ]
    requests, proposals, logits = [], [], []
    for i, (params, k, with_probs) in enumerate(specs):
        requests.append(_request(i, params, None if params.greedy else 100 + i + seed_offset))
        row_logits = torch.randn(k + 1, vocab, generator=g) * 2
        drafts = row_logits[:k].argmax(-1).tolist()  # likely drafts, so some are kept
        probs = logits_to_probs(torch.randn(k, vocab, generator=g), params) if with_probs else None
        proposals.append(DraftProposal(drafts, probs))
        logits.append(row_logits)
    return requests, proposals, logits


def test_batched_verify_equals_each_request_alone():
    """Verifying a mixed batch gives every request exactly the result it gets alone: each request
    uses its own params and draws from its own seeded generator, whatever else is in the batch."""
    requests, proposals, logits = _mixed_step()
    together = verify_requests(requests, proposals, logits)
    requests, proposals, logits = _mixed_step()
    alone = [verify_requests([r], [p], [lg])[0] for r, p, lg in zip(requests, proposals, logits)]
    assert together == alone
    assert together[0] == VerifyResult(3, int(logits[0][3].argmax()))  # greedy drafts were the argmax
    requests, proposals, logits = _mixed_step(seed_offset=1)
    assert verify_requests(requests, proposals, logits) != together, "other seeds should change a sampled result"


def test_verify_rejects_draft_probs_of_the_wrong_shape():
    """A proposal whose probs do not cover its drafts over the vocabulary is a one-line error."""
    request = _request(0, SamplingParams(temperature=1.0), seed=None)  # unseeded: rejection sampling reads the probs
    with pytest.raises(VerifyInputError, match=r"DraftProposal.probs: expected shape \[2, 5\] for 2 drafts, got \[1, 5\]"):
        verify_requests([request], [DraftProposal([1, 2], torch.full((1, 5), 0.2))], [torch.zeros(3, 5)])


def test_a_seeded_tree_keeps_the_path_of_the_targets_own_draws():
    """For a seeded request each forward row's pick is the race with the noise of the position it
    predicts (its depth in the tree), so a tree keeps exactly the path plain seeded decoding
    would have drawn, and the token after it."""
    request = _request(0, SamplingParams(temperature=1.0, seed=5), seed=5)
    logits = torch.randn(5, 9, generator=torch.Generator().manual_seed(0))
    # Rows: root, then nodes 0 and 1 (children of the root) and 2 and 3 (children of node 0).
    picks = target_picks(request, logits, depths=[0, 1, 1, 2, 2]).tolist()
    nodes = [picks[0], (picks[0] + 1) % 9, (picks[1] + 1) % 9, picks[1]]
    proposal = DraftProposal(nodes, parents=[-1, -1, 0, 0])
    assert verify_requests([request], [proposal], [logits]) == [VerifyResult(2, picks[4], [0, 3])]
    # The pick after a depth-2 node is the noise of position L + 2, as for a chain's third row.
    chain = target_picks(request, logits[[0, 1, 4]])
    assert chain.tolist() == [picks[0], picks[1], picks[4]]


def test_a_sampled_tree_of_deterministic_drafts_follows_the_target():
    """Multi-candidate rejection sampling over a tree without draft probs (unseeded sampling):
    the first token follows the root's row and, after a kept child, the second token that
    child's row, for a tree with several children per node, a duplicate child and a child the
    target gives no mass. Checked by chi-square against the exact joint distribution, and the
    same check catches a verifier that keeps the first child the target allows."""
    vocab = 5
    rows = torch.tensor([
        [0.30, 0.25, 0.00, 0.40, 0.05],  # root: children 1, 1 (duplicate), 2 (no mass), 3
        [0.10, 0.20, 0.30, 0.15, 0.25],  # node 0 (token 1): children 4, 0
        [0.20, 0.20, 0.20, 0.20, 0.20],  # node 1 (duplicate of node 0, never kept)
        [0.20, 0.20, 0.20, 0.20, 0.20],  # node 2 (token 2)
        [0.50, 0.10, 0.10, 0.20, 0.10],  # node 3 (token 3): leaf, its row gives the bonus token
        [0.25, 0.25, 0.25, 0.25, 0.00],  # node 4 (token 4, child of node 0)
        [0.40, 0.30, 0.10, 0.10, 0.10],  # node 5 (token 0, child of node 0)
    ])
    proposal = DraftProposal([1, 1, 2, 3, 4, 0], parents=[-1, -1, -1, -1, 0, 0])
    row_of = {1: 1, 3: 4}  # a first token that is a child's: the row its second token is drawn from
    expected = {}
    for first in range(vocab):
        if first in row_of:
            for second in range(vocab):
                expected[(first, second)] = float(rows[0, first] * rows[row_of[first], second])
        else:
            expected[(first,)] = float(rows[0, first])
    request = _request(0, SamplingParams(temperature=1.0), vocab=vocab)
    logits = rows.clamp_min(1e-30).log()

    def draws(verify) -> Counter:
        torch.manual_seed(0)
        observed = Counter()
        for _ in range(4000):
            result = verify(request, proposal, logits)
            observed[tuple(result.emitted(proposal)[:2])] += 1
        return observed

    def ours(request, proposal, logits):
        return verify_requests([request], [proposal], [logits])[0]

    def first_allowed(request, proposal, logits):  # wrong: no probabilistic rejection
        node = next(i for i, (t, p) in enumerate(zip(proposal.token_ids, proposal.parents)) if p == -1 and rows[0, t] > 0)
        return VerifyResult(1, int(torch.multinomial(rows[node + 1], 1)), [node])

    categories = sorted(c for c in expected if expected[c] > 0)
    total = sum(expected[c] for c in categories)
    for verify, lossless in ((ours, True), (first_allowed, False)):
        observed = draws(verify)
        assert set(observed) <= set(categories)
        counts = [observed[c] for c in categories]
        p_value = chisquare(counts, [expected[c] / total * sum(counts) for c in categories]).pvalue
        assert (p_value > P_VALUE_FLOOR) == lossless, (verify.__name__, p_value)


def test_a_sampled_tree_with_draft_probs_is_refused():
    """Multi-candidate rejection sampling here is for deterministic drafts; a tree whose drafts
    carry a distribution, for an unseeded sampled request, is a one-line error."""
    request = _request(0, SamplingParams(temperature=1.0), vocab=5)
    proposal = DraftProposal([1, 2], torch.full((2, 5), 0.2), parents=[-1, -1])
    with pytest.raises(VerifyInputError, match="trees with draft probs for greedy or seeded requests only"):
        verify_requests([request], [proposal], [torch.zeros(3, 5)])


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


class _LossyVerifier:
    """Keeps every draft and reports ``lossy(n)`` of the ``n`` kept as lossy-accepted."""

    def __init__(self, drafter: _FixedDrafter, lossy) -> None:
        self.drafter, self.lossy = drafter, lossy

    @hookimpl
    def specdec_verify(self, config, requests, proposals, target_logits):
        if not (isinstance(config, UserProvidedDecodingConfig) and config.drafter is self.drafter):
            return None
        return [VerifyResult(len(p), int(lg[len(p)].argmax()), num_lossy_accepted=self.lossy(len(p)))
                for p, lg in zip(proposals, target_logits)]


@pytest.mark.parametrize("valid", [True, False])
def test_engine_counts_lossy_acceptances_and_refuses_impossible_counts(tiny, valid: bool):
    """A verifier's ``num_lossy_accepted`` goes into the request's ``num_lossy_accepted_tokens``;
    a count above the kept drafts fails the request, naming the count."""
    drafter = _FixedDrafter([5, 6, 7])
    config = UserProvidedDecodingConfig(drafter=drafter, max_draft_len=3, adaptive_draft_len=False)
    registry = get_registry()
    registry.register_plugin(_LossyVerifier(drafter, (lambda n: n) if valid else (lambda n: n + 1)), name="lossy")
    prompt, params = {"prompt_token_ids": [3, 4]}, SamplingParams(max_tokens=8, ignore_eos=True)
    try:
        with LLM(tiny.model, config, tokenizer=tiny.tokenizer) as llm:
            if valid:
                metrics = llm.generate(prompt, params)[0].metrics
                assert metrics.num_lossy_accepted_tokens == metrics.num_accepted_tokens > 0
            else:
                with pytest.raises(RequestFailedError, match="3 of 3 drafts .*4 of them lossy-accepted"):
                    llm.generate(prompt, params)
    finally:
        registry.unregister_plugin("lossy")


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


@pytest.mark.parametrize("min_p", [0.05, 0.3, 1.0])
def test_min_p_keeps_tokens_at_least_min_p_times_the_likeliest(min_p):
    """min_p (vLLM's and transformers' definition) keeps the tokens whose probability after
    temperature is at least ``min_p`` times the likeliest token's, renormalized; transformers'
    MinPLogitsWarper keeps the same ones."""
    from transformers import MinPLogitsWarper

    logits = torch.randn(4, 40, generator=torch.Generator().manual_seed(3)) * 3
    probs = logits_to_probs(logits, SamplingParams(temperature=0.8, min_p=min_p))
    full = torch.softmax(logits / 0.8, -1)
    kept = full >= min_p * full.max(-1, keepdim=True).values
    assert torch.equal(probs > 0, kept)
    assert torch.allclose(probs, torch.where(kept, full, 0.0) / torch.where(kept, full, 0.0).sum(-1, keepdim=True), atol=1e-6)
    hf = MinPLogitsWarper(min_p, min_tokens_to_keep=1)(None, logits / 0.8)
    assert torch.equal(hf > float("-inf"), kept)


def test_min_p_applies_before_top_p_as_in_vllm():
    """With min_p and top_p, top_p's mass is counted over the tokens min_p kept (vLLM's order)."""
    logits = torch.tensor([0.50, 0.30, 0.12, 0.05, 0.03]).log()
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, min_p=0.2, top_p=0.8))
    # min_p keeps 0.50, 0.30, 0.12 (>= 0.1); renormalized 0.54, 0.33, 0.13: top_p 0.8 then keeps two.
    assert (probs > 0).tolist() == [True, True, False, False, False]


def test_temperature_zero_is_one_hot_argmax():
    """temperature 0 (greedy) gives a one-hot distribution on the argmax, per row."""
    logits = torch.randn(4, 20, generator=torch.Generator().manual_seed(1))
    probs = logits_to_probs(logits, SamplingParams(temperature=0.0, top_k=3, top_p=0.5))
    assert torch.equal(probs, torch.nn.functional.one_hot(logits.argmax(-1), 20).float())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_tokens_break_ties_as_argmax_does(dtype):
    """The greedy token is argmax's, including its first maximum on ties (bf16 logits tie often)."""
    logits = torch.randint(0, 4, (64, 300), generator=torch.Generator().manual_seed(2)).to(dtype)
    assert torch.equal(greedy_tokens(logits), logits.argmax(-1))
    assert int(greedy_tokens(logits[0])) == int(logits[0].argmax())


def test_temperature_scales_logits():
    """A positive temperature divides the logits before the softmax."""
    logits = torch.tensor([1.0, 2.0, 3.0])
    for t in (0.5, 1.0, 2.0):
        assert torch.allclose(logits_to_probs(logits, SamplingParams(temperature=t)), torch.softmax(logits / t, -1))
    assert logits_to_probs(logits.half(), SamplingParams(temperature=1.0)).dtype == torch.float32
