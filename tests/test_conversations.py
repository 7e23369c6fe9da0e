"""Conversations -> token ids and an assistant-token loss mask (what drafter training learns from)."""

from __future__ import annotations

from specdec.testing import TWO_TURNS
from specdec.training.conversations import tokenize_all, tokenize_conversation

def test_loss_mask_covers_exactly_the_assistant_turns(tiny) -> None:
    """Every reply's tokens (with the template's end of turn) are masked in; prompts and role tags are not."""
    example = tokenize_conversation(TWO_TURNS, tiny.tokenizer, 512)
    decode = tiny.tokenizer.decode
    assert decode(example.input_ids) == "user: hi\nassistant: hello there.\nuser: and?\nassistant: bye.\n"
    assert decode(example.input_ids[example.loss_mask]) == "hello there.\nbye.\n"


def test_truncation_and_replyless_conversations(tiny) -> None:
    """``max_length`` cuts tokens and mask together; a conversation with no reply inside it is dropped."""
    cut = tokenize_conversation(TWO_TURNS, tiny.tokenizer, 25)
    assert len(cut.input_ids) == len(cut.loss_mask) == 25
    assert tiny.tokenizer.decode(cut.input_ids[cut.loss_mask]) == "hello"  # "user: hi\nassistant: " is 20 tokens
    no_reply = {"conversation_id": "y", "conversations": [{"role": "user", "content": "hi"}]}
    assert tokenize_all([no_reply, TWO_TURNS], tiny.tokenizer, 512)[0].conversation_id == "x"
    assert tokenize_conversation(TWO_TURNS, tiny.tokenizer, 10) is None
