"""OpenAI's Responses API (``POST /v1/responses``), which the OpenAI Agents SDK and coding agents
speak: a request becomes the chat completion it means (instructions, input items, function tools,
``text.format``), and the chat reply becomes the response's output items (reasoning, a message,
function calls), whole or as the API's stream of typed events.

A stored response (``store``, true by default as in OpenAI's API) continues with
``previous_response_id``: the new request's conversation is the earlier one's (without its
``instructions``, as OpenAI's API has it), its reply, then the new input. The server keeps the
last :data:`STORED_RESPONSES` in memory. An agent may as well send its whole conversation each
turn; either way :mod:`specdec.prefix_cache` spares it prefilling that again.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from specdec.server.errors import APIError, from_validation_error
from specdec.server.protocol import ChatCompletionRequest

#: Responses the server keeps for ``previous_response_id`` and ``GET /v1/responses/{id}``.
STORED_RESPONSES = 1000

#: Text part types of an input message's content.
_TEXT_PARTS = ("input_text", "output_text", "text")


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponsesRequest(BaseModel):
    """The fields of a Responses request the server honours; vLLM's sampling extensions (``top_k``,
    ``min_p``, ``seed``, ``stop``, penalties, ...) pass through to the chat request."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    stream: bool = False
    store: bool | None = None
    previous_response_id: str | None = None

    def conversation(self, earlier: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The chat messages of ``earlier`` turns (the previous response's) and this input,
        without the instructions."""
        return [*earlier, *self._input_messages()]

    def as_chat(self, conversation: list[dict[str, Any]]) -> ChatCompletionRequest:
        """The chat completion this request asks for, over ``conversation``; a 400 naming the
        field that cannot be."""
        fields = {key: value for key, value in (self.model_extra or {}).items() if key not in ("n", "include", "metadata",
                                                                                             "reasoning", "truncation", "user")}
        system = [{"role": "system", "content": self.instructions}] if self.instructions else []
        fields.update(model=self.model, messages=system + conversation, max_completion_tokens=self.max_output_tokens,
                      temperature=self.temperature, top_p=self.top_p, parallel_tool_calls=self.parallel_tool_calls)
        if self.tools:
            fields["tools"] = [_chat_tool(tool, i) for i, tool in enumerate(self.tools)]
        if self.tool_choice is not None:
            fields["tool_choice"] = _chat_tool_choice(self.tool_choice)
        if self.text and self.text.get("format"):
            fields["response_format"] = _response_format(self.text["format"])
        try:
            return ChatCompletionRequest.model_validate(fields)
        except ValidationError as exc:
            raise from_validation_error(exc) from None

    def _input_messages(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        if isinstance(self.input, str):
            return [{"role": "user", "content": self.input}]
        for i, item in enumerate(self.input):
            kind = item.get("type", "message")
            if kind == "message":
                role = item.get("role")
                if role not in ("user", "assistant", "system", "developer"):
                    raise APIError(400, f"input[{i}].role: {role!r} is not user, assistant, system or developer",
                                   f"input[{i}].role")
                messages.append({"role": "system" if role == "developer" else role, "content": _text(item.get("content"), i)})
            elif kind == "function_call":
                call = {"id": _field(item, "call_id", i), "type": "function",
                        "function": {"name": _field(item, "name", i), "arguments": _field(item, "arguments", i)}}
                last = messages[-1] if messages else None
                if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                    last["tool_calls"].append(call)  # parallel calls: one assistant turn
                else:
                    messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            elif kind == "function_call_output":
                messages.append({"role": "tool", "tool_call_id": _field(item, "call_id", i), "content": _field(item, "output", i)})
            elif kind != "reasoning":  # earlier reasoning is not shown to the model again
                raise APIError(400, f"input[{i}].type: {kind!r} is not supported (message, function_call, "
                                    "function_call_output, reasoning)", f"input[{i}].type")
        if not messages:
            raise APIError(400, "input: no message or function call output", "input")
        return messages


def _field(item: dict[str, Any], name: str, index: int) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise APIError(400, f"input[{index}].{name}: must be a string", f"input[{index}].{name}")
    return value


def _text(content: Any, index: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") in _TEXT_PARTS for p in content):
        return "".join(str(part.get("text", "")) for part in content)
    raise APIError(400, f"input[{index}].content: text only (a string, or input_text and output_text parts)",
                   f"input[{index}].content")


def _chat_tool(tool: dict[str, Any], index: int) -> dict[str, Any]:
    if tool.get("type") != "function":
        raise APIError(400, f"tools[{index}].type: {tool.get('type')!r}: this server runs function tools only",
                       f"tools[{index}].type")
    function = {key: tool[key] for key in ("name", "description", "parameters", "strict") if tool.get(key) is not None}
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def _response_format(fmt: dict[str, Any]) -> dict[str, Any]:
    if fmt.get("type") == "json_schema":
        schema = {key: fmt[key] for key in ("name", "schema", "strict", "description") if key in fmt}
        return {"type": "json_schema", "json_schema": schema}
    return fmt


class ResponseBuilder:
    """One response's envelope, output items and stream events."""

    def __init__(self, body: ResponsesRequest, model: str) -> None:
        self.id = _new_id("resp")
        self.created_at = int(time.time())
        self.model = model
        self.body = body
        self._sequence = 0

    def response(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None) -> dict[str, Any]:
        body = self.body
        return {
            "id": self.id, "object": "response", "created_at": self.created_at, "model": self.model, "status": status,
            "output": output, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
            "temperature": body.temperature, "top_p": body.top_p, "tools": body.tools or [],
            "tool_choice": body.tool_choice or "auto", "parallel_tool_calls": body.parallel_tool_calls is not False,
            "text": body.text or {"format": {"type": "text"}}, "previous_response_id": body.previous_response_id,
            "store": body.store is not False,
            "metadata": {}, "truncation": "disabled", "usage": usage,
        }

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        """A stream event of ``kind``, numbered in order."""
        self._sequence += 1
        return {"type": kind, "sequence_number": self._sequence - 1, **fields}


def status(finish_reason: str | None) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def usage(prompt_tokens: int, output_tokens: int, cached_tokens: int, reasoning_tokens: int) -> dict[str, Any]:
    return {"input_tokens": prompt_tokens, "input_tokens_details": {"cached_tokens": cached_tokens},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": prompt_tokens + output_tokens}


def reasoning_item(text: str, done: bool = True) -> dict[str, Any]:
    return {"type": "reasoning", "id": _new_id("rs"), "summary": [], "status": "completed" if done else "in_progress",
            "content": [{"type": "reasoning_text", "text": text}] if done else []}


def message_item(text: str, done: bool = True) -> dict[str, Any]:
    return {"type": "message", "id": _new_id("msg"), "role": "assistant", "status": "completed" if done else "in_progress",
            "content": [output_text(text)] if done else []}


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def function_call_item(call: dict[str, Any]) -> dict[str, Any]:
    """A chat tool call (``{"id", "function": {"name", "arguments"}}``) as a function call item."""
    return {"type": "function_call", "id": _new_id("fc"), "call_id": call["id"], "name": call["function"]["name"],
            "arguments": call["function"]["arguments"], "status": "completed"}


def output_items(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A whole chat reply's message as output items: its reasoning, its text, its calls."""
    items = []
    if message.get("reasoning") is not None:
        items.append(reasoning_item(message["reasoning"]))
    calls = message.get("tool_calls") or []
    if message.get("content") or not calls:
        items.append(message_item(message.get("content") or ""))
    return items + [function_call_item(call) for call in calls]


def reply_messages(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A chat reply's message as the turn a later request continues from (its reasoning left out,
    as reasoning items in input are)."""
    turn: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    if message.get("tool_calls"):
        turn["tool_calls"] = message["tool_calls"]
    return [turn]


class ResponseStore:
    """The last ``size`` stored responses: each one's conversation (for ``previous_response_id``)
    and its response object (for ``GET``)."""

    def __init__(self, size: int = STORED_RESPONSES) -> None:
        self.size = size
        self._kept: OrderedDict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = OrderedDict()

    def keep(self, response: dict[str, Any], conversation: list[dict[str, Any]]) -> None:
        self._kept[response["id"]] = (conversation, response)
        while len(self._kept) > self.size:
            self._kept.popitem(last=False)

    def conversation(self, response_id: str | None) -> list[dict[str, Any]]:
        """The conversation a response continues from (none without an id); a 404 for an id not kept."""
        if response_id is None:
            return []
        return list(self._get(response_id, "previous_response_id")[0])

    def response(self, response_id: str) -> dict[str, Any]:
        return self._get(response_id, "response_id")[1]

    def delete(self, response_id: str) -> None:
        self._get(response_id, "response_id")
        del self._kept[response_id]

    def _get(self, response_id: str, param: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        if response_id not in self._kept:
            raise APIError(404, f"{param}: no response {response_id!r} is kept here (the server keeps the last "
                                f"{self.size} stored responses, in memory)", param)
        return self._kept[response_id]
