"""Tool calls on any chat model: OpenAI's ``tools`` and ``tool_choice``.

- ``none``: the tools are not offered; plain text.
- ``auto``: the tools are offered in the prompt (through the chat template when it takes
  ``tools``, else in a Hermes-style system prompt) and the reply is parsed for Hermes-style
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, as vLLM's ``hermes`` parser
  reads them.
- ``required``: the reply is constrained to a JSON array of one or more calls of the offered
  functions, each ``{"name": ..., "parameters": {...}}`` with the function's own parameter schema
  (vLLM's schema).
- a named function: the reply is constrained to that function's parameter schema, and is its
  arguments.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from specdec.errors import ConfigError
from specdec.structured_outputs import StructuredOutputsParams

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_CALL_BLOCK = re.compile(re.escape(CALL_OPEN) + r"(.*?)(?:" + re.escape(CALL_CLOSE) + r"|$)", re.DOTALL)


class FunctionDefinition(BaseModel):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    """One of OpenAI's ``tools``."""

    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    """``tool_choice`` naming one function."""

    type: Literal["function"] = "function"
    function: NamedFunction


@dataclass
class ToolCall:
    """One call the model made: ``arguments`` is JSON text, as OpenAI returns it."""

    name: str
    arguments: str
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def _parameters(tool: Tool) -> dict[str, Any]:
    return tool.function.parameters or {"type": "object", "properties": {}}


class ToolUse:
    """What one request's ``tools`` and ``tool_choice`` ask for; a :class:`ConfigError` naming the
    field for a choice that cannot be honoured."""

    def __init__(self, tools: list[Tool] | None, tool_choice: str | NamedToolChoice | None = None) -> None:
        self.tools = list(tools or [])
        if tool_choice is None:
            tool_choice = "auto" if self.tools else "none"
        if isinstance(tool_choice, NamedToolChoice):
            named = [t for t in self.tools if t.function.name == tool_choice.function.name]
            if not named:
                raise ConfigError(f"tool_choice: no tool named {tool_choice.function.name!r} in tools")
            self.mode, self.named = "named", named[0]
        elif tool_choice in ("none", "auto", "required"):
            if tool_choice == "required" and not self.tools:
                raise ConfigError("tool_choice: 'required' needs tools")
            self.mode, self.named = tool_choice, None
        else:
            raise ConfigError(f"tool_choice: expected 'none', 'auto', 'required' or a named function, got {tool_choice!r}")

    @property
    def offered(self) -> list[Tool]:
        """The tools shown to the model."""
        return [] if self.mode == "none" else self.tools

    def constraint(self) -> StructuredOutputsParams | None:
        """The structured-output constraint the choice needs (``None`` for ``none`` and ``auto``)."""
        # Compact JSON: arguments need no layout, and a model cannot pad them with whitespace.
        if self.mode == "named":
            return StructuredOutputsParams(json=_parameters(self.named), whitespace_flexible=False)
        if self.mode == "required":
            calls = [{"properties": {"name": {"enum": [t.function.name]}, "parameters": _parameters(t)},
                      "required": ["name", "parameters"]} for t in self.tools]
            return StructuredOutputsParams(json={"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": calls}},
                                           whitespace_flexible=False)
        return None

    def conversation(self, messages: list[dict[str, Any]], template: str | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The messages and ``apply_chat_template`` keyword arguments that offer the tools: through
        the template when it takes ``tools``, else in a Hermes-style system prompt. Earlier
        assistant calls become ``<tool_call>`` blocks for a template that cannot show them."""
        tools = [t.model_dump(exclude_none=True) for t in self.offered]
        if template and "tools" in template:
            return messages, ({"tools": tools} if tools else {})
        messages = [_with_calls_as_text(m) for m in messages]
        if not tools:
            return messages, {}
        system = hermes_system_prompt(tools)
        if messages and messages[0].get("role") == "system":
            return [{**messages[0], "content": f"{messages[0].get('content') or ''}\n\n{system}"}, *messages[1:]], {}
        return [{"role": "system", "content": system}, *messages], {}

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """The reply's text content and its calls. A reply that does not parse as calls is all
        content (as vLLM does)."""
        if self.mode == "named":
            return None, [ToolCall(self.named.function.name, text)]
        if self.mode == "required":
            try:
                return None, [ToolCall(c["name"], json.dumps(c["parameters"])) for c in _complete_items(text)]
            except (TypeError, KeyError):
                return text, []
        if self.mode == "auto":
            return parse_hermes(text)
        return text, []

    def finish_reason(self, reason: str | None, calls: list[ToolCall]) -> str | None:
        """OpenAI's: ``tool_calls`` when the model chose to call (``auto``, ``required``); a forced
        call keeps the reason the output ended for."""
        return "tool_calls" if calls and self.mode in ("auto", "required") and reason == "stop" else reason


def tool_use(tools: list[dict[str, Any]] | None, tool_choice: str | dict[str, Any] | None) -> ToolUse:
    """:class:`ToolUse` from OpenAI's JSON shapes; a :class:`ConfigError` naming the bad field."""
    try:
        parsed = [Tool.model_validate(t) for t in tools or []]
    except ValidationError as exc:
        raise ConfigError(f"tools: {exc.errors()[0]['msg']} at {'.'.join(map(str, exc.errors()[0]['loc']))}") from None
    if isinstance(tool_choice, dict):
        try:
            tool_choice = NamedToolChoice.model_validate(tool_choice)
        except ValidationError as exc:
            raise ConfigError(f"tool_choice: {exc.errors()[0]['msg']}") from None
    return ToolUse(parsed, tool_choice)


def hermes_system_prompt(tools: list[dict[str, Any]]) -> str:
    """The tool-use instructions of Hermes-style function calling, for templates without tools."""
    listed = "\n".join(json.dumps(t) for t in tools)
    return (
        "You are a function calling AI model. You are provided with function signatures within <tools></tools> "
        "XML tags. You may call one or more functions to assist with the user query. Don't make assumptions about "
        f"what values to plug into functions.\n<tools>\n{listed}\n</tools>\n"
        "For each function call return a json object with function name and arguments within "
        f"{CALL_OPEN}{CALL_CLOSE} XML tags as follows:\n"
        f'{CALL_OPEN}\n{{"name": <function-name>, "arguments": <args-dict>}}\n{CALL_CLOSE}'
    )


def _with_calls_as_text(message: dict[str, Any]) -> dict[str, Any]:
    calls = message.get("tool_calls")
    if not calls:
        return message
    blocks = []
    for call in calls:
        function = call["function"]
        arguments = function.get("arguments") or "{}"
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        blocks.append(f"{CALL_OPEN}\n{json.dumps({'name': function['name'], 'arguments': parsed})}\n{CALL_CLOSE}")
    content = "\n".join(filter(None, [message.get("content") or "", *blocks]))
    return {k: v for k, v in {**message, "content": content}.items() if k != "tool_calls"}


def _complete_items(text: str) -> list[Any]:
    """The items of a JSON array, or of as much of it as came whole (output cut by ``max_tokens``)."""
    decoder, items = json.JSONDecoder(), []
    position = text.find("[") + 1
    if position == 0:
        return items
    while True:
        while position < len(text) and text[position] in " \t\n\r,":
            position += 1
        try:
            item, position = decoder.raw_decode(text, position)
        except ValueError:
            return items
        items.append(item)


def parse_hermes(text: str) -> tuple[str | None, list[ToolCall]]:
    """Hermes-style ``<tool_call>`` blocks in ``text`` (a last block may be unclosed, when the
    output was cut); the text before the first block is the content (``None`` when empty)."""
    if CALL_OPEN not in text:
        return text, []
    calls = []
    try:
        for block in _CALL_BLOCK.findall(text):
            call = json.loads(block)
            arguments = call.get("arguments", call.get("parameters", {}))
            calls.append(ToolCall(str(call["name"]), arguments if isinstance(arguments, str) else json.dumps(arguments)))
    except (ValueError, TypeError, KeyError, AttributeError):
        return text, []
    content = text[: text.index(CALL_OPEN)].strip()
    return content or None, calls


class ToolCallStream:
    """Splits a streamed ``auto`` reply into content deltas and, at its end, the calls: text is
    sent as it comes until a ``<tool_call>`` may begin (a possible start is held back); from
    there on it is kept to be parsed when the output ends."""

    def __init__(self, use: ToolUse) -> None:
        self.use = use
        self.text = ""
        self.sent = 0

    def feed(self, delta: str) -> str:
        """The content to send now for ``delta``."""
        self.text += delta
        if self.use.mode != "auto":
            return ""
        start = self.text.find(CALL_OPEN)
        end = start if start >= 0 else len(self.text) - _partial_open(self.text)
        out = self.text[self.sent : max(end, self.sent)]
        self.sent = max(end, self.sent)
        return out

    def finish(self) -> tuple[str, list[ToolCall]]:
        """The content not sent yet and the calls, once the output has ended."""
        content, calls = self.use.parse(self.text)
        if calls:
            return "", calls
        rest = self.text[self.sent :]
        self.sent = len(self.text)
        return rest, []


def _partial_open(text: str) -> int:
    """How many characters at the end of ``text`` could begin ``<tool_call>``."""
    for n in range(min(len(CALL_OPEN) - 1, len(text)), 0, -1):
        if CALL_OPEN.startswith(text[-n:]):
            return n
    return 0
