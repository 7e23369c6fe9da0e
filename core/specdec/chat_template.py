"""The keyword arguments a conversation's chat template is applied with, as vLLM takes them:
template variables (``chat_template_kwargs``, such as ``enable_thinking``), whether to open the
assistant's turn (``add_generation_prompt``) or continue the last message instead
(``continue_final_message``), and the tools the template shows; and a template that replaces the
tokenizer's (vLLM's ``--chat-template``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jinja2 import Environment, TemplateSyntaxError

from specdec.errors import ConfigError

#: ``apply_chat_template``'s own arguments, which ``chat_template_kwargs`` may not pass: they would
#: change what the call returns or which template renders, not set a variable of the template.
TEMPLATE_CALL = frozenset({
    "conversation", "messages", "tools", "chat_template", "tokenize", "padding", "truncation", "max_length",
    "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
    "add_generation_prompt", "continue_final_message",
})


def template_arguments(
    conversation: list[dict[str, Any]],
    variables: dict[str, Any] | None = None,
    tools: dict[str, Any] | None = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
) -> dict[str, Any]:
    """What ``apply_chat_template`` takes for ``conversation``; a ``ConfigError`` naming the field
    for a combination that cannot be (vLLM's rules: continuing the last message needs it to be the
    assistant's, and no new turn opened after it)."""
    clash = sorted((variables or {}).keys() & TEMPLATE_CALL)
    if clash:
        raise ConfigError(f"chat_template_kwargs: {clash[0]!r} is an argument of apply_chat_template, "
                          f"not a template variable")
    if continue_final_message:
        if add_generation_prompt:
            raise ConfigError("continue_final_message: set add_generation_prompt to false with it")
        if not conversation or conversation[-1].get("role") != "assistant":
            raise ConfigError("continue_final_message: the last message must be the assistant's")
    return {**(variables or {}), **(tools or {}), "add_generation_prompt": add_generation_prompt,
            "continue_final_message": continue_final_message}


def load_chat_template(value: str) -> str:
    """A chat template given as vLLM's ``--chat-template`` takes it: the path of a Jinja file, or
    the template itself; a ``ConfigError`` naming ``chat_template`` if it is neither or does not
    parse."""
    if _is_file(value):
        template = Path(value).expanduser().read_text()
    elif "{" in value:
        template = value
    else:
        raise ConfigError(f"chat_template: {value!r} is neither a file nor a Jinja template")
    try:
        # The extensions transformers renders chat templates with.
        Environment(extensions=["jinja2.ext.loopcontrols"]).parse(template)
    except TemplateSyntaxError as exc:
        raise ConfigError(f"chat_template: line {exc.lineno}: {exc.message}") from None
    return template


def _is_file(value: str) -> bool:
    try:
        return Path(value).expanduser().is_file()
    except OSError:  # a template longer than a file name can be
        return False
