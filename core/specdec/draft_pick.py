"""The draft-token pick every drafter makes: greedy, or sampled with the distribution it was drawn from.

A drafter's logits cover its own vocabulary: the target's, or a draft vocabulary of ``kept``
target ids (:mod:`specdec.draft_vocab`, EAGLE-3's ``d2t``). A greedy request takes the argmax,
mapped to its target id; one argmax serves the whole batch. A sampled request draws from its
logits placed at their target ids (``-inf`` elsewhere) and shaped by its own temperature, top-k
and top-p, and the draft carries that distribution. It is zero outside the kept tokens and over
the target's vocabulary, which is what the core's rejection sampling needs to stay lossless. A
seeded request draws with the noise the target's own pick at that position uses
(:meth:`~specdec.requests.Request.sample`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.draft_vocab import full_logits
from specdec.requests import Request
from specdec.sampling import greedy_tokens, logits_to_probs


def pick_drafts(
    logits: torch.Tensor,
    requests: Sequence[Request],
    offsets: Sequence[int],
    kept: torch.Tensor | None,
    vocab_size: int,
) -> list[tuple[int, torch.Tensor | None]]:
    """Row ``b`` of ``logits`` (``[rows, drafter vocab]``) picks ``requests[b]``'s token for
    sequence position ``len(token_ids) + offsets[b]``; returns ``(target id, distribution over the
    target's vocabulary or None for a greedy pick)`` per row. ``kept``: the target ids of the
    drafter's vocabulary, ``None`` when it is the target's."""
    greedy = greedy_tokens(logits)
    greedy = (greedy if kept is None else kept[greedy]).tolist()
    picks: list[tuple[int, torch.Tensor | None]] = []
    for request, row, offset, token in zip(requests, logits, offsets, greedy, strict=True):
        if request.params.greedy:
            picks.append((token, None))
            continue
        dist = logits_to_probs(full_logits(row.float(), kept, vocab_size), request.params)
        picks.append((request.sample(dist, offset), dist))
    return picks
