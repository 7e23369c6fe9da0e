"""Build a head for a target and train it with the training-time test on the core loop; export in a published layout."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch
from transformers import LlamaConfig

from specdec import ConfigError
from specdec.training import Position, Scores, StepReport, TrainingOptions, World, collate, sum_across
from specdec.training import fit as train
from specdec_eagle3.checkpoint import save_head
from specdec_eagle3.head import Eagle3Head, Eagle3HeadConfig
from specdec_eagle3.training.ttt import TTTResult, agreement, chain_walk, ttt_forward

#: Target config fields the head's decoder layer copies (attention shape, MLP, norms, RoPE, vocabulary).
_LAYER_FIELDS = (
    "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act",
    "rms_norm_eps", "max_position_embeddings", "rope_theta", "rope_parameters", "rope_scaling", "vocab_size",
    "bos_token_id", "eos_token_id", "pad_token_id",
)


def new_head(target_config: dict[str, Any], layers: tuple[int, ...], d2t: torch.Tensor, t2d: torch.Tensor,
             target_weights: dict[str, torch.Tensor] | None = None, seed: int = 0, num_layers: int = 1) -> Eagle3Head:
    """A fresh head of ``num_layers`` decoder layers shaped like the target's, over the calibrated
    draft vocabulary.

    With ``target_weights`` (``norm.weight``, ``lm_head.weight``) the head's final norm and output
    layer start as the target's own, restricted to the draft vocabulary: the head then begins by
    reading its state the way the target reads its final state, which speeds up early training.
    """
    fields = {k: target_config[k] for k in _LAYER_FIELDS if target_config.get(k) is not None}
    llama = LlamaConfig(**fields, num_hidden_layers=1, tie_word_embeddings=False, attention_bias=False, mlp_bias=False)
    config = Eagle3HeadConfig(
        llama=llama,
        draft_vocab_size=int(d2t.numel()),
        target_hidden_size=int(target_config["hidden_size"]),
        num_fused_layers=len(layers),
        layers_to_capture=tuple(layers),
        num_layers=num_layers,
    )
    torch.manual_seed(seed)
    head = Eagle3Head(config)
    with torch.no_grad():
        head.d2t.copy_(d2t)
        head.t2d.copy_(t2d)
        if target_weights is not None:
            head.norm.weight.copy_(target_weights["norm.weight"].float())
            head.lm_head.weight.copy_(target_weights["lm_head.weight"].float()[head.draft_to_target()])
    return head


def with_draft_vocabulary(head: Eagle3Head, d2t: torch.Tensor, t2d: torch.Tensor, target_lm_head: torch.Tensor) -> Eagle3Head:
    """``head`` moved onto a new draft vocabulary (``d2t``, ``t2d``), to continue training on new data.

    Everything but the output layer is kept. An output row of a token the old vocabulary had keeps
    its training. A token new to the draft vocabulary starts from the target's output row for it,
    carried into the head's space by the linear map that best takes the target's rows to the
    head's trained rows over the tokens both have (least squares). The target's rows as they are
    would not do: training moves the head's output space away from the target's, and raw target
    rows then outscore the trained ones (a continued SmolLM2 head's agreement fell from 0.42 to
    0.0 with them, and to 0.39 with the mapped rows). The result is float32, in training mode.
    """
    config = replace(head.config, draft_vocab_size=int(d2t.numel()))
    moved = Eagle3Head(config, with_embedding=head.embed_tokens is not None)
    old_ids = head.draft_to_target().cpu()
    old_row = torch.full((config.vocab_size,), -1, dtype=torch.long)
    old_row[old_ids] = torch.arange(old_ids.numel())
    new_ids = torch.arange(d2t.numel()) + d2t.cpu()
    rows = old_row[new_ids]
    kept = rows >= 0
    target_rows = target_lm_head.detach().float().cpu()
    trained_rows = head.lm_head.weight.detach().float().cpu()
    to_head = torch.linalg.lstsq(target_rows[old_ids], trained_rows).solution
    weight = target_rows[new_ids] @ to_head
    weight[kept] = trained_rows[rows[kept]]
    # load_state_dict copies into the new head's float32 CPU tensors, whatever the source's dtype.
    moved.load_state_dict({**head.state_dict(), "lm_head.weight": weight, "d2t": d2t, "t2d": t2d})
    return moved.train()


def with_more_layers(head: Eagle3Head, num_layers: int, seed: int = 0) -> Eagle3Head:
    """``head`` with decoder layers appended until it has ``num_layers``, computing what it computed.

    Each new layer's output projections (attention ``o_proj``, MLP ``down_proj``) start at zero,
    so it adds nothing to its residual stream until training moves them: the grown head starts
    at the trained head's agreement instead of below it. The result is float32, in training mode.
    """
    if num_layers < head.config.num_layers:
        raise ConfigError(f"--num-layers: the head to continue has {head.config.num_layers} layers; "
                          f"a head cannot lose layers, got {num_layers}")
    torch.manual_seed(seed)
    grown = Eagle3Head(replace(head.config, num_layers=num_layers), with_embedding=head.embed_tokens is not None)
    state = grown.state_dict()
    state.update(head.state_dict())
    for index in range(head.config.num_layers - 1, num_layers - 1):
        for name in (f"later_layers.{index}.self_attn.o_proj.weight", f"later_layers.{index}.mlp.down_proj.weight"):
            state[name] = torch.zeros_like(state[name])
    grown.load_state_dict(state)
    return grown.float().train()


@dataclass
class FitOptions(TrainingOptions):
    """The core loop's options with EAGLE-3's defaults, and the training-time test's own."""

    batch_size: int = 4
    lr: float = 1e-4
    warmup: int = 0
    #: Step ``k`` of the training-time test weighs ``decay ** k`` (the authors' 0.8).
    decay: float = 0.8
    max_grad_norm: float = 0.5
    #: The EAGLE-3 authors' AdamW betas.
    betas: tuple[float, float] = (0.9, 0.95)
    #: Unrolled training-time-test steps.
    ttt_steps: int = 7
    #: Share of each step's loss that is the cross-entropy with the target's greedy token.
    argmax_weight: float = 0.0


@dataclass
class Evaluation:
    """A head measured on held-out conversations, as in training but without learning."""

    #: Top-1 agreement with the target per TTT step.
    agreement: list[float]
    #: Tokens per step of greedy chained drafting of ``ttt_steps`` tokens over their replies
    #: (:func:`~specdec_eagle3.training.ttt.chain_walk`): on the target's own greedy replies, the
    #: acceptance length the engine measures.
    acceptance_length: float


class Eagle3Trainee:
    """An EAGLE-3 head as the core loop trains it (:class:`specdec.training.Trainee`): each batch's
    target signals come from ``source`` (``OfflineTarget``, a dump; ``OnlineTarget``, the target run
    beside the head), and the loss is the training-time test's. Held-out measurements take
    :func:`evaluate`'s agreement and predicted acceptance length."""

    def __init__(self, head: Eagle3Head, source: Any, options: FitOptions) -> None:
        self.module, self.source, self.options = head, source, options
        source.use_draft_vocabulary(head.draft_to_target())

    def parameters(self) -> dict[str, torch.Tensor]:
        return {name: p for name, p in self.module.named_parameters() if p.requires_grad}

    def shape(self) -> dict[str, Any]:
        return head_shape(self.module.config)

    def loss(self, batch: dict[str, torch.Tensor]) -> Scores:
        options = self.options
        result = _unroll(self.module, self.source, batch, options.ttt_steps, options.bf16, options.argmax_weight)
        result.total(options.decay).backward()
        return Scores([float(loss.detach()) * n for loss, n in zip(result.losses, result.counts)], result.correct, result.counts)

    def evaluate(self, dataset: torch.utils.data.Dataset, world: World) -> Evaluation:
        evaluation = evaluate(self.module, self.source, dataset, self.options, world)
        self.module.train()
        return evaluation


def head_shape(config: Eagle3HeadConfig) -> dict[str, Any]:
    """What a resumed run must match: the head's layers, the target layers it fuses, its draft vocabulary."""
    return {"num_layers": config.num_layers, "layers_to_capture": list(config.layers_to_capture or ()),
            "draft_vocab_size": config.draft_vocab_size, "target_hidden_size": config.target_hidden_size}


def describe_shape(shape: dict[str, Any]) -> str:
    return f"a head {shape}"


def fit(head: Eagle3Head, source: Any, dataset: torch.utils.data.Dataset, options: FitOptions, world: World,
        on_step: Callable[[StepReport], None] | None = None,
        heldout: torch.utils.data.Dataset | None = None) -> Position:
    """Train ``head`` in place on the core loop (:func:`specdec.training.fit`; held-out
    measurements at each epoch's end, every ``options.eval_every`` step and the last), without
    saving; where it stopped. The head is left in eval mode. (`specdec train eagle3 fit` saves and
    resumes through the core's ``run_training``.)"""
    at = train(Eagle3Trainee(head, source, options), dataset, options, world, None, None, on_step, None, heldout)
    head.eval()
    return at


@torch.no_grad()
def evaluate(head: Eagle3Head, source: Any, dataset: torch.utils.data.Dataset, options: FitOptions, world: World) -> Evaluation:
    """Top-1 agreement with the target per TTT step over ``dataset`` (each rank a share), as in
    training but always in float32, and the acceptance length of a chain of ``options.ttt_steps``
    drafts over its replies, which end at the target's end-of-sequence tokens."""
    head.eval()
    k = options.ttt_steps
    eos = head.config.llama.eos_token_id
    stop_ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    totals = [0.0] * (2 * k + 2)
    items = list(range(world.rank, len(dataset), world.size))
    for start in range(0, len(items), options.batch_size):
        batch = collate([dataset[i] for i in items[start : start + options.batch_size]])
        result = _unroll(head, source, batch, k, bf16=False)
        walk = chain_walk(result.hits, batch["loss_mask"], batch["input_ids"], stop_ids)
        totals = [t + v for t, v in zip(totals, [*result.correct, *result.counts, *walk])]
    totals = sum_across(totals, world)
    steps, accepted = totals[2 * k :]
    return Evaluation(agreement(totals[:k], totals[k : 2 * k]), 1 + accepted / steps if steps else 1.0)


def _unroll(head: Eagle3Head, source: Any, batch: dict[str, torch.Tensor], steps: int, bf16: bool,
            argmax_weight: float = 0.0) -> TTTResult:
    """The training-time test on one collated batch: the target's signals, then the head unrolled
    (under bfloat16 autocast with ``bf16``)."""
    signals = source.signals(batch)
    with torch.autocast(signals.input_ids.device.type, dtype=torch.bfloat16, enabled=bf16):
        return ttt_forward(head, source.embed, signals.input_ids, signals.loss_mask, signals.features,
                           signals.draft_logits, signals.target_argmax, steps, argmax_weight)


def export(head: Eagle3Head, output: str, layout: Literal["safeailab", "speculators"], dtype: torch.dtype,
           verifier: str | None, verifier_architectures: tuple[str, ...], speculative_tokens: int) -> None:
    """Write a copy of ``head`` cast to ``dtype`` (the head itself stays float32 for more training)."""
    shipped = copy.deepcopy(head).to(dtype)
    save_head(shipped, output, layout, verifier=verifier, verifier_architectures=verifier_architectures,
              speculative_tokens=speculative_tokens)
