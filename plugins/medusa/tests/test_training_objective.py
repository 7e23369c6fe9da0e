"""Medusa-1's objective: head k at position t is scored on token t + k + 2 where that token is the
assistant's; chunked, per-chunk backward gives exactly the gradient of the whole weighted loss;
the chain walk counts accepted drafts as greedy chain drafting would."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from specdec_medusa.training.model import new_heads, trainable_state
from specdec_medusa.training.objective import medusa_loss

VOCAB, HIDDEN, HEADS = 11, 8, 3


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (2, 9), generator=generator)
    mask = torch.zeros(2, 9, dtype=torch.bool)
    mask[0, 3:9] = True  # prompt 0..2, reply 3..8
    mask[1, 2:6] = True  # shorter conversation, right-padded after 5
    hidden = torch.randn(2, 9, HIDDEN, generator=generator)
    return hidden, ids, mask


def _heads(share: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    heads = new_heads(HEADS, 1, torch.randn(VOCAB, HIDDEN), share)
    with torch.no_grad():
        for p in trainable_state(heads).values():
            p.add_(0.1 * torch.randn_like(p))
    return heads


def test_head_k_learns_token_t_plus_k_plus_2_on_assistant_tokens_only() -> None:
    hidden, ids, mask = _batch()
    heads = _heads(share=False)
    scores = medusa_loss(heads, hidden, ids, mask, chunk=4, keep_hits=True)
    for k in range(HEADS):
        expected, correct, count = 0.0, 0, 0
        for b in range(2):
            for t in range(9 - k - 2):
                if mask[b, t + k + 2]:
                    with torch.no_grad():
                        logits = heads.lm_heads[k](heads.blocks[k](hidden[b, t]))
                    expected += float(F.cross_entropy(logits[None], ids[b, t + k + 2][None]))
                    correct += int(logits.argmax() == ids[b, t + k + 2])
                    count += 1
                    assert scores.scored[b, t, k] and bool(scores.hits[b, t, k]) == bool(logits.argmax() == ids[b, t + k + 2])
        assert scores.counts[k] == count == int(scores.scored[..., k].sum())
        assert abs(scores.loss_sums[k] - expected) < 1e-4 and scores.correct[k] == correct
    # Replies 3..8 and 2..5: head k's label t + k + 2 must fall in them (t >= 0).
    assert scores.counts == [6 + 4, 6 + 3, 5 + 2]


def test_chunked_backward_is_the_whole_weighted_loss_gradient() -> None:
    """decay ** k * mean loss of head k, summed: chunks of 2 positions give the same gradients
    (own projections and shared frozen ones alike), and a shared lm_head gets none."""
    hidden, ids, mask = _batch()
    for share in (True, False):
        chunked, whole = _heads(share), _heads(share)
        medusa_loss(chunked, hidden, ids, mask, decay=0.8, chunk=2, backward=True)
        scores = medusa_loss(whole, hidden, ids, mask, decay=0.8, chunk=10_000)
        total = 0.0
        for k in range(HEADS):
            scored = torch.zeros_like(mask)
            scored[:, : 9 - k - 2] = mask[:, k + 2 :]
            labels = ids[:, k + 2 :][scored[:, : 9 - k - 2]]
            logits = whole.lm_heads[k](whole.blocks[k](hidden[scored]))
            total = total + 0.8**k * F.cross_entropy(logits, labels)
        total.backward()
        assert abs(scores.weighted_loss(0.8) - float(total.detach())) < 1e-5
        for (name, a), b in zip(trainable_state(chunked).items(), trainable_state(whole).values()):
            assert torch.allclose(a.grad, b.grad, atol=1e-6), name
        if share:
            assert chunked.lm_heads[0].weight.grad is None and not chunked.lm_heads[0].weight.requires_grad


def test_new_heads_start_as_the_target_next_token_predictor() -> None:
    lm_head = torch.randn(VOCAB, HIDDEN)
    x = torch.randn(5, HIDDEN)
    for share in (True, False):
        heads = new_heads(2, 2, lm_head, share)
        logits = heads(x)
        assert torch.allclose(logits, (x @ lm_head.T).expand(2, -1, -1), atol=1e-6)
        assert heads.uses_target_lm_head is share
    assert len(trainable_state(new_heads(2, 1, lm_head, True))) == 4  # blocks only: 2 x (weight, bias)


def test_bfloat16_mode_follows_float32() -> None:
    """bfloat16 products and softmax (the CPU's fast path) give the float32 loss and gradients to
    bfloat16's precision."""
    hidden, ids, mask = _batch()
    exact, fast = _heads(share=False), _heads(share=False)
    a = medusa_loss(exact, hidden, ids, mask, backward=True)
    b = medusa_loss(fast, hidden, ids, mask, backward=True, bf16=True)
    assert abs(a.weighted_loss(0.8) - b.weighted_loss(0.8)) < 0.02 * a.weighted_loss(0.8)
    for x, y in zip(trainable_state(exact).values(), trainable_state(fast).values()):
        assert y.dtype == torch.float32 and torch.allclose(x.grad, y.grad, rtol=0.05, atol=0.02 * float(x.grad.abs().max()))


def test_a_training_vocabulary_narrows_the_softmax_to_its_tokens() -> None:
    """With every token in it, the loss and gradients are the whole vocabulary's; with some, a
    position is scored when its label is among them, against their logits only, own projections
    getting gradient on their rows alone."""
    from specdec.training.vocabulary import TrainingVocabulary

    hidden, ids, mask = _batch()
    full, every = _heads(share=False), _heads(share=False)
    medusa_loss(full, hidden, ids, mask, chunk=3, backward=True)
    medusa_loss(every, hidden, ids, mask, chunk=3, backward=True, vocabulary=TrainingVocabulary(torch.arange(VOCAB), VOCAB))
    for a, b in zip(trainable_state(full).values(), trainable_state(every).values()):
        assert torch.allclose(a.grad, b.grad, atol=1e-6)

    kept = torch.tensor([7, 1, 4, 9, 2])
    for share in (True, False):
        heads = _heads(share)
        scores = medusa_loss(heads, hidden, ids, mask, chunk=3, backward=True, vocabulary=TrainingVocabulary(kept, VOCAB))
        for k in range(HEADS):
            expected, count = 0.0, 0
            for b in range(2):
                for t in range(9 - k - 2):
                    label = int(ids[b, t + k + 2])
                    if mask[b, t + k + 2] and label in kept.tolist():
                        with torch.no_grad():
                            logits = heads.lm_heads[k](heads.blocks[k](hidden[b, t]))[kept.sort().values]
                        expected += float(F.cross_entropy(logits[None], torch.tensor([sorted(kept.tolist()).index(label)])))
                        count += 1
            assert scores.counts[k] == count and abs(scores.loss_sums[k] - expected) < 1e-4
        if not share:
            outside = [t for t in range(VOCAB) if t not in kept.tolist()]
            assert all(float(heads.lm_heads[k].weight.grad[outside].abs().sum()) == 0 for k in range(HEADS))
            assert float(heads.lm_heads[0].weight.grad[kept].abs().sum()) > 0
