"""A tiny recurrent drafter fitted to the tiny target, for tests.

Random drafters' beams are almost never accepted, which would leave the conformance suite nothing
to check. :func:`fitted_drafter` trains the drafter with teacher forcing as Apple's trainer does
(frozen target, every position at once), on text the tiny target writes itself and toward the
target's own distributions (the paper's distillation): at position ``t``, draft step ``k`` reads
the target's hidden state at ``t`` and the state after tokens ``t + 1 .. t + k + 1``, and learns
the target's distribution at ``t + k + 1``. Fitted drafters are memoized per target weights.
"""

from __future__ import annotations

import copy

import torch

from specdec.testing.tiny import target_text
from specdec_redrafter import DrafterSpec, RecurrentDrafter

_FITTED: dict[tuple, RecurrentDrafter] = {}


def fitted_drafter(target_model: torch.nn.Module, rnn: bool = True, exit_dim: int | None = None, layers: int = 1,
                   depth: int = 3, steps: int = 150) -> RecurrentDrafter:
    model = copy.deepcopy(target_model).cpu().float()
    fingerprint = tuple(round(float(p.detach().double().sum()), 6) for p in model.parameters())
    key = (fingerprint, rnn, exit_dim, layers, depth, steps)
    if key not in _FITTED:
        hidden = model.config.hidden_size
        spec = DrafterSpec(hidden, model.config.vocab_size, exit_dim or 2 * hidden, layers, rnn)
        _FITTED[key] = _fit(model, RecurrentDrafter(spec), depth, steps)
    return copy.deepcopy(_FITTED[key])


def _fit(model: torch.nn.Module, drafter: RecurrentDrafter, depth: int, steps: int) -> RecurrentDrafter:
    ids = target_text(model, num=16, length=40, generator=torch.Generator().manual_seed(0))
    embed = model.get_input_embeddings()
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
        hidden, target_probs = out.hidden_states[-1], out.logits.softmax(-1)
        embedded = embed(ids)
    torch.manual_seed(0)
    optimizer = torch.optim.Adam(drafter.parameters(), lr=3e-3)
    span = ids.shape[1] - depth - 1
    for _ in range(steps):
        state, loss = torch.zeros_like(hidden[:, :span]), 0.0
        for k in range(depth):
            state = drafter.advance(state, embedded[:, 1 + k : 1 + k + span])
            logits = drafter.logits(hidden[:, :span], state)
            want = target_probs[:, 1 + k : 1 + k + span]
            loss = loss - (want * logits.log_softmax(-1)).sum(-1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return drafter.eval()
