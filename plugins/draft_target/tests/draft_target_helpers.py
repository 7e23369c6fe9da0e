"""Helpers for the draft/target tests: save tiny models, and a tokenizer unlike the tiny one."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast


def save(model: torch.nn.Module, tokenizer: object, path: Path) -> Path:
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def other_tokenizer() -> PreTrainedTokenizerFast:
    """A real character tokenizer like the tiny one, but over other characters and ids."""
    chars = "abcdefghijklmnopqrstuvwxyz0123456789 .,\n"
    vocab = {tok: i for i, tok in enumerate(["<pad>", "<s>", "</s>", *reversed(chars)])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
