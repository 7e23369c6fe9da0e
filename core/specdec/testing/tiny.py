"""Tiny random Llama models and a character-level tokenizer, built in-process (no downloads)."""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

_CHARS = string.ascii_lowercase + " .,:!?\n"
#: Characters enough for JSON and tool calls (``make_tiny_target(chars=JSON_CHARS)``).
JSON_CHARS = _CHARS + string.ascii_uppercase + string.digits + '{}[]"<>/_-+='
_SPECIAL = ["<pad>", "<s>", "</s>"]
_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)

#: A two-turn conversation in the training format, in the tiny tokenizer's characters.
TWO_TURNS: dict[str, Any] = {"conversation_id": "x", "conversations": [
    {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there."},
    {"role": "user", "content": "and?"}, {"role": "assistant", "content": "bye."}]}


def tiny_tokenizer(chars: str = _CHARS) -> PreTrainedTokenizerFast:
    """A real fast tokenizer over single characters: id 0 pad, 1 bos, 2 eos, then ``chars``."""
    vocab = {tok: i for i, tok in enumerate(_SPECIAL + list(chars))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        chat_template=_CHAT_TEMPLATE,
    )


@dataclass
class TinyTarget:
    model: LlamaForCausalLM
    tokenizer: Any

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text)["input_ids"]


def make_tiny_target(seed: int = 0, sharpness: float = 4.0, num_layers: int = 2, hidden: int = 64,
                     device: str | torch.device = "cpu", chars: str = _CHARS) -> TinyTarget:
    """A random fp32 Llama over the tiny tokenizer's vocabulary (of ``chars``), on ``device``.

    ``sharpness`` scales the output head so the next-token distributions are peaked, like a
    trained model's, rather than near uniform. The weights are drawn on the CPU, so a seed gives
    the same model on every device.
    """
    tokenizer = tiny_tokenizer(chars)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpness)
    model.generation_config.eos_token_id = 2
    return TinyTarget(model.to(device), tokenizer)


def shuffled_ranking(vocab_size: int, path: Any) -> Any:
    """A draft-vocabulary ranking (:mod:`specdec.draft_vocab`) of every token in a fixed random
    order, so the tokens a ``draft_vocab_size`` keeps are not a contiguous block of ids; returns ``path``."""
    from specdec.draft_vocab import save_ranking

    ranking = torch.randperm(vocab_size, generator=torch.Generator().manual_seed(0))
    save_ranking(path, ranking, torch.zeros(vocab_size, dtype=torch.long), {})
    return path


@torch.no_grad()
def target_text(model: torch.nn.Module, num: int, length: int, generator: torch.Generator,
                prompt_len: int = 6) -> torch.Tensor:
    """``num`` sequences ``model`` writes (``length`` tokens after a random prompt of ``prompt_len``):
    half greedy, half sampled from its top 3. What a drafter is fitted to in tests, so its drafts
    are right often but not always."""
    ids = torch.randint(3, model.config.vocab_size, (num, prompt_len), generator=generator)
    for _ in range(length):
        top = model(ids).logits[:, -1].topk(3, dim=-1)
        sampled = top.indices.gather(-1, torch.multinomial(top.values.softmax(-1), 1, generator=generator))
        greedy = (torch.arange(num) % 2 == 0)[:, None]
        ids = torch.cat([ids, torch.where(greedy, top.indices[:, :1], sampled)], dim=1)
    return ids


class PadDrafter:
    """A ``user_provided`` drafter that drafts the pad token (id 0) at every position. A tiny
    target's output does not contain it, so its drafts are all rejected: the tests that use it
    see what suffix drafts (or the policy) do over a method that never lands."""

    def prepare_draft_tokens(self, requests: list[Any], resource_manager: Any) -> list[list[int]]:
        return [[0] * r.max_draft_len for r in requests]
