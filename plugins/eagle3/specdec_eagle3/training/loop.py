"""Build a head for a target and train it with the training-time test; export in a published layout."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch
from transformers import LlamaConfig

from specdec import ConfigError
from specdec.training import (
    LengthGroupedBatches,
    World,
    average_gradients,
    broadcast_parameters,
    collate,
    conversation_lengths,
    sum_across,
    warmup_cosine,
)
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
class FitOptions:
    steps: int = 1000
    batch_size: int = 4
    lr: float = 1e-4
    warmup: int = 0
    ttt_steps: int = 7
    loss_decay: float = 0.8
    #: Share of each step's loss that is the cross-entropy with the target's greedy token.
    argmax_weight: float = 0.0
    max_grad_norm: float = 0.5
    seed: int = 0
    save_every: int = 0
    #: Measure held-out accuracy every this many steps (and at the end) when ``fit`` is given
    #: held-out conversations; 0: at the end only.
    eval_every: int = 0
    #: Batches of conversations of similar length (:class:`LengthGroupedBatches`) rather than
    #: shuffled ones: less padding to compute.
    group_by_length: bool = True
    #: Mixed precision: the head's matrix products in bfloat16 under ``torch.autocast``; its
    #: weights, optimizer state and losses stay float32. Held-out measurement stays float32, so
    #: it compares across runs either way.
    bf16: bool = False


@dataclass
class Evaluation:
    """A head measured on held-out conversations, as in training but without learning."""

    #: Top-1 agreement with the target per TTT step.
    agreement: list[float]
    #: Tokens per step of greedy chained drafting of ``ttt_steps`` tokens over their replies
    #: (:func:`~specdec_eagle3.training.ttt.chain_walk`): on the target's own greedy replies, the
    #: acceptance length the engine measures.
    acceptance_length: float


@dataclass
class StepReport:
    step: int
    loss: float
    accuracies: list[float]
    #: The head on the held-out conversations, on steps that measured it.
    heldout: Evaluation | None = None


def fit(
    head: Eagle3Head,
    source: Any,
    dataset: torch.utils.data.Dataset,
    options: FitOptions,
    world: World,
    on_step: Callable[[StepReport], None] | None = None,
    on_save: Callable[[int], None] | None = None,
    heldout: torch.utils.data.Dataset | None = None,
) -> StepReport:
    """Train ``head`` in place for ``options.steps`` optimizer steps; returns the last step's report.

    ``source`` turns a batch into target signals (``OfflineTarget`` or ``OnlineTarget``). Each rank
    reads its own share of ``dataset``; gradients are averaged over ranks before each step.
    ``on_save(step)`` is called on rank 0 every ``options.save_every`` steps and at the end.
    With ``heldout`` conversations, the report of every ``options.eval_every``-th step and of the
    last carries the head's per-step top-1 agreement and predicted acceptance length on them
    (:func:`evaluate`): training accuracy alone cannot tell learning from memorizing.
    """
    head.train()
    broadcast_parameters(head, world)
    source.use_draft_vocabulary(head.draft_to_target())
    params = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=options.lr, betas=(0.9, 0.95), weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(options.steps, options.warmup))
    sampler: LengthGroupedBatches | torch.utils.data.DistributedSampler
    if options.group_by_length:
        sampler = LengthGroupedBatches(conversation_lengths(dataset), options.batch_size, world, options.seed)
        loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=collate)
    else:
        sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=world.size, rank=world.rank, shuffle=True,
                                                      seed=options.seed, drop_last=world.distributed)
        loader = torch.utils.data.DataLoader(dataset, batch_size=options.batch_size, sampler=sampler, collate_fn=collate)
    if len(loader) == 0:
        raise ConfigError(f"the training data holds {len(dataset)} conversations: too few for a batch of "
                          f"{options.batch_size} on each of {world.size} processes")
    epoch, batches, report = 0, iter(()), StepReport(0, float("nan"), [])
    for step in range(1, options.steps + 1):
        batch = next(batches, None)
        if batch is None:
            sampler.set_epoch(epoch)
            epoch += 1
            batches = iter(loader)
            batch = next(batches)
        result = _unroll(head, source, batch, options.ttt_steps, options.bf16, options.argmax_weight)
        loss = result.total(options.loss_decay)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        average_gradients(params, world)
        torch.nn.utils.clip_grad_norm_(params, options.max_grad_norm)
        optimizer.step()
        scheduler.step()
        totals = sum_across([float(loss.detach()), *result.correct, *result.counts], world)
        k = options.ttt_steps
        correct, counts = totals[1 : 1 + k], totals[1 + k :]
        report = StepReport(step, totals[0] / world.size, agreement(correct, counts))
        if heldout is not None and (step == options.steps or (options.eval_every and step % options.eval_every == 0)):
            report.heldout = evaluate(head, source, heldout, options, world)
            head.train()
        if on_step is not None and world.is_main:
            on_step(report)
        if on_save is not None and world.is_main and (step == options.steps or (options.save_every and step % options.save_every == 0)):
            on_save(step)
    head.eval()
    return report


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
