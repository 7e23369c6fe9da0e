"""Anthropic's Messages API (``POST /v1/messages``), which Claude Code and Anthropic's SDKs speak,
as vLLM serves it: a request becomes the chat completion it means (``system``, text, ``tool_use``
and ``tool_result`` blocks, tools with their ``input_schema``), and the chat reply becomes content
blocks (``thinking`` with a reasoning parser, ``text``, ``tool_use``), whole or as Anthropic's
stream of events.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from specdec.server.errors import APIError, from_validation_error
from specdec.server.protocol import ChatCompletionRequest

#: The chat finish reasons as Anthropic's stop reasons.
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


class MessagesRequest(BaseModel):
    """The fields of a Messages request the server honours; ``metadata`` and other fields are
    accepted and left alone, and vLLM's sampling extensions pass through to the chat request."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int = Field(ge=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    stop_sequences: list[str] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    stream: bool = False

    def as_chat(self) -> ChatCompletionRequest:
        """The chat completion this request asks for; a 400 naming the field that cannot be."""
        fields = {key: value for key, value in (self.model_extra or {}).items()
                  if key not in ("metadata", "thinking", "service_tier", "container", "mcp_servers")}
        messages = [{"role": "system", "content": _text(self.system, "system")}] if self.system else []
        for i, message in enumerate(self.messages):
            messages += _chat_messages(message, i)
        fields.update(model=self.model, messages=messages, max_tokens=self.max_tokens, temperature=self.temperature,
                      top_p=self.top_p, top_k=self.top_k, stop=self.stop_sequences)
        if self.tools:
            fields["tools"] = [_chat_tool(tool, i) for i, tool in enumerate(self.tools)]
        if self.tool_choice is not None:
            fields["tool_choice"] = _chat_tool_choice(self.tool_choice)
        try:
            return ChatCompletionRequest.model_validate(fields)
        except ValidationError as exc:
            raise from_validation_error(exc) from None


def _text(content: Any, param: str) -> str:
    """A string, or the text of a list of ``text`` blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(b, dict) and b.get("type") == "text" for b in content):
        return "".join(str(block.get("text", "")) for block in content)
    raise APIError(400, f"{param}: text only (a string or text blocks)", param)


def _chat_messages(message: dict[str, Any], index: int) -> list[dict[str, Any]]:
    """One Messages turn as chat messages: a user turn's ``tool_result`` blocks become tool
    messages, an assistant turn's ``tool_use`` blocks its tool calls (``thinking`` blocks are left
    out, as vLLM leaves them)."""
    role, content, where = message.get("role"), message.get("content"), f"messages[{index}]"
    if role not in ("user", "assistant"):
        raise APIError(400, f"{where}.role: {role!r} is not user or assistant", f"{where}.role")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise APIError(400, f"{where}.content: a string or a list of content blocks", f"{where}.content")
    out: list[dict[str, Any]] = []
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        kind, param = block.get("type") if isinstance(block, dict) else None, f"{where}.content[{j}]"
        if kind == "text":
            text.append(str(block.get("text", "")))
        elif kind == "tool_use" and role == "assistant":
            calls.append({"id": str(block.get("id")), "type": "function",
                          "function": {"name": str(block.get("name")), "arguments": json.dumps(block.get("input") or {})}})
        elif kind == "tool_result" and role == "user":
            result = block.get("content") or ""
            out.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id")), "content": _text(result, param)})
        elif kind not in ("thinking", "redacted_thinking"):
            raise APIError(400, f"{param}.type: {kind!r} is not supported here (text, tool_use, tool_result, thinking)",
                           f"{param}.type")
    if text or calls or not out:
        turn: dict[str, Any] = {"role": role, "content": "".join(text)}
        if calls:
            turn["tool_calls"] = calls
        out.append(turn)
    return out


def _chat_tool(tool: dict[str, Any], index: int) -> dict[str, Any]:
    if "name" not in tool or tool.get("type") not in (None, "custom"):
        raise APIError(400, f"tools[{index}]: only client tools with a name and an input_schema are run here",
                       f"tools[{index}]")
    function = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object", "properties": {}}}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: dict[str, Any]) -> str | dict[str, Any]:
    kind = choice.get("type")
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    raise APIError(400, f"tool_choice.type: {kind!r} is not auto, any, tool or none", "tool_choice.type")


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def tool_use_block(call: dict[str, Any]) -> dict[str, Any]:
    """A chat tool call as a ``tool_use`` block (its arguments, JSON, as the ``input`` object)."""
    try:
        arguments = json.loads(call["function"]["arguments"] or "{}")
    except ValueError:
        arguments = {}
    return {"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
            "input": arguments if isinstance(arguments, dict) else {}}


def content_blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A whole chat reply's message as content blocks: thinking, text, tool uses."""
    blocks: list[dict[str, Any]] = []
    if message.get("reasoning") is not None:
        blocks.append({"type": "thinking", "thinking": message["reasoning"], "signature": ""})
    calls = message.get("tool_calls") or []
    if message.get("content") or not calls:
        blocks.append({"type": "text", "text": message.get("content") or ""})
    return blocks + [tool_use_block(call) for call in calls]


def usage(prompt_tokens: int, output_tokens: int, cached_tokens: int) -> dict[str, int]:
    """Anthropic's usage: ``input_tokens`` are the prompt tokens not read from the prefix cache."""
    return {"input_tokens": prompt_tokens - cached_tokens, "cache_read_input_tokens": cached_tokens,
            "cache_creation_input_tokens": 0, "output_tokens": output_tokens}


def message(message_id: str, model: str, content: list[dict[str, Any]], stop_reason: str | None,
            counted: dict[str, int]) -> dict[str, Any]:
    return {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop_reason, "stop_sequence": None, "usage": counted}
