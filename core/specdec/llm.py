"""The Python API: ``LLM(model, speculative_config=...).generate(prompts, SamplingParams(...))``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

import threading
from collections import deque

import torch
from transformers import PreTrainedModel

from specdec.chat_template import load_chat_template, template_arguments
from specdec.config import SpeculativeConfig
from specdec.config_loader import parse_speculative_config
from specdec.engine import Engine
from specdec.errors import ConfigError, RequestFailedError
from specdec.logprobs import TokenLogprob
from specdec.metrics import RequestMetrics, aggregate
from specdec.models import load_model, resolve_device
from specdec.plugins import get_registry
from specdec.prefix_cache import PrefixCache
from specdec.requests import Request
from specdec.runner import ModelRunner
from specdec.sampling import SamplingParams
from specdec.tools import ToolCall, tool_use

#: A prompt: raw text, a chat conversation (list of ``{"role", "content"}``) or
#: ``{"prompt_token_ids": [...]}``.
Prompt = Union[str, list[dict[str, str]], dict[str, list[int]]]


@dataclass
class RequestOutput:
    request_id: int
    prompt: Prompt
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str | None
    metrics: RequestMetrics = field(repr=False)
    #: Why the request failed (``finish_reason == "error"``).
    error: str | None = None
    #: Each output token's log-probability, when ``SamplingParams.logprobs`` asked for them.
    logprobs: list[TokenLogprob] | None = field(default=None, repr=False)
    #: The tool calls of a :meth:`LLM.chat` reply given ``tools`` (``text`` is then the content
    #: around them), ``None`` without tools.
    tool_calls: list[ToolCall] | None = None


class LLM:
    """A target model with a speculation method attached.

    :param model: a Hugging Face id or local directory, ``None`` for the embedded default
        (SmolLM2-135M-Instruct), or an already loaded ``PreTrainedModel`` (then pass
        ``tokenizer`` too).
    :param speculative_config: a method config object, a TensorRT-LLM or vLLM style dict, a
        YAML file path, or ``None`` for plain decoding.
    :param dtype: ``auto`` (bfloat16 where the hardware has it natively), ``float32``,
        ``bfloat16`` or ``float16``; ignored for a loaded model.
    :param device: ``cuda``, ``cpu`` or ``None`` (CUDA when present).
    :param max_batch_size: most requests decoded together (TensorRT-LLM ``max_batch_size``,
        vLLM ``max_num_seqs``); ``generate`` over more prompts starts each waiting prompt as
        soon as a running one finishes.
    :param max_queue_size: most requests waiting for a place in the batch (``engine.add_request``
        refuses more with :class:`~specdec.errors.QueueFullError`; ``generate`` queues its prompts
        as room frees up).
    :param execution: how the batch's forwards run: ``auto`` (captured CUDA graphs on CUDA, eager
        on CPU), ``eager`` (vLLM's ``enforce_eager``), ``cuda_graph``, ``compile``
        (``torch.compile`` of the static path) or ``static`` (see :mod:`specdec.static_forward`).
    :param max_model_len: the most positions (prompt and output) a request may hold; default the
        model's context. The captured modes reserve a KV cache this long for every batch row.
    :param enable_prefix_caching: reuse the prefill of earlier prompts' leading blocks of
        256 tokens (vLLM's ``enable_prefix_caching``, TensorRT-LLM's ``enable_block_reuse``;
        :mod:`specdec.prefix_cache`): the same output, a shorter prefill.
    :param prefix_cache_gib: the most memory the prefix cache holds, in GiB, on the model's
        device; the least recently used blocks leave first.
    :param chat_template: a Jinja chat template (or the path of one) used in place of the
        tokenizer's, for chats, the server's chat completions and ``/tokenize`` (vLLM's
        ``--chat-template``).

    ``generate`` calls from several threads run one after the other (the engine is not
    thread-safe); a server drives :attr:`engine` from one thread instead.
    """

    def __init__(
        self,
        model: str | PreTrainedModel | None = None,
        speculative_config: SpeculativeConfig | dict[str, Any] | str | None = None,
        *,
        tokenizer: Any = None,
        dtype: str | torch.dtype = "auto",
        device: str | torch.device | None = None,
        max_batch_size: int = 8,
        max_queue_size: int | None = 256,
        execution: str = "auto",
        max_model_len: int | None = None,
        enable_prefix_caching: bool = True,
        prefix_cache_gib: float = 1.0,
        chat_template: str | None = None,
    ) -> None:
        if not prefix_cache_gib > 0:
            raise ConfigError(f"prefix_cache_gib: must be more than 0, got {prefix_cache_gib}")
        self._chat_template = load_chat_template(chat_template) if chat_template is not None else None
        registry = get_registry()
        self.speculative_config = parse_speculative_config(speculative_config, registry)
        if isinstance(model, PreTrainedModel):
            target = model.to(resolve_device(device)) if device is not None else model
        else:
            target, tokenizer = load_model(model, dtype, device)
        self.tokenizer = tokenizer
        try:
            self.runner = ModelRunner(target, execution=execution, max_model_len=max_model_len)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        prefix_cache = PrefixCache(int(prefix_cache_gib * 2**30)) if enable_prefix_caching else None
        self.engine = Engine(self.runner, tokenizer, self.speculative_config, registry, max_batch_size, max_queue_size, prefix_cache)
        self._history: list[RequestMetrics] = []
        self._lock = threading.Lock()

    @property
    def model(self) -> PreTrainedModel:
        return self.runner.model

    @property
    def chat_template(self) -> str | None:
        """The chat template conversations are rendered with: the one given, else the tokenizer's."""
        return self._chat_template or getattr(self.tokenizer, "chat_template", None)

    @property
    def method(self) -> str:
        return self.engine.method.name

    def encode(self, prompt: Prompt, chat: bool = False, template_kwargs: dict[str, Any] | None = None) -> list[int]:
        """Token ids of ``prompt``; ``chat=True`` wraps a text prompt as one user turn;
        ``template_kwargs`` go to ``apply_chat_template`` (``tools``, template variables, or
        ``add_generation_prompt=False`` with ``continue_final_message=True`` to continue the last
        message)."""
        if isinstance(prompt, dict):
            try:
                return [int(t) for t in prompt["prompt_token_ids"]]
            except (KeyError, TypeError, ValueError):
                raise ConfigError("prompt: a dict prompt needs `prompt_token_ids`, a list of ints") from None
        if self.tokenizer is None:
            raise ConfigError("prompt: text prompts need a tokenizer; pass {'prompt_token_ids': [...]}")
        if isinstance(prompt, str) and not chat:
            return self.tokenizer(prompt)["input_ids"]
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        if not self.chat_template:
            raise ConfigError("prompt: this model's tokenizer has no chat template; give one (--chat-template) or use --no-chat")
        kwargs = {"add_generation_prompt": True, **(template_kwargs or {})}
        ids = self.tokenizer.apply_chat_template(messages, tokenize=True, chat_template=self.chat_template, **kwargs)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    def generate(
        self,
        prompts: Prompt | list[Prompt],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        *,
        chat: bool = False,
    ) -> list[RequestOutput]:
        """Generate for each prompt, up to ``max_batch_size`` at a time; outputs keep the order of
        ``prompts``. ``sampling_params`` is one for all prompts or one per prompt (as in vLLM)."""
        if isinstance(prompts, (str, dict)) or (prompts and isinstance(prompts, list) and isinstance(prompts[0], dict) and "role" in prompts[0]):
            prompts = [prompts]
        if isinstance(sampling_params, list):
            if len(sampling_params) != len(prompts):
                raise ConfigError(
                    f"sampling_params: {len(sampling_params)} given for {len(prompts)} prompts (give one, or one per prompt)"
                )
            params = sampling_params
        else:
            params = [sampling_params or SamplingParams()] * len(prompts)
        return self._generate(prompts, [self.encode(prompt, chat=chat) for prompt in prompts], params)

    def _generate(self, prompts: list[Prompt], encoded: list[list[int]], params: list[SamplingParams]) -> list[RequestOutput]:
        with self._lock:
            # Every prompt is checked before any work starts, so one bad prompt loses nothing.
            requests = [self.engine.new_request(ids, p) for ids, p in zip(encoded, params)]
            self._run(requests)
        outputs = []
        for prompt, prompt_ids, request in zip(prompts, encoded, requests):
            self._history.append(request.metrics)
            outputs.append(
                RequestOutput(
                    request.request_id,
                    prompt,
                    prompt_ids,
                    self.engine.final_text(request),
                    request.output_ids,
                    request.finish_reason,
                    request.metrics,
                    request.error,
                    request.logprobs,
                )
            )
        failed = [o for o in outputs if o.finish_reason == "error"]
        if failed:
            others = f" ({len(failed)} of {len(outputs)} requests failed; every output is in .outputs)" if len(outputs) > 1 else ""
            raise RequestFailedError(f"{failed[0].error}{others}", outputs)
        return outputs

    def _run(self, requests: list[Request]) -> None:
        """Run ``requests`` to completion on the engine, queueing each as the queue has room."""
        pending = deque(requests)
        try:
            while pending or any(not r.finished for r in requests):
                while pending and self.engine.queue_has_room():
                    self.engine.enqueue(pending.popleft())
                self.engine.step(more_coming=bool(pending))
        except BaseException:
            for request in requests:
                self.engine.abort(request.request_id)
            raise

    def chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        sampling_params: SamplingParams | None = None,
        *,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> list[RequestOutput]:
        """Generate replies to one conversation or a list of them, using the chat template.

        ``tools`` and ``tool_choice`` are OpenAI's (see :mod:`specdec.tools`): each output's
        ``tool_calls`` holds the calls and ``text`` the content around them. The other keyword
        arguments are vLLM's (:mod:`specdec.chat_template`): template variables, and continuing
        the last (assistant) message instead of opening a new turn.
        """
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        calls = tools is not None or tool_choice is not None
        use = tool_use(tools, tool_choice)
        params = sampling_params or SamplingParams()
        constraint = use.constraint()
        if constraint is not None:
            if params.structured_outputs is not None:
                raise ConfigError("tool_choice: a required or named tool call cannot be combined with structured_outputs")
            params = params.model_copy(update={"structured_outputs": constraint})
        template = self.chat_template
        encoded = []
        for conversation in conversations:
            shown, tool_kwargs = use.conversation(conversation, template) if calls else (conversation, {})
            kwargs = template_arguments(conversation, chat_template_kwargs, tool_kwargs, add_generation_prompt,
                                     continue_final_message)
            encoded.append(self.encode(shown, chat=True, template_kwargs=kwargs))
        outputs = self._generate(conversations, encoded, [params] * len(conversations))
        if calls:
            for out in outputs:
                content, out.tool_calls = use.parse(out.text)
                out.text = content or ""
                out.finish_reason = use.finish_reason(out.finish_reason, out.tool_calls)
        return outputs

    def warmup(self, max_batch_size: int = 1) -> None:
        """Pay one-time setup (kernels, the adaptive draft length's cost measurement) for every
        verify width and every batch size up to ``max_batch_size`` now, not in a timed request."""
        self.engine.warmup(max_batch_size)

    def get_metrics(self) -> RequestMetrics:
        """Speculation metrics aggregated over every request since creation or the last reset."""
        return aggregate(self._history)

    def reset_metrics(self) -> None:
        self._history.clear()

    def close(self) -> None:
        """Release the method's resources (draft model, pools). The LLM cannot generate after."""
        self.engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
