"""Conversations jsonl -> token ids and an assistant-token loss mask, through the chat template.

Each assistant turn's tokens are found by rendering the conversation up to that turn twice: with
the generation prompt before it (where the reply starts) and with the turn (where it ends). This
works for any chat template that renders a prefix of the conversation as a prefix of the tokens;
a conversation whose template breaks that is skipped rather than given a wrong mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Example:
    """One tokenized conversation: ``loss_mask[t]`` is True where token ``t`` is an assistant token."""

    conversation_id: str
    input_ids: torch.Tensor
    loss_mask: torch.Tensor


def chat_token_ids(tokenizer: Any, turns: list[dict[str, str]], generation_prompt: bool) -> list[int]:
    """``turns`` rendered by the chat template, as token ids."""
    ids = tokenizer.apply_chat_template(turns, add_generation_prompt=generation_prompt, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def tokenize_conversation(record: dict[str, Any], tokenizer: Any, max_length: int) -> Example | None:
    """The conversation's tokens (cut to ``max_length``) and assistant mask; ``None`` when it has no
    assistant token inside ``max_length`` or its template is not prefix-consistent."""
    turns = [{"role": t["role"], "content": t["content"]} for t in record["conversations"]]
    full = chat_token_ids(tokenizer, turns, False)
    mask = [False] * len(full)
    for index, turn in enumerate(turns):
        if turn["role"] != "assistant":
            continue
        before = chat_token_ids(tokenizer, turns[:index], True) if index else []
        through = chat_token_ids(tokenizer, turns[: index + 1], False)
        start, end = len(before), len(through)
        if start > end or full[:start] != before or full[:end] != through:
            return None
        mask[start:end] = [True] * (end - start)
    ids, mask = full[:max_length], mask[:max_length]
    if not any(mask[1:]):
        return None
    return Example(str(record["conversation_id"]), torch.tensor(ids, dtype=torch.long), torch.tensor(mask))


def tokenize_all(records: list[dict[str, Any]], tokenizer: Any, max_length: int) -> list[Example]:
    """Every usable conversation (see :func:`tokenize_conversation`), in input order."""
    return [e for e in (tokenize_conversation(r, tokenizer, max_length) for r in records) if e is not None]
