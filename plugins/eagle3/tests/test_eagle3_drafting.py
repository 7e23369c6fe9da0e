"""Drafting reads the right target layers, keeps the head cache in step, and matches the target's head."""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import pytest
import torch
from eagle3_tiny import fitted_head, head_config

from specdec import LLM, SamplingParams
from specdec.errors import SpecdecError
from specdec.prepacked_linear import PrepackedLinear
from specdec.testing import make_tiny_target, needs_prepacked_linears
from specdec.testing.conformance import setup_seconds_by_phase
from specdec.testing.recording import drafts_by_execution
from specdec_eagle3 import Eagle3Head, save_head
from specdec_eagle3.drafter import Eagle3Resources

PROMPTS = ("the cat sat on the mat. the cat", "hello world, hello", "one two three, one two")


@pytest.fixture(scope="module")
def target():
    return make_tiny_target(seed=0)


@pytest.fixture(scope="module")
def fitted_dir(target, tmp_path_factory) -> Path:
    return save_head(fitted_head(target.model, (0, 1)), tmp_path_factory.mktemp("fitted"), "speculators")


@pytest.fixture(scope="module")
def deep_fitted_dir(target, tmp_path_factory) -> Path:
    return save_head(fitted_head(target.model, (0, 1), num_layers=2), tmp_path_factory.mktemp("deep"), "speculators")


@pytest.fixture(scope="module")
def random_dir(target, tmp_path_factory) -> Path:
    """An untrained 3-layer head with no recorded layers (SafeAILab layout) for the 2-layer target."""
    torch.manual_seed(0)
    return save_head(Eagle3Head(head_config(target.model, None, draft_vocab_size=36)), tmp_path_factory.mktemp("random"))


def _recording(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[int], list[int], torch.Tensor | None]]:
    """Record (tokens so far, drafts, draft probs) of every proposal."""
    records = []
    original = Eagle3Resources.propose

    def propose(self, requests):
        drafted = original(self, requests)
        records.extend((list(r.token_ids), list(p.token_ids), p.probs) for r, p in zip(requests, drafted))
        return drafted

    monkeypatch.setattr(Eagle3Resources, "propose", propose)
    return records


@torch.no_grad()
def _drafts_from_scratch(manager: Eagle3Resources, model: torch.nn.Module, token_ids: list[int], k: int) -> list[int]:
    """The greedy chain recomputed without any cache: one target pass, then the head over all pairs."""
    head = manager.head
    hidden_states = [h[0] for h in model(torch.tensor([token_ids[:-1]]), output_hidden_states=True).hidden_states]
    embed = model.get_input_embeddings()
    embeds = embed(torch.tensor([token_ids[1:]]))
    inputs = head.fuse(manager.features(tuple(hidden_states))[None])
    drafts: list[int] = []
    for _ in range(k):
        out = head(embeds, inputs, torch.arange(embeds.shape[1])[None])
        token = int(manager.draft_ids[head.logits(out[0, -1]).argmax()])
        drafts.append(token)
        embeds = torch.cat([embeds, embed(torch.tensor([[token]]))], 1)
        inputs = torch.cat([inputs, out[:, -1:]], 1)
    return drafts


@pytest.mark.parametrize(("num_layers", "execution"), [(1, "eager"), (2, "eager"), (1, "static"), (2, "static")])
def test_cached_drafting_equals_recomputing_from_scratch(target, fitted_dir, deep_fitted_dir, monkeypatch, num_layers,
                                                         execution) -> None:
    """After any number of accepted drafts, every proposal equals a cache-free recomputation with the
    true target features: the catch-up, the chained steps and the rollback keep the head in step,
    with one decoder layer or two, for a request alone and for requests of different lengths
    drafted together (padded into one batch, catching up on different numbers of pairs). Where the
    target runs in fixed shapes (``static``, as CUDA graphs do), the catch-up and the chains run
    in the recorded loop over the static draft cache, to the same drafts."""
    fitted_dir = fitted_dir if num_layers == 1 else deep_fitted_dir
    records = _recording(monkeypatch)
    loops, steps = [], []
    original_loop, original_step = Eagle3Resources._chain_loop, Eagle3Resources._step_loop
    monkeypatch.setattr(Eagle3Resources, "_chain_loop", lambda self, *args: loops.append(args[0].shape[0]) or original_loop(self, *args))
    monkeypatch.setattr(Eagle3Resources, "_step_loop", lambda self, *args: steps.append(args[0].shape[0]) or original_step(self, *args))
    llm = LLM(target.model, {"method": "eagle3", "model": str(fitted_dir), "num_speculative_tokens": 3,
                             "adaptive_draft_len": False}, tokenizer=target.tokenizer, execution=execution)
    plain = LLM(target.model, None, tokenizer=target.tokenizer)
    manager = llm.engine.resource_manager
    prompts = [{"prompt_token_ids": target.encode(text)} for text in PROMPTS]
    expected = [out.token_ids for out in plain.generate(prompts, SamplingParams(max_tokens=24))]
    for prompt, want in zip(prompts, expected):
        assert llm.generate(prompt, SamplingParams(max_tokens=24))[0].token_ids == want
    rows = []
    manager.head.register_forward_hook(lambda head, args, out: rows.append(out.shape[0]))
    assert [out.token_ids for out in llm.generate(prompts, SamplingParams(max_tokens=24))] == expected
    assert llm.get_metrics().num_accepted_tokens > len(PROMPTS), "too few accepted drafts to test the catch-up"
    # Drafted together: the recorded loop pads the three rows to a batch bucket of four.
    assert max(rows) == (4 if execution == "static" else len(PROMPTS)), "the batch's requests were not drafted together"
    for tokens, drafts, probs in records:
        assert probs is None
        assert drafts == _drafts_from_scratch(manager, target.model, tokens, len(drafts))
    # Fixed shapes: the recorded loop drafted the chains (the batch's three requests padded to four
    # after the prompts' catch-up), and steady steps of several requests ran their catch-up on the
    # pairs the last step accepted in the same recorded call.
    assert (4 in loops and max(steps) > 1) if execution == "static" else not loops and not steps, (loops, steps)
    llm.close()
    assert not llm.engine.runner.hidden_layers


def test_sampled_drafts_carry_their_distribution(target, fitted_dir, monkeypatch) -> None:
    """A sampled draft returns q over the full target vocabulary: zero outside the draft vocabulary,
    shaped by the request's top-k, and the drafted token has positive mass."""
    records = _recording(monkeypatch)
    llm = LLM(target.model, {"method": "eagle3", "model": str(fitted_dir), "adaptive_draft_len": False},
              tokenizer=target.tokenizer)
    outside = ~llm.engine.resource_manager.head.t2d
    llm.generate({"prompt_token_ids": target.encode(PROMPTS[0])}, SamplingParams(temperature=0.8, top_k=5, max_tokens=12, seed=1))
    llm.close()
    records = [r for r in records if r[1]]
    assert records
    for _, drafts, probs in records:
        assert probs.shape == (len(drafts), target.model.config.vocab_size)
        assert torch.allclose(probs.sum(-1), torch.ones(len(drafts)))
        assert bool((probs[:, outside] == 0).all()) and bool(((probs > 0).sum(-1) <= 5).all())
        assert all(probs[i, t] > 0 for i, t in enumerate(drafts))


@needs_prepacked_linears
def test_bf16_head_multiplies_by_prepacked_weights(target, fitted_dir) -> None:
    """On CPU in bfloat16 the head's linear layers (fc, attention, MLP, lm_head) run prepacked,
    like the target's, and drafting with them still has drafts accepted."""
    model = copy.deepcopy(target.model).to(torch.bfloat16)
    llm = LLM(model, {"method": "eagle3", "model": str(fitted_dir), "num_speculative_tokens": 3,
                      "adaptive_draft_len": False}, tokenizer=target.tokenizer)
    linears = [m for m in llm.engine.resource_manager.head.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 9 and all(type(m) is PrepackedLinear for m in linears)
    llm.generate({"prompt_token_ids": target.encode(PROMPTS[0])}, SamplingParams(max_tokens=16))
    assert all(m._packed is not None for m in linears)
    assert llm.get_metrics().num_accepted_tokens > 0
    llm.close()


def test_default_layers_on_a_deep_target(tmp_path) -> None:
    """Without an option or a record, the head fuses the states entering layers 2, L//2 and L-3."""
    deep = make_tiny_target(seed=3, num_layers=8)
    torch.manual_seed(1)
    path = save_head(Eagle3Head(head_config(deep.model, None, draft_vocab_size=36)), tmp_path / "h")
    llm = LLM(deep.model, {"decoding_type": "Eagle3", "speculative_model": str(path), "max_draft_len": 2,
                           "adaptive_draft_len": False}, tokenizer=deep.tokenizer)
    plain = LLM(deep.model, None, tokenizer=deep.tokenizer)
    assert llm.engine.resource_manager.layers == (2, 4, 5)
    ids = deep.encode(PROMPTS[1])
    params = SamplingParams(max_tokens=16)
    assert llm.generate({"prompt_token_ids": ids}, params)[0].token_ids == plain.generate({"prompt_token_ids": ids}, params)[0].token_ids
    llm.close()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, r"default layers \{2, L//2, L-3\} need a target with at least 7 decoder layers, this one has 2"),
        ({"eagle3_layers_to_capture": [0, 1, 5]}, "layer 5 does not exist in a target with 2 decoder layers"),
        ({"eagle3_layers_to_capture": [0, 1]}, r"2 layers \[0, 1\] but the head's fc fuses 3"),
    ],
)
def test_layers_that_do_not_fit_the_target(target, random_dir, options, message) -> None:
    with pytest.raises(SpecdecError, match=message):
        LLM(target.model, {"method": "eagle3", "model": str(random_dir), **options}, tokenizer=target.tokenizer)


def test_head_for_another_target(tmp_path) -> None:
    """A head trained for a wider target, or another vocabulary, is refused when the LLM is built."""
    wide, narrow = make_tiny_target(seed=0, hidden=64), make_tiny_target(seed=0, hidden=32)
    path = save_head(Eagle3Head(head_config(wide.model, (0, 1), draft_vocab_size=36)), tmp_path / "wide")
    with pytest.raises(SpecdecError, match="fc reads target states of width 64, but the target's hidden_size is 32"):
        LLM(narrow.model, {"method": "eagle3", "model": str(path)}, tokenizer=narrow.tokenizer)
    config = head_config(wide.model, (0, 1), draft_vocab_size=36)
    config.llama.vocab_size = 50
    path = save_head(Eagle3Head(config), tmp_path / "vocab")
    with pytest.raises(SpecdecError, match="vocab_size 50 differs from the target's 36 tokens"):
        LLM(wide.model, {"method": "eagle3", "model": str(path)}, tokenizer=wide.tokenizer)


def test_taking_in_a_prompt_is_setup_and_a_steady_step_is_not(target, fitted_dir) -> None:
    """The head's pass over a new request's prompt is reported as setup (the policy charges it
    to resuming, not to each drafted token); a steady drafting step adds none; a request joining
    the running batch adds its own."""
    llm = LLM(target.model, {"method": "eagle3", "model": str(fitted_dir), "num_speculative_tokens": 3,
                             "adaptive_draft_len": False}, tokenizer=target.tokenizer)
    joined, steady, second = setup_seconds_by_phase(llm, target.encode(PROMPTS[0]), target.encode(PROMPTS[1]))
    llm.close()
    assert 0 < joined == steady < second


def test_a_greedy_chain_reads_the_device_once(target, fitted_dir, monkeypatch) -> None:
    """A greedy batch's chain keeps each depth's picks on the device and reads its drafts once at
    the end (on CUDA each read waits for the device; here the same calls are counted, but for the
    padding masks RaggedDraftBatch keeps on the host by design)."""
    reads: list[int] = []
    original = Eagle3Resources.propose

    def propose(self, requests):
        counted = {"n": 0}
        methods = {name: getattr(torch.Tensor, name) for name in ("tolist", "item", "__bool__", "__int__")}

        def count(name):
            def read(tensor, *args, **kwargs):
                if not sys._getframe(1).f_code.co_filename.endswith(os.path.join("specdec", "kv_cache.py")):
                    counted["n"] += 1
                return methods[name](tensor, *args, **kwargs)
            return read

        with monkeypatch.context() as patch:
            for name in methods:
                patch.setattr(torch.Tensor, name, count(name))
            drafted = original(self, requests)
        if any(len(p) for p in drafted):
            reads.append(counted["n"])
        return drafted

    monkeypatch.setattr(Eagle3Resources, "propose", propose)
    llm = LLM(target.model, {"method": "eagle3", "model": str(fitted_dir), "num_speculative_tokens": 4,
                             "adaptive_draft_len": False}, tokenizer=target.tokenizer)
    prompts = [{"prompt_token_ids": target.encode(text)} for text in PROMPTS]
    llm.generate(prompts, SamplingParams(max_tokens=16))
    llm.close()
    assert reads and set(reads) == {1}, reads


def test_recorded_drafting_drafts_as_the_static_loop(fitted_dir, device, monkeypatch) -> None:
    """Where the head's catch-up and chains are recorded (CUDA graphs on CUDA, the default there;
    emulated elsewhere) and replayed, every proposal and output equals the same loop run
    unrecorded (``static``, checked against recomputation above), for a batch of requests."""
    target = make_tiny_target(seed=0, device=device)
    config = {"method": "eagle3", "model": str(fitted_dir), "num_speculative_tokens": 3}
    runs = drafts_by_execution(target.model, config, target.tokenizer, Eagle3Resources, monkeypatch,
                               [{"prompt_token_ids": target.encode(text)} for text in PROMPTS])
    assert runs["cuda_graph"][2] > 0, "nothing was recorded"
    assert runs["cuda_graph"][:2] == runs["static"][:2]
