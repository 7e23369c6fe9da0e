"""The core's chained objective (MLP speculator, ReDrafter, Medusa): its losses, hits and gradients
equal a plain computation of the same teacher-forced chain, whatever the chunk size, for a state
the drafter shapes and for a constant one."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from specdec.training import chained_loss, shifted

B, T, D, V, POSITIONS = 2, 9, 6, 13, 3


def _drafter(seed: int = 0) -> torch.nn.ModuleDict:
    torch.manual_seed(seed)
    return torch.nn.ModuleDict({"embed": torch.nn.Embedding(V, D), "step": torch.nn.Linear(2 * D, D),
                                "out": torch.nn.ModuleList(torch.nn.Linear(D, V) for _ in range(POSITIONS))})


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (B, T), generator=g)
    mask = torch.rand(B, T, generator=g) > 0.3
    mask[1, -2:] = False  # padding
    return torch.randn(B, T, D, generator=g), ids, mask


def _functions(drafter, ids, chained: bool):
    def advance(k, state):
        if not chained:
            return state
        return torch.tanh(drafter["step"](torch.cat([state, drafter["embed"](shifted(ids, k + 1))], -1)))

    return advance, lambda k, states, rows: drafter["out"][k](states)


def _reference(drafter, hidden, ids, mask, chained: bool, decay: float):
    """The same chain, all positions at once, one loss for backward."""
    advance, logits = _functions(drafter, ids, chained)
    state, total, losses = hidden, 0.0, []
    for k in range(POSITIONS):
        state = advance(k, state)
        scored = shifted(mask, k + 2, False)
        loss = F.cross_entropy(logits(k, state[scored], None), shifted(ids, k + 2)[scored])
        total = total + decay**k * loss
        losses.append(float(loss.detach()))
    total.backward()
    return losses


@pytest.mark.parametrize("chained", [True, False], ids=["chained-state", "constant-state"])
@pytest.mark.parametrize("chunk", [1, 4, 1000])
def test_chained_loss_equals_a_plain_computation(chained: bool, chunk: int) -> None:
    hidden, ids, mask = _batch()
    ours, reference = _drafter(), _drafter()
    advance, logits = _functions(ours, ids, chained)
    scores = chained_loss(advance, logits, hidden, ids, mask, POSITIONS, decay=0.7, chunk=chunk, backward=True,
                          keep_hits=True)
    expected = _reference(reference, hidden, ids, mask, chained, 0.7)
    assert [s / c for s, c in zip(scores.loss_sums, scores.counts)] == pytest.approx(expected, rel=1e-5)
    for (name, a), (_, b) in zip(ours.named_parameters(), reference.named_parameters()):
        if b.grad is None:
            assert a.grad is None or not a.grad.any(), name
        else:
            torch.testing.assert_close(a.grad, b.grad, msg=name)
    assert scores.scored[..., 0].sum() == scores.counts[0] and scores.hits.sum() == sum(scores.correct)
