"""Typical acceptance follows Medusa's rule, is off by default, flagged as not lossless (its
sampled keeps counted as lossy-accepted), and keeps greedy requests exact."""

from __future__ import annotations

import logging

import pytest
import torch
from medusa_tiny import fitted_heads, save_fasterdecoding

from specdec import LLM, DraftProposal, Request, SamplingParams
from specdec.testing import make_tiny_target
from specdec_medusa import MedusaDecodingConfig
from specdec_medusa.typical import typical_verify

SAMPLED = SamplingParams(temperature=1.0, max_tokens=8)


def _request(params: SamplingParams) -> Request:
    return Request(0, [1, 2], 2, params)


def _logits(*rows: list[float]) -> torch.Tensor:
    """Logits whose softmax is exactly each row (given as probabilities)."""
    return torch.tensor(rows).log()


def test_rule_keeps_typical_tokens_and_the_longest_then_likeliest_path() -> None:
    # Row 0 (the root) is uniform over 4 tokens: H = ln 4, bound = min(0.09, 0.3 / 4) = 0.075.
    # A peaked row has a small entropy: its bound is the threshold, 0.09.
    root = [0.25, 0.25, 0.25, 0.25]
    peaked = [0.9, 0.08, 0.01, 0.01]
    last = [0.1, 0.1, 0.7, 0.1]
    # Nodes: 0 <- root (token 1), 1 <- 0 (token 0, p 0.9), 2 <- root (token 2), 3 <- 2 (token 1, p 0.08 < 0.09).
    proposal = DraftProposal([1, 0, 2, 1], parents=[-1, 0, -1, 2])
    logits = _logits(root, peaked, last, peaked, root)
    [result] = typical_verify([_request(SAMPLED)], [proposal], [logits], threshold=0.09, alpha=0.3)
    assert (result.num_accepted, result.accepted_nodes) == (2, [0, 1])
    assert result.num_lossy_accepted == 2  # a sampled request's typical keeps are all lossy
    assert result.next_token == 2  # the target's argmax after the kept path: the next step's greedy first token

    # Two kept paths of depth 2: the likelier one (0.25 * 0.9 over 0.25 * 0.6) wins.
    proposal = DraftProposal([1, 0, 2, 0], parents=[-1, 0, -1, 2])
    logits = _logits(root, [0.6, 0.3, 0.05, 0.05], last, peaked, last)
    [result] = typical_verify([_request(SAMPLED)], [proposal], [logits], threshold=0.09, alpha=0.3)
    assert result.accepted_nodes == [2, 3]


@pytest.mark.parametrize(
    ("threshold", "alpha", "kept"),
    # A flat target over 4 tokens: each has p = 0.25 and alpha * exp(-H) is alpha * 0.25 (plus Medusa's epsilon).
    [(1.0, 0.9, 1), (1.0, 1.0, 0), (0.2, 1.0, 1), (0.3, 1.1, 0)],
)
def test_bound_is_the_smaller_of_threshold_and_entropy_scaled_alpha(threshold: float, alpha: float, kept: int) -> None:
    flat = [0.25] * 4
    [result] = typical_verify([_request(SAMPLED)], [DraftProposal([3])], [_logits(flat, flat)], threshold, alpha)
    assert result.num_accepted == kept and result.accepted_nodes is None


def test_greedy_requests_match_exactly() -> None:
    """Temperature 0: a node is kept only when it is the target's argmax at its parent (lossless)."""
    logits = _logits([0.1, 0.6, 0.3], [0.3, 0.3, 0.4], [0.5, 0.2, 0.3], [0.2, 0.2, 0.6])
    proposal = DraftProposal([2, 1, 0], parents=[-1, -1, 1])
    [result] = typical_verify([_request(SamplingParams(max_tokens=4))], [proposal], [logits], threshold=1e-9, alpha=1e-9)
    assert (result.accepted_nodes, result.next_token, result.num_lossy_accepted) == ([1, 2], 2, 0)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    target = make_tiny_target(seed=0)
    directory = save_fasterdecoding(fitted_heads(target.model), tmp_path_factory.mktemp("heads"))
    return target, directory


def test_typical_mode_is_opt_in_flagged_and_runs(setup: tuple, caplog: pytest.LogCaptureFixture) -> None:
    target, directory = setup
    assert MedusaDecodingConfig(speculative_model=str(directory)).lossless
    config = MedusaDecodingConfig(speculative_model=str(directory), acceptance="typical", adaptive_draft_len=False)
    assert not config.lossless
    prompt = {"prompt_token_ids": target.encode("the cat sat on the mat. the cat")}
    plain = LLM(target.model, None, tokenizer=target.tokenizer)
    with caplog.at_level(logging.WARNING, logger="specdec_medusa"), LLM(target.model, config, tokenizer=target.tokenizer) as llm:
        assert "NOT distributed as the target's" in caplog.text
        greedy = SamplingParams(max_tokens=24, ignore_eos=True)
        exact = llm.generate(prompt, greedy)[0]
        assert exact.token_ids == plain.generate(prompt, greedy)[0].token_ids
        assert exact.metrics.num_lossy_accepted_tokens == 0
        torch.manual_seed(0)
        outputs = llm.generate([prompt] * 8, SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True))
    assert all(len(o.token_ids) == 16 for o in outputs)
    accepted = sum(o.metrics.num_accepted_tokens for o in outputs)
    assert accepted > 0 and sum(o.metrics.num_lossy_accepted_tokens for o in outputs) == accepted
