"""Suffix drafts over a method (``use_sa_spec``) keep sampled output on the target's distribution."""

from __future__ import annotations

from specdec import UserProvidedDecodingConfig
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
