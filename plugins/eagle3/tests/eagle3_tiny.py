"""Tiny EAGLE-3 heads for tests, shaped for a tiny target and fitted to it in a few seconds.

A random head's drafts are almost never accepted, which would leave the conformance suite
nothing to check. So :func:`fitted_head` trains the head the way EAGLE-3 does (one step: the
pair (fused target states at ``t``, token ``t + 1``) learns the target's distribution at
``t + 1``) on text the tiny target writes itself, with a compressed draft vocabulary of its most
frequent tokens. Its drafts are then right often but not always, and tests exercise the real
``d2t`` mapping. Fitted heads are memoized per target weights, so a test session fits each once.
"""

from __future__ import annotations

import copy

import torch
from transformers import LlamaConfig

from specdec.testing.tiny import target_text
from specdec_eagle3.head import Eagle3Head, Eagle3HeadConfig


def head_config(
    target_model: torch.nn.Module, layers: tuple[int, ...] | None, draft_vocab_size: int, num_fused: int | None = None,
    num_layers: int = 1,
) -> Eagle3HeadConfig:
    """A head as wide as the tiny target, over its vocabulary; ``layers`` is what a checkpoint records."""
    t = target_model.config
    llama = LlamaConfig(
        hidden_size=t.hidden_size,
        intermediate_size=t.intermediate_size,
        num_attention_heads=t.num_attention_heads,
        num_key_value_heads=t.num_key_value_heads,
        num_hidden_layers=1,
        vocab_size=t.vocab_size,
        max_position_embeddings=t.max_position_embeddings,
        rms_norm_eps=t.rms_norm_eps,
    )
    return Eagle3HeadConfig(
        llama=llama,
        draft_vocab_size=draft_vocab_size,
        target_hidden_size=t.hidden_size,
        num_fused_layers=num_fused or (len(layers) if layers else 3),
        layers_to_capture=layers,
        num_layers=num_layers,
    )


def fitted_head(
    target_model: torch.nn.Module,
    layers: tuple[int, ...],
    record_layers: bool = True,
    draft_vocab_size: int = 24,
    steps: int = 150,
    seed: int = 0,
    num_layers: int = 1,
) -> Eagle3Head:
    """A head of ``num_layers`` decoder layers trained on the target's own text to predict the
    target one token further ahead. It is fitted on the CPU whatever the target's device, so a
    target on the GPU (``SPECDEC_TEST_DEVICE=cuda``) gets the head its CPU copy gets."""
    target_model = copy.deepcopy(target_model).cpu()
    fingerprint = tuple(round(float(p.detach().double().sum()), 6) for p in target_model.parameters())
    key = (fingerprint, tuple(layers), record_layers, draft_vocab_size, steps, seed, num_layers)
    if key not in _FITTED:
        _FITTED[key] = _fit(target_model, layers, record_layers, draft_vocab_size, steps, seed, num_layers)
    return copy.deepcopy(_FITTED[key])


_FITTED: dict[tuple, Eagle3Head] = {}


def _fit(
    target_model: torch.nn.Module, layers: tuple[int, ...], record_layers: bool, draft_vocab_size: int, steps: int, seed: int,
    num_layers: int,
) -> Eagle3Head:
    generator = torch.Generator().manual_seed(seed)
    ids = target_text(target_model, num=16, length=40, generator=generator)
    with torch.no_grad():
        out = target_model(ids, output_hidden_states=True)
        features = torch.cat([out.hidden_states[i] for i in layers], dim=-1)
        target_probs = out.logits.softmax(-1)
        embeds = target_model.get_input_embeddings()(ids)

    counts = torch.bincount(ids.flatten(), minlength=target_model.config.vocab_size)
    vocab = counts.topk(draft_vocab_size).indices.sort().values
    config = head_config(target_model, layers if record_layers else None, draft_vocab_size, num_fused=len(layers),
                         num_layers=num_layers)
    torch.manual_seed(seed)
    head = Eagle3Head(config)
    head.d2t.copy_(vocab - torch.arange(draft_vocab_size))
    head.t2d.zero_()
    head.t2d[vocab] = True

    # Pair j = (features at j, token j + 1) learns the target's distribution at j + 1.
    want = target_probs[:, 1:, vocab]
    want = want / want.sum(-1, keepdim=True)
    positions = torch.arange(ids.shape[1] - 1)[None]
    optimizer = torch.optim.Adam(head.parameters(), lr=1e-2)
    for _ in range(steps):
        hidden = head(embeds[:, 1:], head.fuse(features[:, :-1]), positions)
        loss = -(want * head.logits(hidden).log_softmax(-1)).sum(-1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return head.eval()
