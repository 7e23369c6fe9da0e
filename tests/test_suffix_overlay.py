"""Suffix drafts over a method (``use_sa_spec``) keep sampled output on the target's distribution,
as min_p does (its test is here for the drafter these tests share)."""

from __future__ import annotations

from specdec import SamplingParams, UserProvidedDecodingConfig
from specdec.suffix import SuffixDrafts
from specdec.testing.conformance import P_VALUE_FLOOR, MethodConformance, chi_square_p_value, exact_joint_distribution


class Repeating:
    """A drafter that drafts its request's last token again: sometimes right, mostly not."""

    def prepare_draft_tokens(self, requests, resource_manager):
        return [[r.token_ids[-1]] * r.max_draft_len for r in requests]


def test_sampled_output_with_suffix_drafts_follows_target_distribution(tiny, monkeypatch):
    """With suffix drafts taking the steps whose match is long and the method the others, in the
    default configuration (adaptive length, no seed), sampled output follows the target
    (chi-square over the first tokens; a one-token match is enough here, as a random tiny
    model samples few long ones)."""
    suite = MethodConformance()
    found = []
    propose = SuffixDrafts.propose
    monkeypatch.setattr(SuffixDrafts, "propose", lambda self, *a: found.extend(propose(self, *a)) or found[-len(a[0]):])
    prompt = tiny.encode("the cat sat on the mat. the cat sat on the mat. the cat")
    config = UserProvidedDecodingConfig(drafter=Repeating(), max_draft_len=3, use_sa_spec=True, sa_spec_threshold=1)
    observed, _ = suite._sampled_outcomes_that_verify(tiny, config, prompt)
    expected = exact_joint_distribution(tiny.model, prompt, suite.sampling, suite.sample_length)
    p_value = chi_square_p_value(observed, expected, suite.num_samples)
    assert p_value > P_VALUE_FLOOR, f"sampled outputs do not follow the target (p={p_value:.2e})"
    suffix = sum(p is not None for p in found)
    assert 0 < suffix < len(found), f"{suffix} of {len(found)} rows had suffix drafts: the test needs both kinds"


def test_min_p_sampling_follows_the_target(tiny):
    """Sampled speculation with min_p (and top_k, to keep the outcomes countable) draws from the
    target's min_p distribution: drafter and verifier shape their distributions with the one
    transform (chi-square over the first tokens, default configuration)."""
    suite = MethodConformance()
    suite.sampling = SamplingParams(temperature=1.0, top_k=4, min_p=0.6, max_tokens=4)
    prompt = tiny.encode("the cat sat on the mat. the cat sat on the mat. the cat")
    config = UserProvidedDecodingConfig(drafter=Repeating(), max_draft_len=3)
    observed, _ = suite._sampled_outcomes_that_verify(tiny, config, prompt)
    expected = exact_joint_distribution(tiny.model, prompt, suite.sampling, suite.sample_length)
    with_top_k_only = exact_joint_distribution(tiny.model, prompt, suite.sampling.model_copy(update={"min_p": 0.0}),
                                               suite.sample_length)
    assert len(expected) < len(with_top_k_only), "min_p dropped no outcome: the test would prove nothing"
    p_value = chi_square_p_value(observed, expected, suite.num_samples)
    assert p_value > P_VALUE_FLOOR, f"sampled outputs do not follow the target (p={p_value:.2e})"
