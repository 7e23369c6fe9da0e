"""Choosing Spec-Bench prompts: categories, the mt_bench group, the cap per category."""

from __future__ import annotations

import pytest

from specdec.bench.dataset import CATEGORY_GROUPS, load_questions
from specdec.errors import ConfigError


def test_mt_bench_names_spec_benchs_eight_conversation_categories():
    questions = load_questions("spec_bench", ["mt_bench"])
    assert sorted({q.category for q in questions}) == sorted(CATEGORY_GROUPS["mt_bench"])
    assert len(questions) == 80 and all(len(q.turns) == 2 for q in questions)
    mixed = load_questions("spec_bench", ["mt_bench", "rag"], per_category=1)
    assert sorted(q.category for q in mixed) == sorted([*CATEGORY_GROUPS["mt_bench"], "rag"])


def test_an_unknown_category_names_the_groups_too():
    with pytest.raises(ConfigError, match=r"--categories: unknown poetry; .* \(and the groups mt_bench\)"):
        load_questions("spec_bench", ["poetry"])


def test_code_edits_quote_library_functions_whole():
    """The bundled code-edit set: three kinds of edit on the same ten standard-library functions,
    each prompt quoting its function's whole source (what the reply rewrites)."""
    questions = load_questions("code_edits")
    assert len(questions) == 30
    by_kind = {}
    for q in questions:
        kind, function = q.question_id.split("/")
        assert q.category == kind and len(q.turns) == 1
        assert "```python\ndef " in q.turns[0] and q.turns[0].rstrip().endswith("```")
        by_kind.setdefault(kind, []).append(function)
    assert sorted(by_kind) == ["rename", "strip_docs", "type_hints"]
    assert by_kind["rename"] == by_kind["strip_docs"] == by_kind["type_hints"] and len(set(by_kind["rename"])) == 10


def test_json_extraction_rows_carry_their_schema():
    """The bundled structured-output set: two JSON schemas over the same twelve library functions;
    each question constrains its turns' answers (``structured_outputs`` in the row)."""
    from specdec.sampling import SamplingParams

    questions = load_questions("json_extraction")
    assert len(questions) == 24 and sorted({q.category for q in questions}) == ["signature", "summary"]
    for q in questions:
        assert q.structured_outputs.kind == "json" and q.structured_outputs.json_schema["type"] == "object"
        assert q.params(SamplingParams(max_tokens=9)).structured_outputs == q.structured_outputs
    assert load_questions("code_edits")[0].params(SamplingParams()).structured_outputs is None


def test_a_malformed_constraint_in_a_row_is_a_clear_error(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"question_id": 1, "turns": ["hi"], "structured_outputs": {"regex": "a", "choice": ["b"]}}\n')
    with pytest.raises(ConfigError, match="line 1: structured_outputs: Value error, set exactly one of json, regex, choice, grammar, json_object \\(got regex, choice\\)$"):
        load_questions(str(path))


def test_tool_call_rows_offer_their_tools_and_constrain_the_call(tiny):
    """The bundled tool-call set: each row's tools are offered in the prompt (a Hermes-style system
    prompt for a template without tools) and its tool choice becomes the reply's constraint."""
    from specdec import LLM
    from specdec.sampling import SamplingParams

    questions = load_questions("tool_calls")
    assert len(questions) == 16 and sorted({q.category for q in questions}) == ["named", "required"]
    named = next(q for q in questions if q.category == "named")
    assert named.params(SamplingParams()).structured_outputs.json_schema == named.tools.named.function.parameters
    llm = LLM(tiny.model, None, tokenizer=tiny.tokenizer)
    messages = [{"role": "user", "content": "hi"}]
    assert len(named.encode(llm, messages)) > len(llm.encode(messages, chat=True))


def test_repeated_sends_each_mt_bench_first_turn_again_after_all_were_answered():
    """The repeated-request set: one first turn per MT-Bench category, then the same turns again
    under ``repeat``, so a cap per category keeps the same prompts in both halves."""
    questions = load_questions("repeated")
    first, again = questions[:8], questions[8:]
    assert [q.category for q in first] == ["first"] * 8 and [q.category for q in again] == ["repeat"] * 8
    assert [q.turns for q in again] == [q.turns for q in first] and all(len(q.turns) == 1 for q in questions)
    sources = {q.question_id: q for q in load_questions("spec_bench", ["mt_bench"], per_category=1)}
    assert [sources[q.question_id].turns[0] for q in first] == [q.turns[0] for q in first]
    assert len({sources[q.question_id].category for q in first}) == 8
    capped = load_questions("repeated", per_category=3)
    assert [q.turns for q in capped[3:]] == [q.turns for q in capped[:3]]
