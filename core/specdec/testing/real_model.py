"""The embedded default model for tests that check a claim on a real model."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from specdec.llm import LLM


@contextmanager
def default_model_llm(dtype: str = "float32") -> Iterator[LLM]:
    """Plain decoding on SmolLM2-135M-Instruct, with every core for as long as it is in use.

    Test suites pin torch to one thread for their tiny models; a real model wants all of them.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    try:
        yield LLM(None, None, dtype=dtype)
    finally:
        torch.set_num_threads(threads)
