"""The MTP training objective computes what the drafter drafts, and its chunked backward gives
the gradients of the plain loss; new layers start as one more layer of the target."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from specdec import LLM, SamplingParams
from specdec.testing import make_tiny_target
from specdec.testing.conformance import fixed_draft_len, recorded_proposals
from specdec.training.vocabulary import TrainingVocabulary
from specdec_mtp.drafter import MTPResources
from specdec_mtp.training.loop import MTPTarget
from specdec_mtp.training.model import export, new_layers, trainable_state
from specdec_mtp.training.objective import mtp_loss


@pytest.fixture(scope="module")
def setup():
    target = make_tiny_target(seed=0)
    torch.manual_seed(1)
    layers = new_layers(target.model, 2)
    with torch.no_grad():  # away from the pass-through start, so each depth drafts something of its own
        for name, param in trainable_state(layers).items():
            param.add_(0.05 * torch.randn_like(param))
    return target, layers, MTPTarget(target.model)


@pytest.mark.parametrize("num_layers", [2, 1], ids=["a layer per depth", "one layer reused"])
def test_depth_k_at_position_i_is_the_drafters_draft_k(setup, num_layers: int, tmp_path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """For every proposal the engine's drafter made (N tokens known, drafts d1 d2), the objective
    on ``tokens + drafts`` over two depths predicts d1 at depth 1 and d2 at depth 2: the positions,
    inputs and labels the trainer uses are the drafter's, also where one layer serves both depths
    (the drafter's reuse past the layers, and ``--num-depths``)."""
    target, all_layers, frozen = setup
    layers = torch.nn.ModuleList(all_layers[:num_layers])
    export(layers, target.model.config, tmp_path, torch.float32, "tiny")
    seen = recorded_proposals(monkeypatch, MTPResources)
    config = fixed_draft_len({"method": "mtp", "speculative_model": str(tmp_path), "max_draft_len": 2})
    with LLM(target.model, config, tokenizer=target.tokenizer) as llm:
        llm.generate([{"prompt_token_ids": target.encode("the cat sat on a mat")}], SamplingParams(max_tokens=12))
    checked = 0
    for tokens, proposal in seen:
        drafts = list(proposal.token_ids)
        if len(drafts) != 2:
            continue
        ids = torch.tensor([tokens + drafts])
        batch = {"input_ids": ids, "length": torch.tensor([ids.shape[1]])}
        hidden = frozen(batch)
        for depth, label in ((1, len(tokens)), (2, len(tokens) + 1)):
            mask = torch.zeros_like(ids, dtype=torch.bool)
            mask[0, label] = True
            with torch.no_grad():
                scores = mtp_loss(layers, frozen.embed, frozen.rotary, hidden, ids, mask, depths=2)
            assert scores.counts[depth - 1] == 1 and scores.correct[depth - 1] == 1, (tokens, drafts, depth)
        checked += 1
    assert checked >= 3


@pytest.mark.parametrize(("num_layers", "depths"), [(2, 2), (1, 3)], ids=["a layer per depth", "one layer reused"])
def test_chunked_backward_gives_the_plain_losss_gradients(setup, num_layers: int, depths: int) -> None:
    """Chunks of 5 positions on detached outputs, the gradients joined in one backward at the end,
    equal the gradients of ``sum_k decay ** (k - 1) * mean CE_k / D`` computed in one piece, the
    last layer serving the depths past it."""
    target, all_layers, frozen = setup
    layers = torch.nn.ModuleList(all_layers[:num_layers])
    ids = torch.randint(3, target.model.config.vocab_size, (3, 17), generator=torch.Generator().manual_seed(0))
    mask = torch.rand(3, 17, generator=torch.Generator().manual_seed(1)) < 0.7
    mask[2, 12:] = False  # padding
    batch = {"input_ids": ids, "length": torch.tensor([17, 17, 12])}
    hidden = frozen(batch)
    params = trainable_state(layers)
    for p in params.values():
        p.grad = None
    scores = mtp_loss(layers, frozen.embed, frozen.rotary, hidden, ids, mask, decay=0.5, chunk=5, backward=True,
                      depths=depths)
    assert len(scores.counts) == depths
    chunked = {n: p.grad.clone() for n, p in params.items()}
    for p in params.values():
        p.grad = None
    previous, total = hidden, 0.0
    for k in range(1, depths + 1):
        layer = layers[min(k, num_layers) - 1]
        span = 17 - k - 1
        positions = torch.arange(span)[None].expand(3, -1)
        embeds = frozen.embed(ids[:, k : k + span])
        out = layer(embeds, previous[:, :span], positions, frozen.rotary(embeds, positions), None)
        scored = mask[:, k + 1 :]
        loss = F.cross_entropy(layer.logits(out)[scored], ids[:, k + 1 :][scored])
        assert loss.item() == pytest.approx(scores.losses()[k - 1], rel=1e-5)
        total = total + 0.5 ** (k - 1) * loss / depths
        previous = out
    total.backward()
    assert all(torch.allclose(chunked[n], p.grad, atol=1e-6) for n, p in params.items())
    assert scores.weighted_loss(0.5) == pytest.approx(float(total.detach()), rel=1e-5)


def test_a_training_vocabulary_narrows_the_softmax_to_its_tokens(setup) -> None:
    """With every token in it, losses and gradients are the whole vocabulary's; with some, depth
    k scores a position when its label is among them, against their logits only."""
    target, layers, frozen = setup
    vocab = target.model.config.vocab_size
    ids = torch.randint(3, 12, (2, 15), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids, dtype=torch.bool)
    hidden = frozen({"input_ids": ids, "length": torch.tensor([15, 15])})
    params = trainable_state(layers)

    def run(vocabulary):
        for p in params.values():
            p.grad = None
        scores = mtp_loss(layers, frozen.embed, frozen.rotary, hidden, ids, mask, chunk=4, backward=True,
                          vocabulary=vocabulary)
        return scores, {n: p.grad.clone() for n, p in params.items()}

    (full, full_grads), (every, every_grads) = run(None), run(TrainingVocabulary(torch.arange(vocab), vocab))
    assert every.losses() == pytest.approx(full.losses(), rel=1e-5)
    assert all(torch.allclose(full_grads[n], every_grads[n], atol=1e-6) for n in params)
    kept = torch.tensor([3, 5, 8, 11])
    narrowed, _ = run(TrainingVocabulary(kept, vocab))
    with torch.no_grad():
        previous = hidden
        for k, layer in enumerate(layers, start=1):
            span = 15 - k - 1
            positions = torch.arange(span)[None].expand(2, -1)
            embeds = frozen.embed(ids[:, k : k + span])
            previous = layer(embeds, previous[:, :span], positions, frozen.rotary(embeds, positions), None)
            labels = ids[:, k + 1 :]
            scored = torch.isin(labels, kept)
            logits = layer.logits(previous)[scored][:, kept]
            want = torch.searchsorted(kept, labels[scored])
            assert narrowed.counts[k - 1] == int(scored.sum()) < full.counts[k - 1]
            assert narrowed.losses()[k - 1] == pytest.approx(float(F.cross_entropy(logits, want)), rel=1e-5)


def test_new_layer_starts_as_the_targets_next_token_predictor() -> None:
    """A new layer's block is the target's last decoder layer with its output projections zeroed,
    its head the target's final norm and lm_head (frozen, one tensor shared by every layer), and
    it starts out giving the target's own logits from the target's final states, whatever the
    token embedding."""
    target = make_tiny_target(seed=0)
    layers = new_layers(target.model, 2)
    decoder = target.model.get_decoder()
    last = decoder.layers[-1].state_dict()
    block = layers[1].block.state_dict()
    assert all(torch.equal(t, last[n]) for n, t in block.items() if "o_proj" not in n and "down_proj" not in n)
    assert not block["self_attn.o_proj.weight"].any() and not block["mlp.down_proj.weight"].any()
    assert torch.equal(layers[0].shared_head.norm.weight, decoder.norm.weight)
    assert layers[0].shared_head.head.weight is layers[1].shared_head.head.weight
    assert not layers[0].shared_head.head.weight.requires_grad and "0.shared_head.head.weight" not in trainable_state(layers)
    ids = torch.tensor([target.encode("the cat sat on a mat")])
    with torch.no_grad():
        out = target.model(ids, output_hidden_states=True)
        positions = torch.arange(ids.shape[1])[None]
        embeds = torch.randn(1, ids.shape[1], target.model.config.hidden_size)
        h = layers[0](embeds, out.hidden_states[-1], positions, decoder.rotary_emb(embeds, positions), None)
        # Equal but for the norms' epsilon, which weighs on the tiny random model's small states.
        assert torch.allclose(layers[0].logits(h), out.logits, rtol=1e-2, atol=1e-2)
        assert torch.equal(layers[0].logits(h).argmax(-1), out.logits.argmax(-1))
        scores = mtp_loss(layers, decoder.embed_tokens, decoder.rotary_emb, out.hidden_states[-1], ids,
                          torch.ones_like(ids, dtype=torch.bool))
    assert scores.counts == [ids.shape[1] - 2, ids.shape[1] - 3]  # depth k scores positions 0 .. T - k - 2
