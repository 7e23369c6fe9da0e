"""The engine loop and the model runner: stop conditions, budgets, prompts, KV cache, features."""

from __future__ import annotations

import pytest
import torch
from specdec_ngram import NGramDecodingConfig

from specdec import LLM, ConfigError, DraftProposal, PluginError, SamplingParams, UserProvidedDecodingConfig
from specdec.runner import ModelRunner
from specdec.testing.conformance import fixed_draft_len
from specdec.testing import PadDrafter, make_tiny_target, prefilled_batch, tiny_tokenizer

PROMPT_TEXTS = ("hello world, hello", "abc abd abe ab", "one two three, one two")


class OracleDrafter:
    """Drafts the known continuation ``full[len(context):]``, ``n`` tokens at a time, ignoring the
    engine's per-step budget on purpose (the engine must trim the proposal)."""

    def __init__(self, full: list[int], n: int = 10, vocab: int | None = None) -> None:
        self.full, self.n, self.vocab = full, n, vocab

    def prepare_draft_tokens(self, requests, resource_manager):
        proposals = []
        for request in requests:
            tokens = self.full[len(request.token_ids) : len(request.token_ids) + self.n]
            probs = None
            if self.vocab is not None and tokens:
                probs = torch.full((len(tokens), self.vocab), 0.2 / (self.vocab - 1))
                probs[torch.arange(len(tokens)), tokens] = 0.8
            proposals.append(DraftProposal(tokens, probs))
        return proposals


@pytest.fixture(scope="module")
def plain(tiny):
    return LLM(tiny.model, None, tokenizer=tiny.tokenizer)


@pytest.fixture(scope="module")
def ngram(tiny):
    llm = LLM(tiny.model, NGramDecodingConfig(max_draft_len=6), tokenizer=tiny.tokenizer)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def repeating_prompts(tiny, plain):
    """Prompt ids whose greedy continuation repeats earlier text, so n-gram drafts are accepted,
    with their plain greedy output (48 tokens, no stop)."""
    out = []
    for text in PROMPT_TEXTS:
        ids = tiny.encode(text)
        cont = plain.generate({"prompt_token_ids": ids}, SamplingParams(max_tokens=12))[0].token_ids
        prompt = ids + cont + ids
        out.append((prompt, plain.generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=48))[0]))
    return out


def _oracle(tiny, prompt, output, **kw) -> LLM:
    drafter = OracleDrafter(prompt + output.token_ids, **kw)
    # Fixed draft length: these tests count on all 8 drafts being verified every step.
    config = UserProvidedDecodingConfig(drafter=drafter, max_draft_len=8, adaptive_draft_len=False)
    return LLM(tiny.model, config, tokenizer=tiny.tokenizer)


# -- plain decoding is right to begin with -----------------------------------------------------------


def test_plain_greedy_matches_transformers_generate(tiny, plain):
    """specdec's plain greedy loop (prefill, KV cache, one token per step) produces exactly the
    tokens of transformers' own ``generate(do_sample=False)``."""
    for text in PROMPT_TEXTS:
        ids = tiny.encode(text)
        ours = plain.generate({"prompt_token_ids": ids}, SamplingParams(max_tokens=20, ignore_eos=True))[0]
        with torch.inference_mode():
            ref = tiny.model.generate(
                torch.tensor([ids], device=tiny.model.device), max_new_tokens=20, min_new_tokens=20, do_sample=False,
                pad_token_id=0,
            )[0, len(ids) :].tolist()
        assert ours.token_ids == ref


# -- stop strings -----------------------------------------------------------------------------------


def test_stop_string_ends_generation_and_is_excluded(tiny, plain, ngram, repeating_prompts):
    """A stop string ends generation at the token completing it and is cut from ``text``; plain,
    n-gram and an always-right drafter (stop met inside a run of accepted drafts) agree."""
    checked = inside_drafts = 0
    for prompt, free in repeating_prompts:
        full_text = free.text
        assert len(full_text) == len(free.token_ids)  # char-level: one character per token
        # Stops whose first occurrence ends at position `at` (shortest such substring).
        stops = []
        for at in range(3, 38):
            for size in range(1, 5):
                stop = full_text[at - size + 1 : at + 1]
                if len(stop) == size and full_text.find(stop) == at - size + 1:
                    stops.append((at, stop))
                    break
        for at, stop in sorted({stops[0], stops[len(stops) // 2], stops[-1]}):
            params = SamplingParams(max_tokens=48, stop=[stop])
            oracle = _oracle(tiny, prompt, free)
            outputs = {name: llm.generate({"prompt_token_ids": prompt}, params)[0] for name, llm in (("plain", plain), ("ngram", ngram), ("oracle", oracle))}
            for name, out in outputs.items():
                assert out.finish_reason == "stop", name
                assert out.text == full_text[: at + 1 - len(stop)], (name, stop)
                assert stop not in out.text
                assert out.token_ids == free.token_ids[: at + 1], name
            # The oracle's 8 drafts per step are all accepted (9 tokens per step after the
            # prefill token), so unless `at` is a multiple of 9 the stop fell inside the drafts.
            m = outputs["oracle"].metrics
            assert m.num_accepted_tokens == m.num_draft_tokens == 8 * m.num_steps
            assert m.num_steps == -(-at // 9)
            inside_drafts += at % 9 != 0
            oracle.close()
            checked += 1
    assert checked >= 7 and inside_drafts >= 5


def test_first_of_several_stop_strings_wins(plain, ngram, repeating_prompts):
    """With several stop strings, output ends at whichever completes first; the text is cut
    before the earliest one."""
    prompt, free = repeating_prompts[1]
    late, early = free.text[26:29], free.text[2:5]
    assert 0 < free.text.find(early) < free.text.find(late)
    params = SamplingParams(max_tokens=48, stop=[late, early])
    for llm in (plain, ngram):
        out = llm.generate({"prompt_token_ids": prompt}, params)[0]
        assert out.finish_reason == "stop"
        assert out.text == free.text[: free.text.find(early)]


def test_stop_string_only_in_prompt_does_not_stop(plain, ngram, tiny):
    """Stop strings are matched in the output only, not in the prompt."""
    prompt = {"prompt_token_ids": tiny.encode("hello world, hello")}
    for llm in (plain, ngram):
        out = llm.generate(prompt, SamplingParams(max_tokens=12, stop=["hello", "ello"]))[0]
        assert out.finish_reason == "length" and len(out.token_ids) == 12


# -- max_tokens -----------------------------------------------------------------------------------


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5, 8, 9, 13])
def test_max_tokens_exact_when_drafts_would_overshoot(tiny, plain, ngram, repeating_prompts, max_tokens):
    """``max_tokens`` is honoured exactly even when the drafter proposes more tokens than remain
    (the drafter here ignores its budget; n-gram drafts up to 6): output is the first
    ``max_tokens`` plain tokens, finish reason ``length``."""
    prompt, free = repeating_prompts[1]
    params = SamplingParams(max_tokens=max_tokens)
    with _oracle(tiny, prompt, free) as oracle:
        for llm in (plain, ngram, oracle):
            out = llm.generate({"prompt_token_ids": prompt}, params)[0]
            assert out.token_ids == free.token_ids[:max_tokens]
            assert out.finish_reason == "length"
            assert out.metrics.num_output_tokens == max_tokens


def test_max_tokens_exact_with_sampling_and_draft_probs(tiny, repeating_prompts):
    """Sampling with an over-long proposal carrying probabilities: the engine trims tokens and
    probs together and output length is exactly ``max_tokens``."""
    prompt, free = repeating_prompts[2]
    vocab = tiny.model.config.vocab_size
    with _oracle(tiny, prompt, free, vocab=vocab) as oracle:
        for max_tokens in (1, 2, 4, 7, 10):
            for seed in range(3):
                params = SamplingParams(temperature=0.8, max_tokens=max_tokens, seed=seed, ignore_eos=True)
                out = oracle.generate({"prompt_token_ids": prompt}, params)[0]
                assert len(out.token_ids) == max_tokens and out.finish_reason == "length"
        assert oracle.get_metrics().num_draft_tokens > 0


# -- EOS --------------------------------------------------------------------------------------------


def test_eos_inside_accepted_drafts_stops(repeating_prompts):
    """An EOS token met inside a run of accepted drafts ends the output right there (finish
    reason ``stop``), as in plain decoding; ``ignore_eos`` goes on past it."""
    target = make_tiny_target(seed=0)  # its own copy: the generation config is changed below
    prompt, free = repeating_prompts[0]
    tokens = free.token_ids
    pos = next(i for i in range(6, len(tokens)) if tokens[i] not in tokens[:i])
    eos = tokens[pos]
    target.model.generation_config.eos_token_id = [2, eos]
    plain = LLM(target.model, None, tokenizer=target.tokenizer)
    ngram = LLM(target.model, {"method": "ngram", "max_draft_len": 6}, tokenizer=target.tokenizer)
    oracle = _oracle(target, prompt, free)
    stopped = {}
    for name, llm in (("plain", plain), ("ngram", ngram), ("oracle", oracle)):
        out = stopped[name] = llm.generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=48))[0]
        assert out.token_ids == tokens[: pos + 1], name
        assert out.finish_reason == "stop"
        on = llm.generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=48, ignore_eos=True))[0]
        assert on.token_ids == tokens and on.finish_reason == "length", name
    # The oracle's 8 drafts per step are all kept (9 tokens a step after the prefill token):
    # EOS at output index `pos` fell inside a run of accepted drafts, not on a bonus token.
    assert pos % 9 != 0
    m = stopped["oracle"].metrics
    assert m.num_accepted_tokens == m.num_draft_tokens and m.num_steps == -(-pos // 9) >= 2
    oracle.close()
    ngram.close()


# -- prompts ----------------------------------------------------------------------------------------


def test_chat_prompts_use_the_chat_template(tiny, plain):
    """``chat=True`` and ``LLM.chat`` encode through the tokenizer's chat template, equal to
    ``apply_chat_template(..., add_generation_prompt=True)`` and to the rendered text."""
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    expected = tiny.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(expected, "keys"):
        expected = expected["input_ids"]
    assert list(expected) == tiny.encode("system: be brief\nuser: hi there\nassistant: ")
    assert plain.encode(messages) == list(expected)
    assert plain.encode("hi there", chat=True) == tiny.encode("user: hi there\nassistant: ")
    assert plain.encode("hi there") == tiny.encode("hi there")

    params = SamplingParams(max_tokens=6)
    by_chat = plain.chat(messages, params)[0]
    assert by_chat.prompt_token_ids == list(expected)
    assert plain.generate(messages, params)[0].token_ids == by_chat.token_ids
    assert plain.generate({"prompt_token_ids": list(expected)}, params)[0].token_ids == by_chat.token_ids
    # A list of conversations gives one output per conversation, in order.
    two = plain.chat([messages, [{"role": "user", "content": "hi there"}]], params)
    assert [o.prompt_token_ids for o in two] == [list(expected), plain.encode("hi there", chat=True)]
    assert plain.generate("hi there", params, chat=True)[0].token_ids == two[1].token_ids


def test_chat_without_template_is_a_config_error(tiny):
    """A tokenizer without a chat template gives a ConfigError for chat prompts."""
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = None
    llm = LLM(tiny.model, None, tokenizer=tokenizer)
    with pytest.raises(ConfigError, match="no chat template"):
        llm.generate("hi", chat=True)
    assert llm.generate("hi", SamplingParams(max_tokens=2))[0].token_ids


def test_prompt_token_ids(tiny, plain):
    """``{"prompt_token_ids": [...]}`` prompts give the same output as the equivalent text;
    a batch keeps order; malformed dicts are a ConfigError; no tokenizer is needed."""
    params = SamplingParams(max_tokens=10)
    ids = tiny.encode("abc abd abe ab")
    by_ids = plain.generate({"prompt_token_ids": ids}, params)[0]
    by_text = plain.generate("abc abd abe ab", params)[0]
    assert by_ids.prompt_token_ids == ids and by_ids.token_ids == by_text.token_ids and by_ids.text == by_text.text
    batch = plain.generate([{"prompt_token_ids": ids}, "hello", {"prompt_token_ids": tiny.encode("hello")}], params)
    assert batch[0].token_ids == by_ids.token_ids and batch[1].token_ids == batch[2].token_ids
    assert [o.request_id for o in batch] == sorted(o.request_id for o in batch)
    for bad in ({"prompt": "x"}, {"prompt_token_ids": ["a"]}, {"prompt_token_ids": 5}):
        with pytest.raises(ConfigError, match="prompt_token_ids"):
            plain.generate(bad, params)
    bare = LLM(tiny.model, None)
    out = bare.generate({"prompt_token_ids": ids}, params)[0]
    assert out.token_ids == by_ids.token_ids and out.text == ""
    with pytest.raises(ConfigError, match="need a tokenizer"):
        bare.generate("abc", params)


# -- the model runner -------------------------------------------------------------------------------


def test_runner_captures_hidden_states(tiny):
    """Asked for every layer, the runner returns num_layers + 1 hidden states, each ``[n, hidden]``,
    equal to the model's own; the last is the final normed state (lm_head of it gives the
    logits); a cached decode step returns the new positions' states only."""
    model = tiny.model
    num_layers, hidden = model.config.num_hidden_layers, model.config.hidden_size
    runner = ModelRunner(model, hidden_layers=range(num_layers + 1))
    ids = tiny.encode("hello world")
    cache = runner.new_cache()
    out = runner.forward(cache, ids[:-3])
    step = runner.forward(cache, ids[-3:])
    with torch.inference_mode():
        ref = model(torch.tensor([ids], device=model.device), output_hidden_states=True)
    assert out.hidden_states.count == step.hidden_states.count == num_layers + 1 == len(ref.hidden_states)
    assert out.hidden_states.kept == tuple(range(num_layers + 1))
    for i in range(num_layers + 1):
        h = out.hidden_states[i]
        assert h.shape == (len(ids) - 3, hidden)
        assert step.hidden_states[i].shape == (3, hidden)
        assert torch.allclose(h, ref.hidden_states[i][0, :-3], atol=1e-5)
        assert torch.allclose(step.hidden_states[i], ref.hidden_states[i][0, -3:], atol=1e-4)
    with torch.inference_mode():
        assert torch.allclose(model.lm_head(out.hidden_states[-1]), out.logits, atol=1e-4)
    assert out.logits.shape == (len(ids) - 3, model.config.vocab_size) and out.logits.dtype == torch.float32
    assert ModelRunner(model).forward(ModelRunner(model).new_cache(), ids).hidden_states is None


def test_runner_keeps_only_the_hidden_states_asked_for(tiny):
    """A method reading the final state (``-1``) and layer 1 gets those two, in batches too, and a
    clear error naming what was kept for any other layer; an index past the model's is refused."""
    model = tiny.model
    runner = ModelRunner(model, hidden_layers=(-1, 1))
    count = model.config.num_hidden_layers + 1
    assert runner.hidden_layers == (1, count - 1)
    rows = runner.forward_rows(prefilled_batch(runner, [tiny.encode("hello"), tiny.encode("a longer prompt")]), [[5, 6], [7]])
    full = ModelRunner(model, hidden_layers=range(count)).forward(runner.new_cache(), tiny.encode("a longer prompt") + [7])
    last = rows[1].hidden_states
    assert last.kept == (1, count - 1) and last[-1].shape == last[count - 1].shape == (1, model.config.hidden_size)
    torch.testing.assert_close(last[-1], full.hidden_states[-1][-1:], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(last[1], full.hidden_states[1][-1:], atol=1e-4, rtol=1e-4)
    with pytest.raises(KeyError, match=r"hidden state 0 was not kept \(kept: \[1, %d\]\)" % (count - 1)):
        last[0]
    with pytest.raises(ValueError, match="hidden_layers"):
        runner.hidden_layers = (count,)


def test_runner_rollback_then_forward_matches_fresh_forward(tiny):
    """Forwarding drafts, rolling back the rejected ones and forwarding again leaves the cache
    at the right length, and the logits equal a fresh forward over the kept sequence (fp32)."""
    runner = ModelRunner(tiny.model)
    prompt = tiny.encode("the cat sat")
    drafts = tiny.encode("on a")  # 4 tokens, 2 kept
    more = tiny.encode("mat.")
    cache = runner.new_cache()
    prefill = runner.forward(cache, prompt, last_only=True)
    assert prefill.logits.shape == (1, tiny.model.config.vocab_size)
    runner.forward(cache, drafts)
    assert runner.cache_length(cache) == len(prompt) + 4
    runner.rollback(cache, 2)
    assert runner.cache_length(cache) == len(prompt) + 2
    runner.rollback(cache, 0)  # no-op
    assert runner.cache_length(cache) == len(prompt) + 2
    after = runner.forward(cache, more)
    assert runner.cache_length(cache) == len(prompt) + 2 + len(more)

    fresh_cache = runner.new_cache()
    fresh = runner.forward(fresh_cache, prompt + drafts[:2] + more)
    assert torch.allclose(after.logits, fresh.logits[-len(more) :], atol=1e-4)
    assert torch.allclose(prefill.logits[0], fresh.logits[len(prompt) - 1], atol=1e-4)
    # Without the rollback the logits differ: the check can tell.
    wrong_cache = runner.new_cache()
    runner.forward(wrong_cache, prompt + drafts)
    assert not torch.allclose(runner.forward(wrong_cache, more).logits, fresh.logits[-len(more) :], atol=1e-4)


def test_empty_or_oversized_prompt_is_a_clear_error(tiny, plain):
    """An empty prompt, or one longer than the model's context, is refused naming the prompt."""
    with pytest.raises(ConfigError, match="prompt: empty"):
        plain.generate({"prompt_token_ids": []})
    with pytest.raises(ConfigError, match="do not fit the model's context"):
        plain.generate({"prompt_token_ids": [5] * (plain.runner.max_length + 1)})


class _BadDrafter:
    def __init__(self, token: int) -> None:
        self.token = token

    def prepare_draft_tokens(self, requests, resource_manager):
        return [[self.token] for _ in requests]


def test_out_of_vocabulary_drafts_are_a_plugin_error(tiny):
    """A drafter proposing a token id outside the vocabulary is stopped with a PluginError that
    names the method, not an IndexError from inside the model."""
    config = UserProvidedDecodingConfig(drafter=_BadDrafter(10_000), max_draft_len=2)
    with LLM(tiny.model, config, tokenizer=tiny.tokenizer) as llm:
        with pytest.raises(PluginError, match="user_provided.*outside"):
            llm.generate("hello", SamplingParams(max_tokens=4))
    with pytest.raises(ConfigError, match="prompt: token ids"):
        LLM(tiny.model, None, tokenizer=tiny.tokenizer).generate({"prompt_token_ids": [10_000]})


@pytest.mark.parametrize("config", [
    {"method": "suffix"},
    {"method": "ngram", "is_public_pool": True},
    "suffix drafts over a method",
], ids=["suffix", "ngram-public-pool", "use_sa_spec"])
def test_forget_finished_drops_what_drafters_remember_of_earlier_requests(tiny, config):
    """A prompt sent again is drafted from its own earlier answer (more accepted), until the
    engine forgets its finished requests: then the repeat drafts exactly as the first run did,
    and the output never changes. (The bench forgets before each repeat of a turn.)"""
    if config == "suffix drafts over a method":
        config = UserProvidedDecodingConfig(drafter=PadDrafter(), max_draft_len=2, use_sa_spec=True)
    prompt = {"prompt_token_ids": tiny.encode("the quick brown fox")}
    params = SamplingParams(max_tokens=48, ignore_eos=True)
    with LLM(tiny.model, fixed_draft_len(config), tokenizer=tiny.tokenizer) as llm:
        first, again = (llm.generate(prompt, params)[0] for _ in range(2))
        llm.engine.forget_finished()
        forgotten = llm.generate(prompt, params)[0]
    assert first.token_ids == again.token_ids == forgotten.token_ids
    assert again.metrics.num_accepted_tokens > first.metrics.num_accepted_tokens
    assert (forgotten.metrics.num_drafts, forgotten.metrics.num_accepted_tokens) == (
        first.metrics.num_drafts, first.metrics.num_accepted_tokens)
