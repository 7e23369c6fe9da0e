"""The training-time test unrolls the head exactly as chained drafting runs it, and scores the right tokens."""

from __future__ import annotations

import pytest
import torch
from eagle3_training_data import tiny_target

from specdec_eagle3.head import HeadCache
from specdec_eagle3.training.loop import new_head
from specdec_eagle3.training.ttt import shift, ttt_forward, unrolled_mask, unrolled_rows


def _head(target, layers=(0, 1, 2), draft_vocab: int = 20, num_layers: int = 1):
    vocab = target.model.config.vocab_size
    chosen = torch.arange(vocab - draft_vocab, vocab)  # a draft vocabulary that is not the identity
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[chosen] = True
    config = target.model.config.to_dict()
    head = new_head(config, layers, chosen - torch.arange(draft_vocab), t2d, seed=3, num_layers=num_layers)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return head


def test_unrolled_mask_is_causal_then_diagonal() -> None:
    """Over every position, step 2 sees step 0 causally, then itself at steps 1 and 2."""
    mask = unrolled_mask(torch.arange(3)[None], 3, 2)[0, 0]
    assert mask.shape == (3, 9)
    assert mask[:, :3].tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert torch.equal(mask[:, 3:6], torch.eye(3, dtype=torch.bool)) and torch.equal(mask[:, 6:], torch.eye(3, dtype=torch.bool))


def test_shift_moves_left_and_fills_with_zero() -> None:
    x = torch.tensor([[1, 2, 3, 4]])
    assert shift(x, 1).tolist() == [[2, 3, 4, 0]] and shift(x, 5).tolist() == [[0, 0, 0, 0]]


@torch.no_grad()
@pytest.mark.parametrize("num_layers", [1, 2])
def test_unrolled_steps_equal_chained_drafting(num_layers: int) -> None:
    """Step k at position t equals what the inference head computes when it drafts k tokens from
    anchor t (true pairs 0..t in its cache, then its own outputs), given the true tokens; with two
    decoder layers as with one."""
    target = tiny_target()
    head = _head(target, num_layers=num_layers).eval()
    ids = torch.tensor([[5, 9, 12, 7, 20, 3, 15, 11]])
    out = target.model(ids, output_hidden_states=True)
    features = torch.cat([out.hidden_states[i] for i in (0, 1, 2)], dim=-1)
    embed = target.model.get_input_embeddings()
    steps = 3
    result = ttt_forward(head, embed, ids, torch.ones_like(ids, dtype=torch.bool), features,
                         out.logits[..., head.draft_to_target()], out.logits.argmax(-1), steps)
    assert [h.shape for h in result.hiddens] == [(1, 8, head.config.hidden_size)] * steps
    length = ids.shape[1]
    for anchor in range(length - steps - 1):
        cache = HeadCache()
        pairs = torch.arange(anchor + 1)[None]
        hidden = head(embed(ids[:, 1 : anchor + 2]), head.fuse(features[:, : anchor + 1]), pairs, cache)[:, -1:]
        torch.testing.assert_close(hidden[0, 0], result.hiddens[0][0, anchor], atol=1e-5, rtol=1e-5)
        for k in range(1, steps):
            position = torch.tensor([[anchor + k]])
            hidden = head(embed(ids[:, anchor + 1 + k : anchor + 2 + k]), hidden, position, cache)
            torch.testing.assert_close(hidden[0, 0], result.hiddens[k][0, anchor], atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_steps_past_zero_run_only_where_scored_and_stay_exact() -> None:
    """With prompt tokens (no loss) and ragged rows, steps >= 1 run only on positions a later step
    scores: each of those equals chained drafting from its anchor, the rest are skipped (zero),
    and each step's loss is the plain cross-entropy over exactly its scored positions."""
    target = tiny_target()
    head = _head(target, draft_vocab=36).eval()
    ids = torch.tensor([[5, 9, 12, 7, 20, 3, 15, 11, 4, 6], [8, 2, 14, 9, 30, 1, 0, 0, 0, 0]])
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[0, 6:] = True
    mask[1, 3:6] = True
    out = target.model(ids, output_hidden_states=True)
    features = torch.cat([out.hidden_states[i] for i in (0, 1, 2)], dim=-1)
    embed = target.model.get_input_embeddings()
    steps = 3
    result = ttt_forward(head, embed, ids, mask, features, out.logits, out.logits.argmax(-1), steps)
    teach = shift(mask, 1) & head.t2d[out.logits.argmax(-1)]
    rows, live = unrolled_rows(teach, steps)
    unrolled = {(b, int(t)) for b in range(2) for t, on in zip(rows[b], live[b]) if on}
    assert unrolled and len(unrolled) < 2 * (ids.shape[1] - 2)
    for b in range(2):
        for anchor in range(ids.shape[1] - 1):
            cache = HeadCache()
            pairs = torch.arange(anchor + 1)[None]
            fused = head.fuse(features[b : b + 1, : anchor + 1])
            hidden = head(embed(ids[b : b + 1, 1 : anchor + 2]), fused, pairs, cache)[:, -1:]
            torch.testing.assert_close(hidden[0, 0], result.hiddens[0][b, anchor], atol=1e-5, rtol=1e-5)
            for k in range(1, steps):
                if (b, anchor) not in unrolled:
                    assert not result.hiddens[k][b, anchor].any()
                    continue
                token = ids[b : b + 1, anchor + 1 + k : anchor + 2 + k]
                hidden = head(embed(token), hidden, torch.tensor([[anchor + k]]), cache)
                torch.testing.assert_close(hidden[0, 0], result.hiddens[k][b, anchor], atol=1e-5, rtol=1e-5)
    for k in range(steps):
        scored = shift(teach, 1 + k)
        logq = torch.log_softmax(head.logits(result.hiddens[k][scored]), -1)
        expected = -(torch.softmax(shift(out.logits, 1 + k)[scored], -1) * logq).sum(-1).mean()
        assert result.counts[k] == int(scored.sum()) > 0
        torch.testing.assert_close(result.losses[k], expected, atol=1e-5, rtol=1e-5)


def _reply_batch(target):
    """Ten tokens whose last eight are the reply, with the tiny target's features and logits."""
    ids = torch.tensor([[5, 9, 12, 7, 20, 3, 15, 11, 4, 6]])
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[0, 2:] = True
    with torch.no_grad():
        out = target.model(ids, output_hidden_states=True)
    features = torch.cat([out.hidden_states[i] for i in (0, 1, 2)], dim=-1)
    return ids, mask, features, out


def test_argmax_weight_mixes_in_the_cross_entropy_with_the_greedy_token() -> None:
    """With ``argmax_weight`` w each step's loss is (1 - w) x the distribution's cross-entropy plus
    w x the cross-entropy with the target's argmax, which step 0 shows by hand."""
    target = tiny_target()
    head = _head(target, draft_vocab=36)  # the full vocabulary, in order: draft id = target id
    ids, mask, features, out = _reply_batch(target)
    embed = target.model.get_input_embeddings()
    argmax = out.logits.argmax(-1)
    soft, hard, mixed = (ttt_forward(head, embed, ids, mask, features, out.logits, argmax, 3, argmax_weight=w)
                         for w in (0.0, 1.0, 0.25))
    logq = torch.log_softmax(head.logits(hard.hiddens[0][0, :8]), -1)  # positions 0..7 predict tokens 2..9
    expected = -logq.gather(1, argmax[0, 1:9, None]).mean()
    torch.testing.assert_close(hard.losses[0], expected, atol=1e-5, rtol=1e-5)
    for k in range(3):
        assert not torch.isclose(soft.losses[k], hard.losses[k])
        torch.testing.assert_close(mixed.losses[k], 0.75 * soft.losses[k] + 0.25 * hard.losses[k], atol=1e-5, rtol=1e-5)


def test_loss_counts_reply_tokens_the_draft_vocabulary_can_hit() -> None:
    """Step k scores position t when token t + 2 + k is a reply token and the target's argmax for it
    is in the draft vocabulary; later steps score fewer positions; the decayed sum backpropagates."""
    target = tiny_target()
    head = _head(target, draft_vocab=36)  # full vocabulary: every argmax counts
    ids, mask, features, out = _reply_batch(target)
    result = ttt_forward(head, target.model.get_input_embeddings(), ids, mask, features, out.logits,
                         out.logits.argmax(-1), 3)
    # Positions t with t + 2 + k in 2..9: step 0 -> t in 0..7 (8), step 1 -> 0..6, step 2 -> 0..5.
    assert result.counts == [8, 7, 6]
    total = result.total(0.8)
    torch.testing.assert_close(total, result.losses[0] + 0.8 * result.losses[1] + 0.64 * result.losses[2])
    total.backward()
    assert head.fc.weight.grad is not None and head.fc.weight.grad.abs().sum() > 0
    narrow = _head(target, draft_vocab=4)  # ids 32..35 only: few argmaxes land there
    few = ttt_forward(narrow, target.model.get_input_embeddings(), ids, mask, features,
                      out.logits[..., narrow.draft_to_target()], out.logits.argmax(-1), 3)
    in_vocab = narrow.t2d[out.logits.argmax(-1)][0]
    assert 0 < few.counts[0] == int((in_vocab[1:9] & mask[0, 2:10]).sum()) < 8
