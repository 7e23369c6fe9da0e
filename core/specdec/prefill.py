"""A prompt's prefill: one forward of the whole prompt, or, with prefix caching, position-aligned
chunks of the cache's block size, the leading ones taken from the
:class:`~specdec.prefix_cache.PrefixCache` when an earlier prompt began the same way."""

from __future__ import annotations

import dataclasses

import torch

from specdec.hidden_states import HiddenStates
from specdec.kv_cache import BatchKVCache
from specdec.prefix_cache import BlockContents, PrefixCache
from specdec.runner import ModelRunner, RunnerOutput


@dataclasses.dataclass(frozen=True)
class PromptForward:
    """A prompt's prefill: its output (the last position's logits, every position's kept hidden
    states) and its single-row cache, read and copied from, never written, so requests with the
    same prompt can share it. ``cached_tokens`` of its positions came from the prefix cache."""

    prompt: list[int]
    output: RunnerOutput
    cache: BatchKVCache
    cached_tokens: int = 0


class Prefill:
    """Prefills prompts on ``runner``, reusing and filling ``prefix_cache`` when there is one."""

    def __init__(self, runner: ModelRunner, prefix_cache: PrefixCache | None = None) -> None:
        self.runner = runner
        self.prefix_cache = prefix_cache

    def __call__(self, token_ids: list[int]) -> PromptForward:
        prompt = list(token_ids)
        if self.prefix_cache is None:
            cache = self.runner.new_cache()
            return PromptForward(prompt, self.runner.forward(cache, prompt, last_only=True), cache)
        blocks, size = self.prefix_cache.match(prompt), self.prefix_cache.block_size
        start = len(blocks) * size
        if blocks:
            layers = zip(*(block.entries for block in blocks), strict=True)
            entries = [(torch.cat([k for k, _ in parts], dim=-2), torch.cat([v for _, v in parts], dim=-2)) for parts in layers]
            cache = BatchKVCache.from_entries(self.runner.model.config, entries)
        else:
            cache = self.runner.new_cache()
        hidden = [block.hidden for block in blocks]
        for chunk in range(start, len(prompt), size):
            end = min(chunk + size, len(prompt))
            # Continuing chunks run as transformers' causal forward at explicit positions, the
            # same call whether the chunks before came from the cache or were just computed.
            positions = torch.arange(chunk, end)[None] if chunk else None
            output = self.runner.forward(cache, prompt[chunk:end], last_only=True, position_ids=positions)
            hidden.append(output.hidden_states)
        kept = None if hidden[0] is None else HiddenStates.concat(hidden)

        def contents(b: int) -> BlockContents:
            span = slice(b * size, (b + 1) * size)
            return cache.entries(0, span.start, span.stop), None if kept is None else kept.map(lambda h: h[span].clone())

        self.prefix_cache.insert(prompt, contents)
        return PromptForward(prompt, RunnerOutput(output.logits, kept), cache, start)
