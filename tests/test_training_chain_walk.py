"""The chain-acceptance estimate from per-position hits (what Medusa's and the MLP speculator's
held-out curves report)."""

import torch

from specdec.training import chain_acceptance


def test_chain_walk() -> None:
    """A reply of tokens 2..9 (anchor 1 predicts token 2): at anchor 1 heads 0, 1 hit and 2 misses
    -> 2 accepted, next anchor 4; there head 0 misses -> 0, next anchor 5; there all hit -> 3,
    next anchor 9, past the reply."""
    mask = torch.zeros(1, 11, dtype=torch.bool)
    mask[0, 2:10] = True
    hits = torch.zeros(1, 11, 3, dtype=torch.bool)
    hits[0, 1, :2] = True
    hits[0, 5, :] = True
    scored = torch.zeros_like(hits)
    for k in range(3):
        scored[0, : 11 - k - 2, k] = mask[0, k + 2 :]
    assert chain_acceptance(hits & scored, scored, mask) == (3, 5)
