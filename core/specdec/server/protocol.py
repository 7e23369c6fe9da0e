"""Request bodies of the OpenAI and Triton endpoints, and the sampling parameters they ask for.

Unknown OpenAI fields are ignored, as vLLM does, except those whose meaning this server cannot
honour (``best_of``, ``echo``, ...): a non-neutral value of one of those is a 400 rather than
silently different output. Triton's generate body is strict, as Triton is about inputs.

Structured output comes under OpenAI's name (``response_format``), vLLM's
(``structured_outputs``) or vLLM's older ``guided_*`` fields; one request sets at most one.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from specdec.chat_template import template_arguments
from specdec.errors import ConfigError
from specdec.logprobs import MAX_LOGPROBS
from specdec.sampling import SamplingParams
from specdec.server.errors import APIError, from_config_error, from_validation_error
from specdec.structured_outputs import StructuredOutputsParams
from specdec.tools import ToolUse, tool_use

#: The most choices (``n``) one request may ask for: each is a request of the engine's.
MAX_CHOICES = 16

#: Fields of OpenAI's API this server does not implement, with the values that mean "off".
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "best_of": (None, 1),
    "echo": (None, False),
    "suffix": (None, ""),
    # vLLM's extensions this server does not implement: refused unless they ask for nothing.
    "use_beam_search": (None, False),
    "length_penalty": (None, 1, 1.0),
    "prompt_logprobs": (None,),
    "truncate_prompt_tokens": (None,),
    "skip_special_tokens": (None, True),
    "spaces_between_special_tokens": (None, True),
}


class JSONSchemaFormat(BaseModel):
    """OpenAI's ``response_format.json_schema``."""

    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's ``response_format``: ``text`` (no constraint), ``json_object`` or ``json_schema``."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type json_schema needs a json_schema")
        return self

    def constraint(self) -> dict[str, Any] | None:
        if self.type == "json_object":
            return {"json_object": True}
        if self.type == "json_schema":
            return {"json": self.json_schema.json_schema}
        return None


#: vLLM's older structured-output fields, and the constraint each sets.
_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}


class StreamOptions(BaseModel):
    include_usage: bool = False


class _OpenAIRequest(BaseModel):
    """The sampling fields both OpenAI endpoints share (vLLM's extensions ``top_k``,
    ``ignore_eos``, ``stop_token_ids`` included), and ``return_perf_metrics`` (TensorRT-LLM's
    name) to add the request's speculation metrics to the response."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1, description="vLLM: 0 or -1 disables it.")
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    n: int | None = Field(default=None, ge=1, le=MAX_CHOICES, description="Choices to generate (default 1).")
    seed: int | None = None
    stop: str | list[str] | None = None
    include_stop_str_in_output: bool = False
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_perf_metrics: bool = False
    # Logits processing: OpenAI's penalties and bias, vLLM's extensions.
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    logit_bias: dict[str, float] | None = None
    min_tokens: int | None = Field(default=None, ge=0)
    bad_words: list[str] | None = None
    # Structured output: at most one of these.
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsParams | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    @property
    def num_choices(self) -> int:
        return self.n or 1

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def check_supported(self) -> None:
        """Raise a 400 naming the first unsupported feature the request turns on."""
        for name, value in (self.model_extra or {}).items():
            if name in _NEUTRAL and value not in _NEUTRAL[name]:
                raise APIError(400, f"{name}: not supported by this server", name)

    def logprobs_count(self) -> int | None:
        """How many likeliest tokens' log-probabilities each output position asks for (``None``: no
        log-probabilities)."""
        return None

    def structured(self) -> StructuredOutputsParams | None:
        """The one structured-output constraint the request sets, if any; a 400 naming the fields
        when it sets more than one."""
        given: dict[str, Any] = {}
        if self.response_format is not None and self.response_format.constraint() is not None:
            given["response_format"] = self.response_format.constraint()
        if self.structured_outputs is not None:
            given["structured_outputs"] = self.structured_outputs
        for name, constraint in _GUIDED.items():
            if getattr(self, name) is not None:
                given[name] = {constraint: getattr(self, name)}
        if len(given) > 1:
            raise APIError(400, f"{', '.join(given)}: set only one structured-output constraint", next(iter(given)))
        if not given:
            return None
        (name, constraint), = given.items()
        if isinstance(constraint, StructuredOutputsParams):
            return constraint
        try:
            return StructuredOutputsParams(**constraint)
        except ValidationError as exc:
            raise APIError(400, f"{name}: {exc.errors()[0]['msg']}", name) from None

    def token_bias(self) -> dict[int, float] | None:
        """``logit_bias`` with its token-id keys as integers; a 400 for a key that is not one or a
        bias outside OpenAI's [-100, 100]."""
        if not self.logit_bias:
            return None
        bias = {}
        for key, value in self.logit_bias.items():
            if not key.lstrip("-").isdigit():
                raise APIError(400, f"logit_bias: keys must be token ids, got {key!r}", "logit_bias")
            if not -100 <= value <= 100:
                raise APIError(400, f"logit_bias: biases must lie in [-100, 100], got {value}", "logit_bias")
            bias[int(key)] = value
        return bias

    def sampling_params(self, max_tokens: int, choice: int = 0) -> SamplingParams:
        """The engine's parameters for choice ``choice``; OpenAI's default temperature is 1
        (sampling). With a ``seed``, choice ``i`` samples with ``seed + i``: the same seed for every
        choice would give ``n`` copies of one output."""
        return make_sampling_params(
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=max(self.top_k or 0, 0),
            min_p=self.min_p or 0.0,
            max_tokens=max_tokens,
            stop=self.stop or [],
            include_stop_str_in_output=self.include_stop_str_in_output,
            stop_token_ids=self.stop_token_ids or [],
            ignore_eos=self.ignore_eos,
            seed=None if self.seed is None else self.seed + choice,
            logprobs=self.logprobs_count(),
            frequency_penalty=self.frequency_penalty or 0.0,
            presence_penalty=self.presence_penalty or 0.0,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            logit_bias=self.token_bias(),
            min_tokens=self.min_tokens or 0,
            bad_words=self.bad_words or [],
            structured_outputs=self.structured(),
        )


class CompletionRequest(_OpenAIRequest):
    #: Text, token ids, or a list holding one of those (one prompt per request).
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=1)
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS,
                                 description="Log-probabilities of the chosen and this many likeliest tokens.")

    def logprobs_count(self) -> int | None:
        return self.logprobs

    def single_prompt(self) -> str | list[int]:
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise APIError(400, "prompt: only one prompt per request is supported", "prompt")
            prompt = prompt[0]
        if not prompt:
            raise APIError(400, "prompt: empty", "prompt")
        return prompt


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatInput(BaseModel):
    """A conversation as the chat template takes it: the messages, the tools and vLLM's chat
    template options (extra template variables such as ``enable_thinking``, and continuing the
    last, assistant, message instead of opening a new turn)."""

    model_config = ConfigDict(extra="allow")

    messages: list[ChatMessage] = Field(min_length=1)
    #: OpenAI's function tools (:mod:`specdec.tools`); ``parallel_tool_calls`` is accepted, not enforced.
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False

    def chat_template_arguments(self, tools: dict[str, Any]) -> dict[str, Any]:
        """What ``apply_chat_template`` takes for this request, with ``tools``' arguments; a 400
        naming the field that cannot be."""
        try:
            return template_arguments(self.conversation(), self.chat_template_kwargs, tools, self.add_generation_prompt,
                                   self.continue_final_message)
        except ConfigError as exc:
            raise from_config_error(exc, "chat_template_kwargs") from None

    def tool_use(self) -> ToolUse:
        """What ``tools`` and ``tool_choice`` ask for; a 400 naming the field that cannot be."""
        try:
            return tool_use(self.tools, self.tool_choice)
        except ConfigError as exc:
            raise from_config_error(exc, "tools") from None

    def conversation(self) -> list[dict[str, Any]]:
        """The messages as the chat template takes them, with tool calls and results."""
        out = []
        for m in self.messages:
            message: dict[str, Any] = {"role": m.role, "content": m.text()}
            for name in ("tool_calls", "tool_call_id", "name"):
                if (m.model_extra or {}).get(name) is not None:
                    message[name] = m.model_extra[name]
            out.append(message)
        return out


class ChatCompletionRequest(_OpenAIRequest, ChatInput):
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)

    def check_supported(self) -> None:
        super().check_supported()
        if self.top_logprobs and not self.logprobs:
            raise APIError(400, "top_logprobs: requires logprobs to be true", "top_logprobs")

    def logprobs_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def structured(self) -> StructuredOutputsParams | None:
        constraint = super().structured()
        tools = self.tool_use().constraint()
        if tools is not None and constraint is not None:
            raise APIError(400, "tool_choice: a required or named tool call cannot be combined with another "
                                "structured-output constraint", "tool_choice")
        return tools or constraint


class TokenizeCompletionRequest(BaseModel):
    """vLLM's ``/tokenize`` body for a text prompt."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChatRequest(ChatInput):
    """vLLM's ``/tokenize`` body for a conversation: the prompt a chat completion would prefill."""

    model: str | None = None
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    """vLLM's ``/detokenize`` body."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    tokens: list[int]


class TritonGenerateRequest(BaseModel):
    """The body of Triton's generate endpoint for the TensorRT-LLM LLM API model: ``text_input``
    and ``sampling_param_*`` inputs (TensorRT-LLM's ``SamplingParams`` names). As in TensorRT-LLM,
    decoding is greedy unless a temperature, top-k or top-p is given; the output repeats the
    input unless ``exclude_input_in_output``."""

    model_config = ConfigDict(extra="forbid")

    text_input: str = Field(min_length=1)
    sampling_param_max_tokens: int = Field(default=32, ge=1)
    sampling_param_temperature: float | None = Field(default=None, ge=0.0)
    sampling_param_top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    sampling_param_top_k: int | None = Field(default=None, ge=0)
    sampling_param_min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    sampling_param_seed: int | None = None
    sampling_param_stop: str | list[str] | None = None
    sampling_param_include_stop_str_in_output: bool = False
    sampling_param_stop_token_ids: list[int] | None = None
    sampling_param_min_tokens: int | None = Field(default=None, ge=0)
    sampling_param_repetition_penalty: float | None = Field(default=None, gt=0.0)
    sampling_param_presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    sampling_param_frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    sampling_param_return_perf_metrics: bool = False
    exclude_input_in_output: bool = False

    def sampling_params(self) -> SamplingParams:
        sampled = self.sampling_param_top_k or self.sampling_param_top_p is not None
        temperature = self.sampling_param_temperature
        return make_sampling_params(
            temperature=(1.0 if sampled else 0.0) if temperature is None else temperature,
            top_p=1.0 if self.sampling_param_top_p is None else self.sampling_param_top_p,
            top_k=self.sampling_param_top_k or 0,
            min_p=self.sampling_param_min_p or 0.0,
            max_tokens=self.sampling_param_max_tokens,
            stop=self.sampling_param_stop or [],
            include_stop_str_in_output=self.sampling_param_include_stop_str_in_output,
            stop_token_ids=self.sampling_param_stop_token_ids or [],
            min_tokens=self.sampling_param_min_tokens or 0,
            repetition_penalty=self.sampling_param_repetition_penalty or 1.0,
            presence_penalty=self.sampling_param_presence_penalty or 0.0,
            frequency_penalty=self.sampling_param_frequency_penalty or 0.0,
            seed=self.sampling_param_seed,
        )


def make_sampling_params(**fields: Any) -> SamplingParams:
    try:
        return SamplingParams(**fields)
    except ValidationError as exc:
        raise from_validation_error(exc) from None


def parse(model: type[BaseModel], body: bytes) -> Any:
    """Validate a JSON body into ``model``; a 400 for bad JSON or a bad field."""
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        if exc.errors()[0]["type"] == "json_invalid":
            raise APIError(400, f"the body is not valid JSON: {exc.errors()[0]['ctx']['error']}") from None
        raise from_validation_error(exc) from None
