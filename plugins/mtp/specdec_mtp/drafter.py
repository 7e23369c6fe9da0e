"""Chain drafting with MTP layers, each depth keeping its own KV cache per request.

Depth ``k`` (1-based; layer ``min(k, n) - 1`` of ``n`` loaded layers, the last one reused past
``n`` as vLLM does) at position ``i`` reads depth ``k - 1``'s output there (for ``k = 1`` the
target's final hidden state, after its final norm, as vLLM feeds ``deepseek_mtp``) and token
``i + k``. With ``N`` tokens known, the target's states cover positions ``0 .. N - 2`` (token
``N - 1`` is forwarded with the drafts), so each draft step ``k`` runs depth ``k`` over its
uncached positions up to ``N - 2`` and drafts token ``N - 1 + k``
from the last one. Positions ``i >= N - k`` read a drafted token; they are rolled back (cropped)
after the step, so every cache holds only positions built from true tokens and states, and the
next step recomputes them from the accepted tokens (catch-up). Each depth also keeps its true
outputs that the next depth has not cached yet, since that depth reads them.

The target's states come from its own forwards at no extra cost: the prefill covers the prompt,
and each verify forward covers the last token and the drafts, of which ``accept`` keeps the rows
of the tokens that stayed.

With relaxed acceptance on, each request also tracks whether its tokens leave a thinking span
open (:class:`~specdec_mtp.relaxed.ThinkingSpan`), for the plugin's ``specdec_verify``.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specdec import (
    ConfigError,
    DraftProposal,
    HiddenStateResources,
    Request,
    TargetContext,
    VerifyResult,
    draft_vocabulary,
    drafter_checkpoint,
    is_default_model,
    pick_drafts,
    prepack_linears,
    trimmed_projection,
)
from specdec_mtp.checkpoint import load_mtp_layers
from specdec_mtp.config import MTPDecodingConfig
from specdec_mtp.layer import LatentCache, MTPLayer, block_classes
from specdec_mtp.relaxed import ThinkingSpan, thinking_tokens

logger = logging.getLogger(__name__)


@dataclass
class Depth:
    """One depth's cache and its true outputs for positions ``start`` .. ``cache.length - 1``
    (``start`` is the next depth's cache length)."""

    cache: LatentCache = field(default_factory=LatentCache)
    outputs: torch.Tensor | None = None
    start: int = 0


@dataclass
class MTPState:
    """One request's depths, the target's final states for positions ``target_start`` on, and its
    thinking span when relaxed acceptance is on."""

    depths: list[Depth]
    target: list[torch.Tensor]
    target_start: int = 0
    thinking: ThinkingSpan | None = None


#: The MTP layer trained for the default target (``specdec train mtp``; docs/mtp.md has the recipe).
SHIPPED_LAYER = Path(__file__).resolve().parent / "weights" / "smollm2-mtp"


def checkpoint_dir(config: MTPDecodingConfig, target: TargetContext) -> Path:
    """``speculative_model``; else, for the default target (which has no MTP layers), the layer
    this package ships for it; else the directory the target was loaded from."""
    if not config.speculative_model and is_default_model(target.model):
        return Path(drafter_checkpoint(None, target.model, SHIPPED_LAYER, "an MTP layer", "specdec-plugin-mtp"))
    source = config.speculative_model or getattr(target.model, "name_or_path", "") or ""
    path = Path(source)
    if not source or not path.is_dir():
        raise ConfigError(
            "speculative_model: the MTP layers are read from the target's checkpoint directory, but the target was "
            f"not loaded from a local directory ({source!r}); set speculative_model to the directory that holds them"
        )
    return path


def layer_count(config: MTPDecodingConfig, target: TargetContext, directory: Path) -> int:
    """``num_nextn_predict_layers``: the option, else that of the ``config.json`` in ``directory``
    (a ``specdec train mtp`` export, or the target's own checkpoint), else the target config's."""
    saved = directory / "config.json"
    stored = json.loads(saved.read_text()).get("num_nextn_predict_layers") if saved.is_file() else None
    count = config.num_nextn_predict_layers or stored or getattr(target.model.config, "num_nextn_predict_layers", 0) or 0
    if count < 1:
        raise ConfigError(
            "num_nextn_predict_layers: the target's config has no MTP layers (num_nextn_predict_layers is 0 or absent); "
            "set the option if the checkpoint holds them"
        )
    return count


class MTPResources(HiddenStateResources):
    """The loaded MTP layers and per-request :class:`MTPState` in ``request.method_state``."""

    def __init__(self, config: MTPDecodingConfig, target: TargetContext) -> None:
        super().__init__(target)
        target_config = target.model.config
        block_classes(target_config)  # an architecture MTP blocks cannot be built for fails first
        directory = checkpoint_dir(config, target)
        layers = load_mtp_layers(directory, target_config, layer_count(config, target, directory))
        self.config = config
        self.layers = [layer.to(target.device, target.dtype) for layer in layers]
        for layer in self.layers:
            prepack_linears(layer)
            if layer.shared_head.head is None:
                layer.shared_head.head = target.model.get_output_embeddings()
        #: The target ids the layers draft over (a draft vocabulary), ``None`` for all of them; the
        #: layer shipped for the default target drafts over the shipped one unless told otherwise.
        self.kept = draft_vocabulary(config, target, shipped=not config.speculative_model and is_default_model(target.model))
        if self.kept is not None:
            trimmed: dict[int, torch.nn.Module] = {}  # layers sharing a head share its trimmed copy
            for layer in self.layers:
                head = layer.shared_head.head
                if id(head) not in trimmed:
                    trimmed[id(head)] = trimmed_projection(head, self.kept)
                layer.shared_head.head = trimmed[id(head)]
            self.kept = self.kept.to(target.device)
        self.vocab_size = target.vocab_size
        self.target_embed = target.model.get_input_embeddings()
        self.rotary = target.model.get_decoder().rotary_emb
        self.device = target.device
        #: Seconds spent so far on depths' catch-ups longer than a steady step's (:meth:`setup_seconds`).
        self._setup_seconds = 0.0
        #: The thinking span's begin and end token ids, when relaxed acceptance is on.
        self.thinking: tuple[int, int] | None = None
        if not config.lossless:
            self.thinking = thinking_tokens(
                config.begin_thinking_phase_token, config.end_thinking_phase_token, target.tokenizer, target.vocab_size
            )
            logger.warning(
                "MTP relaxed acceptance is on: output inside thinking spans is NOT the target's "
                "(relaxed_topk=%s, relaxed_delta=%s, thinking tokens %s..%s)",
                config.relaxed_topk, config.relaxed_delta, *self.thinking,
            )

    def layer(self, depth: int) -> MTPLayer:
        """The layer of draft depth ``depth`` (1-based): the last one past the loaded count."""
        return self.layers[min(depth, len(self.layers)) - 1]

    def add_request(self, request: Request) -> None:
        depths = [Depth() for _ in range(self.config.max_draft_len)]
        thinking = ThinkingSpan(*self.thinking) if self.thinking else None
        request.method_state = MTPState(depths, [request.target_output.hidden_states[-1]], thinking=thinking)

    def setup_seconds(self) -> float:
        """Time spent taking in a new request's prompt, or the positions of steps drafting was
        paused for: the engine's policy charges it to resuming, not to each drafted token."""
        return self._setup_seconds

    def release(self) -> None:
        self.layers = self.target_embed = self.rotary = None
        super().release()

    def commit(self, request: Request, result: VerifyResult) -> None:
        """Queue the target's final states of the last token and the accepted drafts."""
        if not request.finished:
            request.method_state.target.append(request.target_output.hidden_states[-1][: result.num_accepted + 1])

    @torch.inference_mode()
    def propose(self, request: Request) -> DraftProposal:
        """A chain of up to ``request.max_draft_len`` tokens: argmax, or sampled with its distributions."""
        length = min(self.config.max_draft_len, request.max_draft_len)
        if length <= 0:
            return DraftProposal()
        state: MTPState = request.method_state
        known = len(request.token_ids)
        tokens = list(request.token_ids)
        previous = torch.cat(state.target) if len(state.target) > 1 else state.target[0]
        previous_start = state.target_start
        if previous_start + previous.shape[0] != known - 1:
            raise RuntimeError(f"MTP state out of step: target states to {previous_start + previous.shape[0]} for {known} tokens")
        drafts: list[int] = []
        probs: list[torch.Tensor] = []
        for k in range(1, length + 1):
            depth = state.depths[k - 1]
            start = depth.cache.length
            began = time.perf_counter()
            out = self._run(k, tokens[start + k : known - 1 + k], previous[start - previous_start :], start, depth.cache)
            # A steady step leaves depth k at most max_draft_len + k positions behind.
            if known - 1 - start > self.config.max_draft_len + k:
                self._setup_seconds += time.perf_counter() - began
            token, dist = self._choose(self.layer(k).logits(out[-1]), request, k - 1)
            tokens.append(token)
            drafts.append(token)
            if dist is not None:
                probs.append(dist)
            true_end = max(known - k, start)
            depth.cache.crop(true_end)
            if depth.outputs is not None:
                previous = torch.cat((depth.outputs, out))
                previous_start = depth.start
            else:
                previous, previous_start = out, start
            # Keep what the next depth will read at its next catch-up: its uncached true positions.
            keep = state.depths[k].cache.length if k < len(state.depths) else true_end
            depth.outputs = previous[keep - previous_start : true_end - previous_start]
            depth.start = keep
        first = state.depths[0].cache.length
        target = torch.cat(state.target)
        state.target = [target[first - state.target_start :]]
        state.target_start = first
        return DraftProposal(drafts, torch.stack(probs) if probs else None)

    def _run(self, k: int, token_ids: list[int], previous: torch.Tensor, start: int, cache: LatentCache) -> torch.Tensor:
        """Depth ``k`` over positions ``start`` on; returns its outputs ``[T, hidden]``."""
        layer = self.layer(k)
        ids = torch.tensor([token_ids], device=self.device)
        embeds = (layer.embed_tokens or self.target_embed)(ids)
        positions = torch.arange(start, start + len(token_ids), device=self.device)[None]
        rotary = self.rotary(embeds, positions)
        return layer(embeds, previous[None], positions, rotary, cache)[0]

    def _choose(self, logits: torch.Tensor, request: Request, offset: int) -> tuple[int, torch.Tensor | None]:
        """The draft for position ``len(request.token_ids) + offset`` from logits over the draft
        vocabulary; a sampled one returns its distribution over the target's."""
        return pick_drafts(logits[None], [request], [offset], self.kept, self.vocab_size)[0]
