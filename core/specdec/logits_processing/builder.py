"""Builds each request's logits processors from its sampling parameters and the plugins."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pluggy

from specdec.errors import ConfigError, PluginError, SpecdecError
from specdec.logits_processing.grammar import GrammarCompiler
from specdec.logits_processing.penalties import Penalties
from specdec.logits_processing.processor import LogitsProcessor, RequestProcessors
from specdec.logits_processing.token_rules import BadWords, LogitBias, MinTokens, bad_word_sequences
from specdec.resources import TargetContext
from specdec.sampling import SamplingParams


class LogitsProcessing:
    """The engine's maker of :class:`RequestProcessors`; ``None`` for a request that needs none
    (the common case costs nothing per step)."""

    def __init__(self, target: TargetContext, eos_ids: Sequence[int], hook: pluggy.HookRelay) -> None:
        self.target = target
        self.vocab_size = target.runner.vocab_size
        self.eos_ids = sorted(eos_ids)
        self.hook = hook
        self._grammars: GrammarCompiler | None = None

    @property
    def grammars(self) -> GrammarCompiler:
        if self._grammars is None:
            self._grammars = GrammarCompiler(self.target.tokenizer, self.vocab_size, self.eos_ids)
        return self._grammars

    def for_request(self, prompt_ids: Sequence[int], params: SamplingParams) -> RequestProcessors | None:
        """The processors ``params`` ask for; a :class:`ConfigError` naming the field for one that
        cannot apply to this model, a :class:`PluginError` naming a plugin whose hook failed."""
        processors: list[LogitsProcessor] = []
        device = self.target.device
        if params.structured_outputs is not None:
            processors.append(self.grammars.processor(params.structured_outputs))
        if params.bad_words:
            if self.target.tokenizer is None:
                raise ConfigError("bad_words: needs a tokenizer")
            processors.append(BadWords(bad_word_sequences(self.target.tokenizer, params.bad_words)))
        if params.logit_bias:
            outside = [t for t in params.logit_bias if not 0 <= t < self.vocab_size]
            if outside:
                raise ConfigError(f"logit_bias: token id {outside[0]} is outside the vocabulary [0, {self.vocab_size})")
            processors.append(LogitBias(params.logit_bias, self.vocab_size, device))
        if params.min_tokens:
            stops = [*params.stop_token_ids, *([] if params.ignore_eos else self.eos_ids)]
            processors.append(MinTokens(params.min_tokens, [t for t in stops if 0 <= t < self.vocab_size]))
        if params.repetition_penalty != 1.0 or params.frequency_penalty or params.presence_penalty:
            processors.append(Penalties(
                prompt_ids, self.vocab_size, device, repetition=params.repetition_penalty,
                frequency=params.frequency_penalty, presence=params.presence_penalty,
            ))
        processors += self._from_plugins(params)
        return RequestProcessors(processors) if processors else None

    def _from_plugins(self, params: SamplingParams) -> list[LogitsProcessor]:
        processors: list[LogitsProcessor] = []
        for impl in self.hook.specdec_logits_processors.get_hookimpls():
            try:
                made: Any = impl.function(params=params, target=self.target)
            except SpecdecError:
                raise
            except Exception as exc:
                raise PluginError(f"plugin {impl.plugin_name!r} failed in specdec_logits_processors: "
                                  f"{type(exc).__name__}: {exc}") from exc
            if made is None:
                continue
            if not isinstance(made, (list, tuple)) or not all(isinstance(p, LogitsProcessor) for p in made):
                raise PluginError(f"plugin {impl.plugin_name!r}: specdec_logits_processors must return a list of "
                                  f"LogitsProcessor or None, got {type(made).__name__}")
            processors += made
        return processors
