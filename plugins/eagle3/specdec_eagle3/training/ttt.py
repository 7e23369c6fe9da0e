"""EAGLE-3's training-time test: the head unrolled on its own outputs, as it drafts at inference.

Notation for one sequence: tokens ``x_0 .. x_{T-1}``, fused target features ``f_t`` and the
target's next-token logits ``z_t`` at position ``t`` (they describe token ``t + 1``).

- Step 0, position ``t``: the head reads ``(fc(f_t), embed(x_{t+1}))`` at rotary position ``t``
  and predicts token ``t + 2`` (target: ``z_{t+1}``), attending causally to step-0 positions
  ``<= t``. This is the plain EAGLE pair.
- Step ``k >= 1``, position ``t``: the head reads its own step ``k - 1`` output at ``t`` in place of
  target features, with the true token ``x_{t+1+k}``, at rotary position ``t + k``, and predicts
  token ``t + 2 + k`` (target ``z_{t+1+k}``). It attends to step-0 positions ``<= t`` and to its own
  earlier steps *at the same position* ``t`` only: exactly what a chained draft from anchor ``t``
  sees at inference (the true prefix in the head's cache, then its own drafts).

So step ``k``'s keys form a block diagonal beside the causal step-0 block (:func:`unrolled_mask`), as
in the EAGLE-3 authors' ``cnets.py`` and ModelOpt's ``eagle_ttt_steps``.

The loss of each step is the cross-entropy from the target's next-token distribution restricted
to the draft vocabulary (renormalized) to the head's, on positions whose predicted token is an
assistant token and whose target argmax lies in the draft vocabulary; step ``k`` is weighted
``decay ** k`` (0.8 in the authors' code, 0.9 in ModelOpt). ``argmax_weight`` mixes in the
cross-entropy with the target's greedy token, the only token greedy drafting is judged on.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

import torch

from specdec import greedy_tokens
from specdec_eagle3.head import Eagle3Head, HeadCache


class ConcatLayerCache:
    """One decoder layer's keys/values across unrolled steps, concatenated out of place so autograd
    keeps every step's keys (the inference ``specdec.kv_cache.RequestKV`` writes in place)."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.length = 0

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys = keys if self.keys is None else torch.cat((self.keys, keys), dim=-2)
        self.values = values if self.values is None else torch.cat((self.values, values), dim=-2)
        self.length += keys.shape[-2]
        return self.keys, self.values


def shift(x: torch.Tensor, k: int) -> torch.Tensor:
    """``x`` moved ``k`` positions left along dim 1 (``out[:, t] = x[:, t + k]``), zero-filled at the end."""
    if k == 0:
        return x
    out = torch.zeros_like(x)
    if k < x.shape[1]:
        out[:, : x.shape[1] - k] = x[:, k:]
    return out


@dataclass
class TTTResult:
    """Per unrolled step: the loss, the top-1 agreement with the target, the positions scored and
    the head's output states ``[B, T, hidden]`` (autograd keeps them anyway).

    ``hits[b, t, k]``: step ``k`` from anchor ``t`` (the head reading token ``t + 1``) predicted the
    target's token ``t + 2 + k``; False where that step scored nothing."""

    losses: list[torch.Tensor] = field(default_factory=list)
    hiddens: list[torch.Tensor] = field(default_factory=list)
    correct: list[int] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    hits: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 0, 0, dtype=torch.bool))

    def total(self, decay: float) -> torch.Tensor:
        return sum(decay**k * loss for k, loss in enumerate(self.losses))

    @property
    def accuracies(self) -> list[float]:
        return agreement(self.correct, self.counts)


def agreement(correct: Sequence[float], counts: Sequence[float]) -> list[float]:
    """Top-1 agreement per step from correct and scored counts (0 where a step scored nothing)."""
    return [c / n if n else 0.0 for c, n in zip(correct, counts, strict=True)]


def chain_walk(hits: torch.Tensor, loss_mask: torch.Tensor, input_ids: torch.Tensor, stop_ids: Collection[int] = ()) -> tuple[int, int]:
    """``(steps, accepted)``: the drafting steps and accepted drafts of greedy chained drafting of
    ``hits.shape[-1]`` tokens over every reply of the batch, from the training-time test's ``hits``.

    A reply is a run of assistant tokens (``loss_mask``) up to its first stop token (``stop_ids``,
    the target's end of turn): the engine stops there, and the template's tokens after it are
    never generated. The target writes a reply's first token itself; from then on each step
    drafts from the latest token, keeps the drafts up to the first the target disagrees with, and
    adds the target's own next token. The test feeds the true tokens and the head's own states,
    exactly what a chain sees while its drafts are accepted; so on the target's own greedy replies
    ``1 + accepted / steps`` is the acceptance length the engine measures on the same prompts.
    (On other text the engine would follow its own continuation from the first difference.)
    """
    depth = hits.shape[-1]
    stops = set(stop_ids)
    steps = accepted = 0
    for row_hits, row_mask, row_ids in zip(hits.cpu().tolist(), loss_mask.bool().cpu().tolist(), input_ids.cpu().tolist()):
        start = 0
        while start < len(row_mask):
            if not row_mask[start]:
                start += 1
                continue
            span = start
            while span + 1 < len(row_mask) and row_mask[span + 1]:
                span += 1
            end = next((p for p in range(start, span + 1) if row_ids[p] in stops), span)
            # A reply opens a conversation only in malformed data; its first token then has no anchor.
            anchor = max(start - 1, 0)
            while anchor + 2 <= end:
                run = 0
                while run < depth and anchor + 2 + run <= end and row_hits[anchor][run]:
                    run += 1
                steps += 1
                accepted += run
                anchor += run + 1
            start = span + 1
    return steps, accepted


def unrolled_rows(teach: torch.Tensor, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions some step ``1 .. steps - 1`` scores, per sequence, ascending and right-padded:
    ``rows [B, M]`` and ``live [B, M]`` (False on padding). Only these are unrolled past step 0; the
    rest (prompt tokens, mostly) would be computed for nothing."""
    needed = torch.zeros_like(teach)
    for k in range(1, steps):
        needed |= shift(teach, 1 + k)
    count = max(1, int(needed.sum(1).max()))
    rows = torch.argsort((~needed).to(torch.int8), dim=1, stable=True)[:, :count]
    return rows, needed.gather(1, rows)


def unrolled_mask(rows: torch.Tensor, length: int, step: int) -> torch.Tensor:
    """Boolean ``[B, 1, M, length + step * M]`` for unrolled step ``step >= 1`` over gathered
    ``rows``: row ``t`` sees step 0's positions ``<= t``, then itself at each earlier step."""
    batch, count = rows.shape
    prefix = torch.arange(length, device=rows.device)[None, None, :] <= rows[:, :, None]
    own = torch.eye(count, dtype=torch.bool, device=rows.device).expand(batch, count, count)
    return torch.cat([prefix, *[own] * step], dim=2)[:, None]


def ttt_forward(
    head: Eagle3Head,
    embed: Callable[[torch.Tensor], torch.Tensor],
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    features: torch.Tensor,
    draft_logits: torch.Tensor,
    target_argmax: torch.Tensor,
    steps: int,
    argmax_weight: float = 0.0,
) -> TTTResult:
    """Unroll ``head`` for ``steps`` steps over a right-padded batch.

    Step 0 runs over every position (its keys are every later step's context); steps from 1 on
    run only over the positions they score (:func:`unrolled_rows`), and each step's output layer
    and loss only over its scored positions. ``TTTResult.hiddens[k]`` is still ``[B, T, hidden]``,
    zero where step ``k`` did not run.

    :param embed: the target's input embedding (frozen).
    :param input_ids: ``[B, T]`` tokens; ``loss_mask`` ``[B, T]`` marks assistant tokens.
    :param features: ``[B, T, layers x target_hidden]`` fused target states.
    :param draft_logits: ``[B, T, draft_vocab]`` the target's logits at each position, restricted
        to the draft vocabulary (columns in draft-id order).
    :param target_argmax: ``[B, T]`` the target's greedy next token over its full vocabulary.
    :param argmax_weight: share of each step's loss that is the cross-entropy with the target's
        greedy token (in the draft vocabulary) rather than with its whole distribution.
    """
    batch, length = input_ids.shape
    device = input_ids.device
    # Target position s teaches when token s + 1 is the assistant's and the draft vocabulary has its argmax.
    teach = shift(loss_mask.bool(), 1) & head.t2d[target_argmax]
    target_p = torch.softmax(draft_logits.float(), dim=-1)
    target_pick = greedy_tokens(draft_logits)
    rows = torch.arange(length, device=device)[None].expand(batch, length)
    live = torch.ones_like(teach)
    sequence = torch.arange(batch, device=device)[:, None]
    cache = HeadCache(ConcatLayerCache)
    hidden = head.fuse(features)
    result = TTTResult(hits=torch.zeros(batch, length, steps, dtype=torch.bool, device=device))
    for k in range(steps):
        if k == 1:
            rows, live = unrolled_rows(teach, steps)
            hidden = hidden.gather(1, rows[..., None].expand(-1, -1, hidden.shape[-1]))
        # Row t of step k reads token t + 1 + k; the target's logits there describe its prediction.
        ahead = rows + 1 + k
        source = ahead.clamp(max=length - 1)
        embeds = embed(input_ids.gather(1, source)).to(hidden.dtype)
        # Step 0 is causal over the whole sequence: the head's default mask for an empty cache.
        mask = None if k == 0 else unrolled_mask(rows, length, k)
        hidden = head(embeds, hidden, rows + k, cache, mask)
        owner = sequence.expand_as(rows)
        if k == 0:
            result.hiddens.append(hidden)
        else:
            placed = hidden.new_zeros(batch, length, hidden.shape[-1])
            placed[owner[live], rows[live]] = hidden[live]
            result.hiddens.append(placed)
        scored = teach.gather(1, source) & (ahead < length) & live
        at = (owner[scored], source[scored])
        logq = torch.log_softmax(head.logits(hidden[scored]).float(), dim=-1)
        count = int(scored.sum())
        soft = -(target_p[at] * logq).sum()
        hard = -logq.gather(1, target_pick[at][:, None]).sum() if argmax_weight else 0.0
        result.losses.append(((1 - argmax_weight) * soft + argmax_weight * hard) / max(count, 1))
        with torch.no_grad():
            agree = greedy_tokens(logq) == target_pick[at]
            result.hits[owner[scored], rows[scored], k] = agree
            result.correct.append(int(agree.sum()))
        result.counts.append(count)
    return result
