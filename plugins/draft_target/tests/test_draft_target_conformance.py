"""The draft/target method passes the conformance suite with a smaller draft and with the target
itself as its own draft (where every greedy draft must be accepted)."""

from __future__ import annotations

import pytest

from specdec import LLM, SamplingParams
from specdec.testing.conformance import MethodConformance, fixed_draft_len
from specdec_draft_target import DraftTargetDecodingConfig
from specdec_draft_target.train import build_draft
from draft_target_helpers import save


class TestSmallDraftConformance(MethodConformance):
    def make_config(self, target, tmp_path):
        draft = save(build_draft(target.model, [0]), target.tokenizer, tmp_path / "draft")
        return DraftTargetDecodingConfig(max_draft_len=4, speculative_model=str(draft))


class TestDraftEqualsTargetConformance(MethodConformance):
    def make_config(self, target, tmp_path):
        draft = save(target.model, target.tokenizer, tmp_path / "draft")
        return {"decoding_type": "Draft_Target", "max_draft_len": 3, "speculative_model_dir": str(draft)}

    def test_every_greedy_draft_accepted(self, target, config, prompts: list[list[int]]) -> None:
        """The target drafting for itself agrees with itself: full acceptance, full drafts, also
        while requests of different lengths leave the batch and waiting ones join it (the draft
        cache's rows follow the batch)."""
        params = [SamplingParams(max_tokens=14 + 4 * i, ignore_eos=True) for i in range(len(prompts))]
        with LLM(target.model, fixed_draft_len(config), tokenizer=target.tokenizer, max_batch_size=3) as spec:
            spec.generate([{"prompt_token_ids": ids} for ids in prompts], params)
            m = spec.get_metrics()
        assert m.num_draft_tokens > 0
        assert m.num_accepted_tokens == m.num_draft_tokens
        assert m.mean_acceptance_length == pytest.approx(1 + 3)

    def test_sampled_output_follows_target_distribution(self, target, config, prompts) -> None:
        """Replaces the suite's chi-square test, which needs rejections to prove anything: with
        q equal to p, rejection sampling keeps (all but rounding-level) every draft. The
        small-draft class above runs the distribution test."""
        llm = LLM(target.model, fixed_draft_len(config), tokenizer=target.tokenizer)
        try:
            for seed in range(20):
                params = self.sampling.model_copy(update={"seed": seed, "max_tokens": 16, "ignore_eos": True})
                llm.generate({"prompt_token_ids": prompts[0]}, params)
            m = llm.get_metrics()
        finally:
            llm.close()
        assert m.num_draft_tokens > 0 and m.acceptance_rate > 0.99


class TestConfidenceStopConformance(MethodConformance):
    """Chains cut short by the draft's own confidence stay lossless, greedy and sampled. The tiny
    draft's probabilities lie around 0.06-0.09, so a threshold of 0.08 cuts chains at mixed lengths."""

    def make_config(self, target, tmp_path):
        draft = save(build_draft(target.model, [0]), target.tokenizer, tmp_path / "draft")
        return DraftTargetDecodingConfig(max_draft_len=4, speculative_model=str(draft), assistant_confidence_threshold=0.08)

    def test_threshold_shortens_chains(self, target, config, prompts: list[list[int]]) -> None:
        """Without a threshold every chain is full length; the higher the threshold, the shorter
        the chains, and each chain ends at its first low-confidence token, so greedy output is unchanged."""
        params = SamplingParams(max_tokens=24, ignore_eos=True)
        lengths, outputs = {}, {}
        for threshold in (0.0, 0.08, 0.99):
            cfg = fixed_draft_len(config.model_copy(update={"confidence_threshold": threshold}))
            with LLM(target.model, cfg, tokenizer=target.tokenizer, max_batch_size=3) as spec:
                out = spec.generate([{"prompt_token_ids": ids} for ids in prompts], params)
                m = spec.get_metrics()
            lengths[threshold] = m.num_draft_tokens / m.num_drafts
            outputs[threshold] = [o.token_ids for o in out]
        assert lengths[0.0] == pytest.approx(4, abs=0.3)
        assert lengths[0.0] > lengths[0.08] + 1 > lengths[0.99] + 1 >= 2
        assert outputs[0.0] == outputs[0.08] == outputs[0.99]


def pard_draft(target, path):
    """The target's first layer saved as a PARD draft: ``pard_token`` in its config.json, as
    AMD publishes them (``amd/PARD-*``); untrained for masks, so its later drafts are poor."""
    draft = build_draft(target.model, [0])
    draft.config.pard_token = 3
    draft.config.spd_type = "pard"
    return save(draft, target.tokenizer, path)


class TestParallelDraftingConformance(MethodConformance):
    """A PARD draft drafts every token of a step in one forward (on by default for a draft whose
    config names a ``pard_token``): greedy exact, sampled chi-square, batched, seeded."""

    def make_config(self, target, tmp_path):
        return DraftTargetDecodingConfig(max_draft_len=4, speculative_model=str(pard_draft(target, tmp_path / "draft")))

    def test_one_draft_forward_per_step(self, target, config, prompts: list[list[int]]) -> None:
        """Each drafting step runs the draft once, whatever the draft length: its new tokens
        then ``k - 1`` masks for ``k`` drafts. The masks never stay in its cache: the next step
        feeds the tokens the target emitted, and the output is plain decoding's."""
        from specdec_draft_target.drafter import DraftModel

        calls: list[list[list[int]]] = []
        with LLM(target.model, fixed_draft_len(config), tokenizer=target.tokenizer) as spec:
            drafter: DraftModel = spec.engine.resource_manager.drafter
            assert not spec.engine.policy.draft_cost_per_token  # one forward a step, whatever its length
            forward = drafter.runner.forward_rows
            drafter.runner.forward_rows = lambda cache, rows, *a: calls.append(rows) or forward(cache, rows, *a)
            spec.generate({"prompt_token_ids": prompts[0]}, SamplingParams(max_tokens=24, ignore_eos=True))
            m = spec.get_metrics()
        assert len(calls) == m.num_drafts > 0 and m.num_draft_tokens > 3 * m.num_drafts
        trailing = [next(i for i, t in enumerate(reversed(row)) if t != 3) for [row] in calls]
        assert sum(trailing) == m.num_draft_tokens - m.num_drafts
        assert all(len(row) - n <= 5 for [row], n in zip(calls, trailing))  # at most 4 accepted and the bonus

    def test_parallel_drafting_off_drafts_a_chain(self, target, config, prompts: list[list[int]]) -> None:
        """``parallel_drafting: false`` runs the same PARD draft autoregressively, with the same output."""
        params = SamplingParams(max_tokens=16, ignore_eos=True)
        outputs = []
        for parallel in (True, False):
            cfg = fixed_draft_len(config.model_copy(update={"parallel_drafting": parallel}))
            with LLM(target.model, cfg, tokenizer=target.tokenizer) as spec:
                outputs.append([o.token_ids for o in spec.generate([{"prompt_token_ids": ids} for ids in prompts], params)])
                assert (spec.engine.resource_manager.drafter.mask_token is not None) == parallel
        assert outputs[0] == outputs[1]


def test_parallel_drafting_needs_a_pard_draft(tiny, small_draft_dir) -> None:
    """Asking an ordinary draft to draft in parallel is a one-line error naming the field."""
    from specdec import ConfigError

    with pytest.raises(ConfigError, match="parallel_drafting: .*pard_token"):
        LLM(tiny.model, DraftTargetDecodingConfig(speculative_model=str(small_draft_dir), parallel_drafting=True),
            tokenizer=tiny.tokenizer)
