"""Tool calls: what each ``tool_choice`` constrains the reply to, how the tools are offered, and
the Hermes-style parser, whole and streamed."""

from __future__ import annotations

import json

import pytest

from specdec import ConfigError
from specdec.logits_processing import GrammarCompiler
from specdec.tools import ToolCallStream, parse_hermes, tool_use

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


def test_auto_replies_are_parsed_for_hermes_tool_calls() -> None:
    content, calls = parse_hermes('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
                                  '</tool_call>\n<tool_call>{"name": "get_time", "arguments": {}}</tool_call>')
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Oslo"}), ("get_time", {})]
    assert calls[0].id != calls[1].id and calls[0].openai()["type"] == "function"
    # Cut short by max_tokens: the unclosed last block still counts when it parses.
    assert parse_hermes('<tool_call>{"name": "get_time", "arguments": {}}')[1][0].name == "get_time"
    # Not JSON: all of it is content, as vLLM's parser does.
    assert parse_hermes("<tool_call>{oops</tool_call>") == ("<tool_call>{oops</tool_call>", [])
    assert parse_hermes("no call here") == ("no call here", [])


def test_a_stream_sends_content_until_a_call_may_begin_then_the_calls_at_the_end() -> None:
    stream = ToolCallStream(tool_use([WEATHER], "auto"))
    sent = [stream.feed(d) for d in ["Sure", ". <tool", "_call>", '{"name": "get_weather", ', '"arguments": {"city": "Rome"}}']]
    assert "".join(sent) == "Sure. " and sent[1] == ". "
    rest, calls = stream.finish()
    assert rest == "" and calls[0].name == "get_weather" and json.loads(calls[0].arguments) == {"city": "Rome"}
    plain = ToolCallStream(tool_use([WEATHER], "auto"))
    assert plain.feed("a <tool") == "a " and plain.feed(" box") == "<tool box" and plain.finish() == ("", [])


def test_required_and_named_choices_constrain_the_reply_to_the_functions_schemas(tiny) -> None:
    named = tool_use([WEATHER, TIME], {"type": "function", "function": {"name": "get_weather"}})
    assert named.constraint().json_schema == WEATHER["function"]["parameters"]
    assert named.parse('{"city": "Oslo"}')[1][0].arguments == '{"city": "Oslo"}'
    required = tool_use([WEATHER, TIME], "required")
    schema = required.constraint().json_schema
    assert schema["type"] == "array" and [a["properties"]["name"]["enum"] for a in schema["items"]["anyOf"]] == [
        ["get_weather"], ["get_time"]]
    calls = required.parse('[{"name": "get_time", "parameters": {}}]')[1]
    cut = required.parse('[{"name": "get_time", "parameters": {}}, {"name": "get_weather", "parameters": {"ci')[1]
    assert [c.name for c in cut] == ["get_time"], "the calls that came whole before max_tokens cut the reply"
    assert calls[0].name == "get_time" and required.finish_reason("stop", calls) == "tool_calls"
    assert named.finish_reason("stop", named.parse("{}")[1]) == "stop"
    # Both constraints compile (llguidance's JSON-schema support).
    compiler = GrammarCompiler(tiny.tokenizer, len(tiny.tokenizer), [2])
    compiler.matcher(named.constraint())
    compiler.matcher(required.constraint())
    assert tool_use([WEATHER], "none").constraint() is None and tool_use([WEATHER], None).mode == "auto"


def test_tools_are_offered_through_the_template_or_a_system_prompt() -> None:
    use = tool_use([WEATHER], "auto")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Oslo?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
                {"role": "tool", "tool_call_id": "1", "content": "sunny"}]
    same, kwargs = use.conversation(messages, "{% for tool in tools %}...{% endfor %}")
    assert same == messages and kwargs["tools"][0]["function"]["name"] == "get_weather"
    shown, kwargs = use.conversation(messages, "{{ messages }}")
    assert kwargs == {} and shown[0]["content"].startswith("Be brief.\n\nYou are a function calling AI model.")
    assert '"get_weather"' in shown[0]["content"] and "tool_calls" not in shown[2]
    assert shown[2]["content"] == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    assert tool_use([WEATHER], "none").conversation(messages[1:2], "{{ messages }}") == (messages[1:2], {})


@pytest.mark.parametrize(("tools", "choice", "message"), [
    ([WEATHER], {"type": "function", "function": {"name": "nope"}}, "tool_choice: no tool named 'nope'"),
    ([], "required", "tool_choice: 'required' needs tools"),
    ([WEATHER], "sometimes", "tool_choice: expected"),
    ([{"type": "function", "function": {"name": "bad name!"}}], "auto", "tools: String should match pattern"),
])
def test_bad_tool_input_names_the_field(tools, choice, message) -> None:
    with pytest.raises(ConfigError, match=f"^{message}"):
        tool_use(tools, choice)
