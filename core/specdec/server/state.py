"""What the routes share: the loaded LLM, the engine thread, the served name and the metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jinja2 import TemplateError

from specdec.errors import ConfigError
from specdec.llm import LLM
from specdec.reasoning import ReasoningParser
from specdec.server.async_engine import AsyncEngine
from specdec.server.errors import APIError
from specdec.server.metrics import ServerMetrics
from specdec.server.protocol import ChatInput
from specdec.server.responses import ResponseStore
from specdec.tools import ToolUse


@dataclass
class ServerState:
    llm: LLM
    engine: AsyncEngine
    model_name: str
    metrics: ServerMetrics
    #: Splits chat replies' reasoning from their content (``--reasoning-parser``), if given.
    reasoning: ReasoningParser | None = None
    #: Stored responses of the Responses API (``previous_response_id``).
    responses: ResponseStore = field(default_factory=ResponseStore)

    @property
    def max_length(self) -> int:
        """The model's context length, prompt and output together."""
        return self.llm.runner.max_length

    def check_model(self, name: str | None) -> None:
        """A 404 unless ``name`` is the served model (an OpenAI request may leave it out)."""
        if name is not None and name != self.model_name:
            raise APIError(404, f"The model `{name}` does not exist (this server serves `{self.model_name}`).", "model")

    def token_text(self, token_id: int) -> str:
        """One token's own decoded text (how log-probabilities name tokens)."""
        return self.llm.tokenizer.decode([token_id])

    def encode(self, prompt: str | list[dict[str, Any]], chat: bool, param: str,
               template_kwargs: dict[str, Any] | None = None) -> list[int]:
        """Token ids of a text prompt or a conversation; a 400 naming ``param`` if it cannot be."""
        try:
            return self.llm.encode(prompt, chat=chat, template_kwargs=template_kwargs)
        except ConfigError as exc:
            raise APIError(400, str(exc), param) from None
        except (ValueError, TypeError, TemplateError) as exc:  # the chat template refused the messages
            raise APIError(400, f"{param}: {exc}", param) from None

    def encode_text(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of a text prompt as the tokenizer gives them (``add_special_tokens``: a BOS and
        whatever else the tokenizer adds, as a completion's prompt gets)."""
        return list(self.llm.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])

    def encode_conversation(self, body: ChatInput) -> tuple[list[int], ToolUse]:
        """The token ids a chat request prefills (its messages, tools and template options through
        the chat template), and what it asks of tools; a 400 naming the field that cannot be."""
        tools = body.tool_use()
        messages, tool_kwargs = tools.conversation(body.conversation(), self.llm.chat_template)
        ids = self.encode(messages, chat=True, param="messages", template_kwargs=body.chat_template_arguments(tool_kwargs))
        return ids, tools
