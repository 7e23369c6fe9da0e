"""Draft and target must share a tokenizer: token ids mean the same text in both, or nothing matches."""

from __future__ import annotations

from typing import Any

from specdec import ConfigError


def check_same_tokenizer(draft_tokenizer: Any, target_tokenizer: Any, draft_vocab_size: int, target_vocab_size: int,
                         draft_name: str) -> None:
    """Refuse a draft whose vocabulary differs from the target's, with a one-line reason.

    A draft in another vocabulary proposes ids that spell other text, so its drafts are almost
    never accepted and every step pays for drafting and a wider verify for nothing: speculation
    then runs slower than plain decoding.
    """
    draft_vocab = draft_tokenizer.get_vocab()
    target_vocab = target_tokenizer.get_vocab()
    why = ("draft and target must share a tokenizer, or drafts are almost never accepted and "
           "speculation runs slower than plain decoding")
    if draft_vocab != target_vocab:
        differing = sum(1 for token, i in target_vocab.items() if draft_vocab.get(token) != i)
        differing += sum(1 for token in draft_vocab if token not in target_vocab)
        raise ConfigError(
            f"speculative_model {draft_name!r}: its tokenizer differs from the target's "
            f"({len(draft_vocab)} vs {len(target_vocab)} tokens, {differing} missing or with other ids); {why}"
        )
    needed = min(len(target_vocab), target_vocab_size)
    if draft_vocab_size < needed:
        raise ConfigError(
            f"speculative_model {draft_name!r}: its output layer covers {draft_vocab_size} token ids, "
            f"the target's {needed}; {why}"
        )
