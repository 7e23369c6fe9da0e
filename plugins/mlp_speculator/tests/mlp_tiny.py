"""A tiny MLP speculator fitted to the tiny target, for tests.

Random stages' drafts are almost never accepted, which would leave the conformance suite nothing
to check. :func:`fitted_speculator` trains the stages as IBM's first training stage does (frozen
target, teacher forcing): stage ``k`` at position ``t`` reads stage ``k - 1``'s state and token
``t + k + 1`` and learns the target's distribution at ``t + k + 1``; the data is text the tiny
target writes itself. Fitted speculators are memoized per target weights.
"""

from __future__ import annotations

import copy

import torch

from specdec.testing.tiny import target_text
from specdec_mlp_speculator import MLPSpeculator, SpeculatorSpec

_FITTED: dict[tuple, MLPSpeculator] = {}


def fitted_speculator(target_model: torch.nn.Module, n_predict: int = 3, tie_weights: bool = False,
                      scale_input: bool = True, top_k: list[int] | None = None, steps: int = 150) -> MLPSpeculator:
    model = copy.deepcopy(target_model).cpu().float()
    fingerprint = tuple(round(float(p.detach().double().sum()), 6) for p in model.parameters())
    key = (fingerprint, n_predict, tie_weights, scale_input, tuple(top_k or ()), steps)
    if key not in _FITTED:
        config = model.config
        spec = SpeculatorSpec(config.hidden_size, 2 * config.hidden_size, n_predict, config.vocab_size, tie_weights,
                              scale_input, top_k or [3, 2, 1][:n_predict])
        _FITTED[key] = _fit(model, MLPSpeculator(spec), steps)
    return copy.deepcopy(_FITTED[key])


def _fit(model: torch.nn.Module, speculator: MLPSpeculator, steps: int) -> MLPSpeculator:
    ids = target_text(model, num=16, length=40, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
        hidden, target_probs = out.hidden_states[-1], out.logits.softmax(-1)
    torch.manual_seed(0)
    optimizer = torch.optim.Adam(speculator.parameters(), lr=3e-3)
    n = speculator.spec.n_predict
    span = ids.shape[1] - n - 1
    for _ in range(steps):
        state, loss = speculator.first_state(hidden[:, :span]), 0.0
        for k in range(n):
            state, logits = speculator.step(k, state, ids[:, 1 + k : 1 + k + span])
            want = target_probs[:, 1 + k : 1 + k + span]
            loss = loss - (want * logits.log_softmax(-1)).sum(-1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return speculator.eval()
