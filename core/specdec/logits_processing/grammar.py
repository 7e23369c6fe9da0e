"""Grammar-constrained decoding with llguidance: each verify row is masked with the grammar's
state after that row's own prefix, and drafts the grammar forbids are cut before the forward.

llguidance (Microsoft's Rust engine behind Guidance, one of vLLM's structured-output backends)
was chosen over xgrammar because it has no runtime dependencies (one 3 MB abi3 wheel; xgrammar
pulls torch, transformers and triton pins of its own), compiles lazily (a schema is ready in
about a millisecond, so nothing needs precompiling per tokenizer), and its matcher rolls back
and validates token runs: exactly what walking a draft chain or tree needs.
"""

from __future__ import annotations

import copy
import json
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from specdec.errors import ConfigError, SpecdecError
from specdec.logits_processing.processor import LogitsProcessor
from specdec.logits_processing.rows import VerifyRows
from specdec.structured_outputs import StructuredOutputsParams

_BITS = torch.arange(32, dtype=torch.int32)


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError as exc:  # an optional extra
        raise ConfigError(
            "structured_outputs: needs llguidance (pip install 'specdec[structured]')"
        ) from exc
    return llguidance


def llguidance_tokenizer(tokenizer: Any, vocab_size: int, eos_ids: Sequence[int]) -> Any:
    """llguidance's view of ``tokenizer`` over the model's ``vocab_size`` rows.

    A Hugging Face tokenizer backed by the Rust ``tokenizers`` library with a byte-level or
    SentencePiece-style decoder is read whole; any other tokenizer is read token by token (right
    for tokenizers whose tokens decode alone, such as character-level ones).
    """
    llguidance = _llguidance()
    eos = sorted(eos_ids) or None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        # The Rust tokenizer as JSON (what llguidance.hf does, for any class that has one).
        backend = copy.copy(backend)
        backend.no_padding()
        backend.no_truncation()
        try:
            return llguidance.LLTokenizer(backend.to_str(), n_vocab=vocab_size, eos_token=eos)
        except ValueError:  # a decoder llguidance does not know
            pass

    class _ByToken:
        eos_token_id = tokenizer.eos_token_id
        bos_token_id = getattr(tokenizer, "bos_token_id", None)
        tokens = [tokenizer.decode([i]).encode() for i in range(len(tokenizer))]
        special_token_ids = list(getattr(tokenizer, "all_special_ids", []))

        def __call__(self, text: str) -> list[int]:
            return tokenizer.encode(text, add_special_tokens=False)

    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByToken()), n_vocab=vocab_size, eos_token=eos)


class GrammarCompiler:
    """Compiles a request's :class:`StructuredOutputsParams` into an llguidance matcher; each
    distinct constraint is compiled once (the newest ``max_cached`` are kept) and every request
    gets a copy of the compiled matcher."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: Sequence[int], max_cached: int = 256) -> None:
        if tokenizer is None:
            raise ConfigError("structured_outputs: needs a tokenizer")
        self._tokenizer_source = (tokenizer, vocab_size, list(eos_ids))
        self._tokenizer: Any = None
        self.eos_ids = frozenset(eos_ids)
        self.vocab_size = vocab_size
        self.max_cached = max_cached
        self._compiled: OrderedDict[str, Any] = OrderedDict()
        #: Compilations so far (cache misses).
        self.compilations = 0

    def grammar_text(self, spec: StructuredOutputsParams) -> str:
        """llguidance's grammar for ``spec``; a :class:`ConfigError` naming the field if it is malformed."""
        llguidance = _llguidance()
        kind = spec.kind
        try:
            if kind in ("json", "json_object"):
                schema = {"type": "object"} if kind == "json_object" else spec.json_schema
                return llguidance.LLMatcher.grammar_from_json_schema(
                    schema if isinstance(schema, str) else json.dumps(schema),
                    defaults={"whitespace_flexible": spec.whitespace_flexible},
                )
            if kind == "choice":
                return llguidance.grammar_from("choice", json.dumps(spec.choice))
            return llguidance.grammar_from("regex" if kind == "regex" else "grammar", spec.value)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"structured_outputs.{kind}: {_first_line(str(exc))}") from None

    def matcher(self, spec: StructuredOutputsParams) -> Any:
        """A fresh matcher at the start of ``spec``'s grammar."""
        grammar = self.grammar_text(spec)
        compiled = self._compiled.get(grammar)
        if compiled is None:
            llguidance = _llguidance()
            if self._tokenizer is None:
                self._tokenizer = llguidance_tokenizer(*self._tokenizer_source)
            compiled = llguidance.LLMatcher(self._tokenizer, grammar, log_level=0)
            if compiled.is_error():
                raise ConfigError(f"structured_outputs.{spec.kind}: {_first_line(compiled.get_error())}")
            self.compilations += 1
            self._compiled[grammar] = compiled
            if len(self._compiled) > self.max_cached:
                self._compiled.popitem(last=False)
        else:
            self._compiled.move_to_end(grammar)
        return compiled.deep_copy()

    def processor(self, spec: StructuredOutputsParams) -> Grammar:
        return Grammar(self.matcher(spec), self.vocab_size, self.eos_ids)


def _first_line(message: str) -> str:
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    return " ".join(lines[:3]) if lines else "invalid"


class Grammar(LogitsProcessor):
    """Masks every token the grammar does not allow after each row's prefix.

    Once the output has an EOS token (the grammar is complete and ``ignore_eos`` let it go on),
    nothing is masked any more, as in vLLM.
    """

    def __init__(self, matcher: Any, vocab_size: int, eos_ids: frozenset[int]) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.eos_ids = eos_ids
        self.terminated = False

    def _positions(self, rows: VerifyRows) -> Iterator[tuple[int, bool]]:
        """Move the matcher to each row's prefix in turn: ``(row, constrained)``; a row past an
        EOS or past a token the grammar forbids is not constrained (it is unreachable or done).
        The matcher is back at the committed tokens afterwards."""
        consumed: tuple[int, ...] = ()
        try:
            for row, path in enumerate(rows.paths):
                if self.terminated:
                    yield row, False
                    continue
                common = 0
                while common < min(len(consumed), len(path)) and consumed[common] == path[common]:
                    common += 1
                if len(consumed) > common:
                    self.matcher.rollback(len(consumed) - common)
                    consumed = consumed[:common]
                rest = list(path[common:])
                if any(t in self.eos_ids for t in rest) or self.matcher.validate_tokens(rest) < len(rest):
                    yield row, False
                    continue
                if rest:
                    self.matcher.consume_tokens(rest)
                consumed = path
                yield row, True
        finally:
            if consumed:
                self.matcher.rollback(len(consumed))

    def apply(self, logits: torch.Tensor, rows: VerifyRows) -> torch.Tensor:
        words = (self.vocab_size + 31) // 32
        bitmask = torch.zeros(len(rows), words, dtype=torch.int32)
        constrained = []
        for row, ok in self._positions(rows):
            if ok:
                target = bitmask[row]
                self.matcher.unsafe_compute_mask_ptr(target.data_ptr(), words * 4)
                constrained.append(row)
        if constrained:
            bits = (bitmask[constrained, :, None] >> _BITS) & 1
            allowed = bits.reshape(len(constrained), -1)[:, : logits.shape[-1]].bool().to(logits.device)
            index = torch.tensor(constrained, device=logits.device)
            logits[index] = logits[index].masked_fill(~allowed, float("-inf"))
        return logits

    def usable_drafts(self, rows: VerifyRows) -> int:
        children: dict[int, list[int]] = {}
        for node in range(len(rows.drafts)):
            children.setdefault(rows.row_parent(node + 1), []).append(node)
        first_bad = len(rows.drafts)
        for row, ok in self._positions(rows):
            if not ok:
                continue
            for node in children.get(row, ()):
                token = rows.drafts[node]
                valid = self.matcher.is_accepting() if token in self.eos_ids else self.matcher.validate_tokens([token]) == 1
                if not valid:
                    first_bad = min(first_bad, node)
        return first_bad

    def accept(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            if self.terminated:
                return
            if token in self.eos_ids:
                self.terminated = True
            elif not self.matcher.consume_token(token):
                raise SpecdecError(f"structured_outputs: token {token} does not follow the grammar: "
                                   f"{_first_line(self.matcher.get_error())}")
