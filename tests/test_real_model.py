"""Focused checks on the embedded default model (SmolLM2-135M-Instruct), float32.

These prove the product claim on a real model: n-gram speculation leaves greedy output unchanged
on Spec-Bench prompts while actually accepting drafts, and sampled output follows the target.
"""

from __future__ import annotations

import pytest

from specdec import LLM, SamplingParams
from specdec.bench.dataset import load_questions
from specdec.testing.conformance import P_VALUE_FLOOR
from specdec.testing.real_model import plain, sampled_distribution_p_value  # noqa: F401 (plain: a fixture)

pytestmark = pytest.mark.real_model

# Fixed draft length: the adaptive policy decides from this machine's measured forward costs, and
# where it rightly skips drafting (float32 on a CPU often makes it) nothing would be verified.
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "adaptive_draft_len": False}


@pytest.fixture(scope="module")
def ngram(plain: LLM) -> LLM:
    llm = LLM(plain.model, NGRAM, tokenizer=plain.tokenizer)
    yield llm
    llm.close()


@pytest.mark.parametrize("params", [SamplingParams(max_tokens=64), SamplingParams(temperature=0.7, seed=3, max_tokens=64)],
                         ids=["greedy", "seeded"])
def test_ngram_is_lossless_on_spec_bench(plain: LLM, ngram: LLM, params: SamplingParams) -> None:
    """On Spec-Bench summarization, rag and coding prompts, n-gram output equals plain output,
    greedy and sampled with a seed."""
    questions = load_questions("spec_bench", ["summarization", "rag", "coding"], per_category=1)
    accepted = 0
    for q in questions:
        expected = plain.generate(q.turns[0], params, chat=True)[0]
        got = ngram.generate(q.turns[0], params, chat=True)[0]
        assert got.token_ids == expected.token_ids, q.question_id
        assert got.text == expected.text
        accepted += got.metrics.num_accepted_tokens
    assert accepted > 0


def test_ngram_sampling_follows_target_on_real_model(plain: LLM) -> None:
    """Unseeded sampled n-gram output on SmolLM2 (rejection sampling) matches the exact joint
    distribution of 3 tokens (top-k 2). Seeded output equals plain seeded decoding (above)."""
    prompt = "Count: one two three, one two three, one two three, one two"
    p_value, accepted = sampled_distribution_p_value(plain, NGRAM, prompt)
    assert accepted > 0
    assert p_value > P_VALUE_FLOOR


def test_batched_ngram_greedy_is_lossless(plain: LLM, ngram: LLM) -> None:
    """Four Spec-Bench prompts decoded together (ragged acceptance, different prompt lengths)
    each give exactly their own plain greedy output."""
    questions = load_questions("spec_bench", ["summarization", "rag", "coding", "writing"], per_category=1)
    prompts = [q.turns[0] for q in questions]
    params = [SamplingParams(max_tokens=n) for n in (48, 40, 56, 32)]
    expected = [plain.generate(p, sp, chat=True)[0].token_ids for p, sp in zip(prompts, params)]
    outputs = ngram.generate(prompts, params, chat=True)
    assert [o.token_ids for o in outputs] == expected
    assert sum(o.metrics.num_accepted_tokens for o in outputs) > 0


#: Chat prompts whose replies quote them, so suffix matches come long.
QUOTING = ["Repeat this line exactly: the quick brown fox jumps over the lazy dog, then the dog sleeps.",
           "Copy this list: apples, pears, plums, cherries, grapes, lemons, limes, figs, dates, kiwis."]


@pytest.mark.parametrize("method", ["eagle3", "mtp", "medusa", "draft_target"])
def test_suffix_drafts_over_each_learned_method_are_lossless(plain: LLM, method: str) -> None:
    """``use_sa_spec`` over each shipped drafter: on replies that quote their prompt, long matches
    take suffix drafts and the rest the method's, and greedy output, alone and batched, is plain
    decoding's token for token."""
    params = SamplingParams(max_tokens=32)
    expected = [plain.generate(p, params, chat=True)[0].token_ids for p in QUOTING]
    config = {"method": method, "use_sa_spec": True, "num_speculative_tokens": 3, "adaptive_draft_len": False}
    with LLM(plain.model, config, tokenizer=plain.tokenizer) as llm:
        alone = [llm.generate(p, params, chat=True)[0] for p in QUOTING]
        batched = llm.generate(QUOTING, params, chat=True)
        taken = llm.engine.suffix_drafts.taken
    assert [o.token_ids for o in alone] == expected
    assert [o.token_ids for o in batched] == expected
    drafts = sum(o.metrics.num_drafts for o in [*alone, *batched])
    assert 0 < taken < drafts, f"{taken} suffix drafts in {drafts} drafting steps: both kinds are needed"


PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
EXTRACT = "Extract the person as JSON with name and age: Maria Lopez is 34 and lives in Madrid."
WEATHER = {"type": "function", "function": {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}}, "required": ["city"],
                   "additionalProperties": False}}}


@pytest.mark.parametrize("method", ["ngram", "eagle3"])
def test_structured_output_and_tool_calls_are_lossless(plain: LLM, method: str) -> None:
    """Under a JSON schema and under a named or required tool call, greedy speculative output on
    SmolLM2 is plain constrained decoding's, token for token, and parses as the schema asks."""
    import json

    from specdec import StructuredOutputsParams

    schema = SamplingParams(max_tokens=48, structured_outputs=StructuredOutputsParams(json=PERSON))
    messages = [{"role": "user", "content": EXTRACT}]
    weather = [{"role": "user", "content": "What is the weather in Madrid?"}]
    config = {"method": method, "num_speculative_tokens": 3, "adaptive_draft_len": False}
    with LLM(plain.model, config, tokenizer=plain.tokenizer) as llm:
        expected, got = plain.chat(messages, schema)[0], llm.chat(messages, schema)[0]
        assert got.token_ids == expected.token_ids
        if got.finish_reason == "stop":
            assert set(json.loads(got.text)) == {"name", "age"}
        for choice in ({"type": "function", "function": {"name": "get_weather"}}, "required"):
            want = plain.chat(weather, SamplingParams(max_tokens=48), tools=[WEATHER], tool_choice=choice)[0]
            call = llm.chat(weather, SamplingParams(max_tokens=48), tools=[WEATHER], tool_choice=choice)[0]
            assert call.token_ids == want.token_ids and call.tool_calls[0].name == "get_weather"
            assert "city" in json.loads(call.tool_calls[0].arguments)
        accepted = got.metrics.num_accepted_tokens + call.metrics.num_accepted_tokens
    assert accepted > 0


@pytest.mark.parametrize("method", ["eagle3", "mtp"])
def test_an_agent_loop_turn_prefills_from_the_cache_and_is_lossless(plain: LLM, method: str) -> None:
    """A conversation's second turn sends the first turn's prompt again: its whole blocks come
    from the prefix cache, keys, values and the hidden states the drafter reads, and both turns'
    greedy output is plain decoding's token for token."""
    article = load_questions("spec_bench", ["summarization"], per_category=1)[0].turns[0]
    first = [{"role": "user", "content": article}]
    params = SamplingParams(max_tokens=24)
    config = {"method": method, "num_speculative_tokens": 3, "adaptive_draft_len": False}
    with LLM(plain.model, config, tokenizer=plain.tokenizer) as llm:
        replies = []
        for turn in range(2):
            messages = first if turn == 0 else [*first, {"role": "assistant", "content": replies[0][1].text},
                                                {"role": "user", "content": "Now give it a title."}]
            replies.append((plain.chat(messages, params)[0], llm.chat(messages, params)[0]))
    (want_first, got_first), (want_second, got_second) = replies
    assert got_first.token_ids == want_first.token_ids and got_second.token_ids == want_second.token_ids
    assert got_first.metrics.num_cached_tokens == 0
    assert got_second.metrics.num_cached_tokens >= 256 and got_second.metrics.num_accepted_tokens > 0
