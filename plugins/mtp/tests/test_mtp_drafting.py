"""MTP drafting with per-depth caches equals DeepSeek's definition computed from scratch.

Each step, depth ``k`` over every position (no cache) reads depth ``k - 1``'s outputs (the
target's final states for ``k = 1``) and the tokens ``k`` ahead, the drafts included; its last
position's argmax is draft ``k``. The drafter computes the same with caches that catch up on
accepted tokens and roll drafted positions back, for a batch of requests at different lengths
in one forward per depth.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from mtp_tiny import load_target, run_layer, saved_target
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding

from specdec import LLM, SamplingParams
from specdec.testing.conformance import fixed_draft_len, recorded_proposals, setup_seconds_by_phase
from specdec.testing.recording import drafts_by_execution
from specdec_mtp import MTPLayer, load_mtp_layers
from specdec_mtp.drafter import MTPResources


@pytest.fixture(scope="module")
def saved() -> tuple[torch.nn.Module, list[MTPLayer], object]:
    """The fitted one-layer target (drafts get accepted), and its layer as the checkpoint holds it."""
    target = load_target(1, "cpu")
    return target.model, load_mtp_layers(saved_target(1), target.model.config, 1), target.tokenizer


@torch.no_grad()
def reference_drafts(model: torch.nn.Module, layers: list[MTPLayer], token_ids: list[int], length: int) -> list[int]:
    """Greedy drafts computed from scratch; depths past the loaded layers reuse the last one."""
    tokens = list(token_ids)
    known = len(tokens)
    previous = model(torch.tensor([tokens[:-1]]), output_hidden_states=True).hidden_states[-1]
    embed, rotary = model.get_input_embeddings(), DeepseekV3RotaryEmbedding(model.config)
    for k in range(1, length + 1):
        layer = layers[min(k, len(layers)) - 1]
        previous = run_layer(layer, embed, rotary, previous, torch.tensor([tokens[k : known - 1 + k]]))
        tokens.append(int(layer.logits(previous[0, -1]).argmax()))
    return tokens[known:]


@pytest.mark.parametrize("execution", ["eager", "static"])
def test_cached_drafts_equal_drafts_from_scratch(saved, monkeypatch: pytest.MonkeyPatch, execution: str) -> None:
    """Where the target runs in fixed shapes (``static``, as CUDA graphs do), a steady batch
    drafts every depth in one call of the recorded loop over the static draft cache (its two
    requests padded to a batch bucket of two), to the same drafts, and keeps the caches in step."""
    model, layers, tokenizer = saved
    recorded = recorded_proposals(monkeypatch, MTPResources)
    loops: list[int] = []
    original_loop = MTPResources._chain_loop
    monkeypatch.setattr(MTPResources, "_chain_loop", lambda self, ints, *args: loops.append(ints.shape[0]) or original_loop(self, ints, *args))
    llm = LLM(model, fixed_draft_len({"decoding_type": "MTP", "max_draft_len": 3}), tokenizer=tokenizer, execution=execution)
    prompts = [{"prompt_token_ids": [5, 9, 13, 22, 5, 9]}, {"prompt_token_ids": [7, 8]}]
    llm.generate(prompts, SamplingParams(max_tokens=20))
    llm.close()
    seen = [(token_ids, list(p.token_ids)) for token_ids, p in recorded]
    assert len(seen) > 10
    steps = [(a, b) for (a, _), (b, _) in zip(seen, seen[1:]) if b[: len(a)] == a]
    assert any(len(b) - len(a) >= 2 for a, b in steps), "no step accepted a draft"
    for token_ids, drafts in seen:
        assert drafts == reference_drafts(model, layers, token_ids, len(drafts)), token_ids
    # Past the prompts' catch-up the steps drafted in fixed shapes, the two requests together
    # until one of them finished.
    assert (loops.count(2) >= 2 and len(loops) >= 8) if execution == "static" else not loops, loops


def test_chains_of_changing_lengths_in_fixed_shapes_equal_drafts_from_scratch(saved, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chains whose lengths change from step to step, as the adaptive policy's do, leave their
    deeper depths behind: in fixed shapes a row stopping short of a depth is padding there, and a
    step where a depth lags too far drafts eagerly. Every draft still equals the one computed
    from scratch, and steps of several requests ran in fixed shapes."""
    model, layers, tokenizer = saved
    recorded = recorded_proposals(monkeypatch, MTPResources)
    propose, loop = MTPResources.propose, MTPResources._chain_loop
    budgets, loops = itertools.cycle([3, 1, 2, 3, 3, 2]), []

    def changing(self, requests):
        for request in requests:
            request.max_draft_len = min(request.max_draft_len, next(budgets))
        return propose(self, requests)

    monkeypatch.setattr(MTPResources, "propose", changing)
    monkeypatch.setattr(MTPResources, "_chain_loop", lambda self, ints, *args: loops.append(ints.shape[0]) or loop(self, ints, *args))
    llm = LLM(model, fixed_draft_len({"decoding_type": "MTP", "max_draft_len": 3}), tokenizer=tokenizer, execution="static")
    prompts = [{"prompt_token_ids": [5, 9, 13, 22, 5, 9]}, {"prompt_token_ids": [7, 8, 9, 10]}, {"prompt_token_ids": [3, 4]}]
    llm.generate(prompts, SamplingParams(max_tokens=40))
    llm.close()
    assert {len(p) for _, p in recorded} >= {1, 2, 3}
    for token_ids, proposal in recorded:
        assert list(proposal.token_ids) == reference_drafts(model, layers, token_ids, len(proposal)), token_ids
    assert max(loops) > 1, loops


def test_a_steady_batch_drafts_each_depth_in_one_forward(saved, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two requests drafting 3 tokens each, both caught up, take 3 layer forwards a step, not 6
    (a request far behind, as at its prompt, runs alone first)."""
    model, _, tokenizer = saved
    forwards = [0]
    layer_forward = MTPLayer.forward

    def counted(self, *args, **kwargs):
        forwards[0] += 1
        return layer_forward(self, *args, **kwargs)

    per_step: list[tuple[int, int]] = []
    propose = MTPResources.propose

    def recording(self, requests):
        forwards[0] = 0
        proposals = propose(self, requests)
        per_step.append((sum(len(p) > 0 for p in proposals), forwards[0]))
        return proposals

    monkeypatch.setattr(MTPLayer, "forward", counted)
    monkeypatch.setattr(MTPResources, "propose", recording)
    llm = LLM(model, fixed_draft_len({"decoding_type": "MTP", "max_draft_len": 3}), tokenizer=tokenizer)
    llm.generate([{"prompt_token_ids": [5, 9, 13, 22, 5, 9, 13, 22, 5]}, {"prompt_token_ids": [7, 8, 9, 10, 11, 12, 13, 14]}],
                 SamplingParams(max_tokens=12, ignore_eos=True))
    llm.close()
    assert per_step[0] == (2, 6)  # the prompts: each request, far behind, catches up alone at every depth
    assert (2, 3) in per_step[1:]


def test_taking_in_a_prompt_is_setup_and_a_steady_step_is_not(saved) -> None:
    """The depths' pass over a new request's prompt is reported as setup (the policy charges it to
    resuming, not to each drafted token); a steady drafting step adds none; a request joining the
    running batch adds its own."""
    model, _, tokenizer = saved
    llm = LLM(model, fixed_draft_len({"decoding_type": "MTP", "max_draft_len": 3}), tokenizer=tokenizer)
    joined, steady, second = setup_seconds_by_phase(llm, [5, 9, 13, 22, 5, 9, 13, 22, 5, 9], [7, 8, 9, 10, 11, 12, 13, 14, 15])
    llm.close()
    assert 0 < joined == steady < second


@pytest.mark.parametrize(("kept", "execution"), [(24, "eager"), (36, "eager"), (36, "static")])
def test_draft_vocabulary_drafts_the_full_layers_choice_among_kept_tokens(saved, tmp_path, monkeypatch, kept: int,
                                                                         execution: str) -> None:
    """With ``draft_vocab_size``, every greedy draft is a kept token and every sampled draft's
    distribution is zero off the kept tokens; keeping every token drafts exactly what the full
    projection does (the trimmed rows map back to the right ids), in fixed shapes too."""
    from specdec.draft_vocab import kept_tokens, load_ranking
    from specdec.testing.tiny import shuffled_ranking

    model, _, tokenizer = saved
    vocab = model.config.vocab_size
    ranking = shuffled_ranking(vocab, tmp_path / "ranking.safetensors")
    allowed = set(kept_tokens(load_ranking(ranking, vocab), kept, "test").tolist())
    recorded = recorded_proposals(monkeypatch, MTPResources)
    prompts = [{"prompt_token_ids": [5, 9, 13, 22, 5, 9]}, {"prompt_token_ids": [7, 8]}]
    outputs = {}
    for options in ({}, {"draft_vocab": str(ranking), "draft_vocab_size": kept}):
        recorded.clear()
        llm = LLM(model, fixed_draft_len({"decoding_type": "MTP", "max_draft_len": 3, **options}), tokenizer=tokenizer,
                  execution=execution)
        llm.generate(prompts, SamplingParams(max_tokens=16))
        outputs[bool(options)] = [p.token_ids for _, p in recorded]
        llm.generate(prompts, SamplingParams(max_tokens=8, temperature=1.0))
        llm.close()
    assert all(t in allowed for drafts in outputs[True] for t in drafts)
    sampled = [p for _, p in recorded if p.probs is not None]
    assert sampled and all(float(p.probs[:, sorted(set(range(vocab)) - allowed)].sum()) == 0 for p in sampled)
    assert all(torch.allclose(p.probs.sum(-1), torch.ones(len(p.probs))) for p in sampled)
    if kept == vocab:
        assert outputs[True] == outputs[False]


def test_a_step_in_fixed_shapes_reads_the_device_once(saved, monkeypatch: pytest.MonkeyPatch) -> None:
    """Drafting in fixed shapes keeps each depth's picks on the device, feeding the next depth,
    and reads the batch's drafts once (the eager depths read once per depth; on CUDA each read
    waits for the device, here the same calls are counted)."""
    model, _, tokenizer = saved
    steps: list[tuple[bool, int]] = []
    propose, loop = MTPResources.propose, MTPResources._chain_loop
    looped = [False]
    monkeypatch.setattr(MTPResources, "_chain_loop", lambda self, *args: looped.__setitem__(0, True) or loop(self, *args))

    def counted(self, requests):
        reads, looped[0] = [0], False
        with monkeypatch.context() as patch:
            for name in ("tolist", "item", "__bool__", "__int__"):
                original = getattr(torch.Tensor, name)
                patch.setattr(torch.Tensor, name, lambda t, *a, _o=original, **k: reads.__setitem__(0, reads[0] + 1) or _o(t, *a, **k))
            proposals = propose(self, requests)
        steps.append((looped[0], reads[0]))
        return proposals

    monkeypatch.setattr(MTPResources, "propose", counted)
    llm = LLM(model, fixed_draft_len({"decoding_type": "MTP", "max_draft_len": 3}), tokenizer=tokenizer, execution="static")
    llm.generate([{"prompt_token_ids": [5, 9, 13, 22, 5, 9]}, {"prompt_token_ids": [7, 8, 9, 10]}], SamplingParams(max_tokens=16))
    llm.close()
    assert {reads for recorded, reads in steps if recorded} == {1}, steps
    assert {reads for recorded, reads in steps if not recorded} == {3}, steps  # the first steps: eager, 3 depths


def test_recorded_drafting_drafts_as_the_static_loop(device, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a steady batch's depths are recorded as one graph (a CUDA graph on CUDA, the default
    there; its emulation elsewhere) and replayed, every proposal and output equals the same loop
    run unrecorded (``static``, checked against recomputation above)."""
    target = load_target(1, device, "llama")  # DeepSeek-V3's expert blocks cannot be recorded: they draft eagerly
    runs = drafts_by_execution(target.model, {"decoding_type": "MTP", "max_draft_len": 3}, target.tokenizer, MTPResources,
                               monkeypatch, [{"prompt_token_ids": [5, 9, 13, 22, 5, 9]}, {"prompt_token_ids": [7, 8, 9, 10]}])
    assert runs["cuda_graph"][2] > 0, "nothing was recorded"
    assert runs["cuda_graph"][:2] == runs["static"][:2]
