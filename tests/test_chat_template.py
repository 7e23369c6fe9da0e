"""How a conversation meets its chat template (vLLM's ``chat_template_kwargs``,
``add_generation_prompt`` and ``continue_final_message``), offline; tests/test_server.py sends
the same fields over HTTP."""

from __future__ import annotations

import copy

import pytest

from specdec import LLM, ConfigError, SamplingParams

GREETING_TEMPLATE = (
    "{% if greeting %}{{ greeting }}\n{% endif %}"
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
ONE_TOKEN = SamplingParams(max_tokens=1)


@pytest.fixture(scope="module")
def llm(tiny):
    tokenizer = copy.deepcopy(tiny.tokenizer)
    tokenizer.chat_template = GREETING_TEMPLATE
    with LLM(tiny.model, None, tokenizer=tokenizer) as llm:
        yield llm


def _prompt(llm: LLM, messages: list[dict], **kwargs) -> str:
    return llm.tokenizer.decode(llm.chat(messages, ONE_TOKEN, **kwargs)[0].prompt_token_ids)


def test_template_variables_reach_the_template(llm) -> None:
    messages = [{"role": "user", "content": "hi"}]
    assert _prompt(llm, messages) == "user: hi\nassistant: "
    assert _prompt(llm, messages, chat_template_kwargs={"greeting": "hey"}) == "hey\nuser: hi\nassistant: "


def test_a_final_assistant_message_is_continued_not_closed(llm) -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello th"}]
    assert _prompt(llm, messages, add_generation_prompt=False, continue_final_message=True) == "user: hi\nassistant: hello th"
    assert _prompt(llm, messages, add_generation_prompt=False) == "user: hi\nassistant: hello th\n"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"chat_template_kwargs": {"tokenize": False}}, "chat_template_kwargs: 'tokenize' is an argument of apply_chat_template"),
    ({"chat_template_kwargs": {"add_generation_prompt": False}}, "chat_template_kwargs: 'add_generation_prompt'"),
    ({"continue_final_message": True}, "continue_final_message: set add_generation_prompt to false"),
    ({"continue_final_message": True, "add_generation_prompt": False, "last": "user"},
     "continue_final_message: the last message must be the assistant's"),
])
def test_settings_that_cannot_be_name_their_field(llm, kwargs, message) -> None:
    last = kwargs.pop("last", "assistant")
    messages = [{"role": "user", "content": "hi"}, {"role": last, "content": "hello"}]
    with pytest.raises(ConfigError, match=message):
        llm.chat(messages, ONE_TOKEN, **kwargs)


def test_a_chat_template_given_replaces_the_tokenizers(tiny, tmp_path) -> None:
    """vLLM's ``--chat-template``: a template given as text or as a file renders every chat in
    place of the tokenizer's, which stays as it was."""
    path = tmp_path / "template.jinja"
    path.write_text(GREETING_TEMPLATE)
    before = tiny.tokenizer.chat_template
    messages = [{"role": "user", "content": "hi"}]
    long = GREETING_TEMPLATE + "{# " + "a comment longer than a file name may be " * 10 + "#}"
    for given in (GREETING_TEMPLATE, str(path), long):
        with LLM(tiny.model, None, tokenizer=tiny.tokenizer, chat_template=given) as llm:
            assert llm.chat_template == (long if given == long else GREETING_TEMPLATE)
            assert _prompt(llm, messages, chat_template_kwargs={"greeting": "hello"}) == "hello\nuser: hi\nassistant: "
    assert tiny.tokenizer.chat_template == before


@pytest.mark.parametrize(("given", "message"), [
    ("no-such-template.jinja", "is neither a file nor a Jinja template"),
    ("{% for m in messages %}", "chat_template: line 1"),
])
def test_a_chat_template_that_cannot_be_is_refused_before_loading(tiny, given: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        LLM(tiny.model, None, tokenizer=tiny.tokenizer, chat_template=given)
