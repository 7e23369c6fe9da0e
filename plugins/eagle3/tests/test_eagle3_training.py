"""Training end to end on a tiny target's own text: dump -> calibrate -> fit (offline and online) ->
export -> the plugin drafts with the head, accepted far more often than an untrained head's drafts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import Subset
from eagle3_training_data import synthesized, tiny_target

from specdec import LLM, SamplingParams
from specdec.errors import ConfigError
from specdec.training.synthesize import read_conversations
from specdec_eagle3 import load_head
from specdec.training.conversations import tokenize_all
from specdec.training.distributed import World
from specdec_eagle3.training.dump import DumpDataset, write_dump
from specdec_eagle3.training.loop import (FitOptions, evaluate, export, fit, new_head, with_draft_vocabulary,
                                          with_more_layers)
from specdec_eagle3.training.ttt import chain_walk, ttt_forward
from specdec.training.batching import LengthGroupedBatches, collate, conversation_lengths
from specdec.training.examples import ExampleDataset
from specdec_eagle3.training.sources import OfflineTarget, OnlineTarget
from specdec.training.token_frequency import token_counts
from specdec_eagle3.training.vocab import calibrate

LAYERS = (0, 1, 2)
DRAFT_VOCAB = 24
PROMPTS = ["the dog ran far", "hello world one", "blue sky big sun", "two three cat", "a red mat"]


@pytest.fixture(scope="module")
def target():
    return tiny_target()


@pytest.fixture(scope="module")
def workdir(target, tmp_path_factory) -> Path:
    """The tiny target's answers to 48 prompts, dumped."""
    directory = tmp_path_factory.mktemp("training")
    examples = tokenize_all(read_conversations(synthesized(target, directory)), target.tokenizer, 512)
    write_dump(target.model, examples, LAYERS, directory / "dump", target_name="tiny")
    return directory


def _fresh_head(dataset: DumpDataset):
    assistant, every = token_counts(dataset.sequences(), dataset.index["vocab_size"])
    d2t, t2d = calibrate(assistant, every, DRAFT_VOCAB)
    return new_head(dataset.index["target_config"], LAYERS, d2t, t2d, dataset.target_tensors())


def _acceptance(target, head_dir: Path) -> tuple[float, list[list[int]]]:
    # The head's own drafts: suffix drafts over it would take the tiny target's repetitive steps.
    config = {"decoding_type": "eagle3", "speculative_model": str(head_dir), "max_draft_len": 4, "adaptive_draft_len": False,
              "use_sa_spec": False}
    with LLM(target.model, config, tokenizer=target.tokenizer) as llm:
        outputs = llm.generate(PROMPTS, SamplingParams(max_tokens=40), chat=True)
        return llm.get_metrics().mean_acceptance_length, [o.token_ids for o in outputs]


def test_offline_training_raises_acceptance(target, workdir: Path) -> None:
    """150 steps on the dump take the head from ~1 accepted token per step to well over 3 of 5, and
    the exported head (bf16, SafeAILab layout) drafts through the plugin losslessly."""
    dataset = DumpDataset(workdir / "dump")
    head = _fresh_head(dataset)
    export(head, str(workdir / "untrained"), "safeailab", torch.bfloat16, "tiny", (), 4)
    source = OfflineTarget(dataset.target_tensors(), torch.device("cpu"))
    reports = []
    at = fit(head, source, dataset, FitOptions(steps=150, batch_size=8, lr=3e-3, ttt_steps=4), World(), reports.append)
    assert at.step == len(reports) == 150 and len(reports[-1].accuracies) == 4
    assert sum(reports[-1].accuracies) > sum(reports[0].accuracies) + 1.0
    export(head, str(workdir / "trained"), "safeailab", torch.bfloat16, "tiny", (), 4)
    before, _ = _acceptance(target, workdir / "untrained")
    after, tokens = _acceptance(target, workdir / "trained")
    assert before < 1.8 and after > 3.0, (before, after)
    with LLM(target.model, None, tokenizer=target.tokenizer) as plain:
        assert tokens == [o.token_ids for o in plain.generate(PROMPTS, SamplingParams(max_tokens=40), chat=True)]


def test_heldout_agreement_is_measured_on_schedule(target, workdir: Path) -> None:
    """With held-out conversations, every ``eval_every``-th report, each epoch's last and the last
    carry the head's per-step agreement on them, computed as in training but without learning from them."""
    dataset = DumpDataset(workdir / "dump")
    held, trained = Subset(dataset, range(8)), Subset(dataset, range(8, len(dataset)))
    head = _fresh_head(dataset)
    source = OfflineTarget(dataset.target_tensors(), torch.device("cpu"))
    options = FitOptions(steps=30, batch_size=8, lr=3e-3, ttt_steps=3, eval_every=20)
    source.use_draft_vocabulary(head.draft_to_target())
    before = evaluate(head, source, held, options, World())
    reports = []
    fit(head, source, trained, options, World(), reports.append, heldout=held)
    per_epoch = len(LengthGroupedBatches(conversation_lengths(trained), 8, World()))
    assert [r.step for r in reports if r.heldout is not None] == [s for s in range(1, 31) if s % 20 == 0 or s % per_epoch == 0 or s == 30]
    after = reports[-1].heldout
    assert len(after.agreement) == 3 and after.agreement[0] > before.agreement[0] + 0.1, (before, after)
    assert 1.0 <= before.acceptance_length < after.acceptance_length <= 4.0
    # Measuring does not train: the same head measures the same again.
    assert evaluate(head, source, held, options, World()) == after


def test_bf16_mixed_precision_learns_with_float32_weights(target, workdir: Path) -> None:
    """With ``bf16`` the head's matrix products run in bfloat16 (its output layer's logits are
    bfloat16) while its weights stay float32, and it learns; held-out evaluation runs in float32."""
    dataset = DumpDataset(workdir / "dump")
    head = _fresh_head(dataset)
    source = OfflineTarget(dataset.target_tensors(), torch.device("cpu"))
    seen: set[torch.dtype] = set()
    head.lm_head.register_forward_hook(lambda module, args, out: seen.add(out.dtype))
    reports = []
    options = FitOptions(steps=60, batch_size=8, lr=3e-3, ttt_steps=3, bf16=True)
    fit(head, source, dataset, options, World(), reports.append)
    assert seen == {torch.bfloat16}
    assert {p.dtype for p in head.parameters()} == {torch.float32}
    assert reports[-1].accuracies[0] > reports[0].accuracies[0] + 0.2
    # Held-out measurement stays float32, comparable with runs in either precision.
    seen.clear()
    evaluate(head, source, Subset(dataset, range(8)), options, World())
    assert seen == {torch.float32}


def test_heldout_walk_predicts_the_engines_acceptance_length(target, workdir: Path) -> None:
    """On the target's greedy replies, the acceptance length :func:`evaluate` predicts from the
    training-time test is the one the engine measures drafting chains of the same length on the
    same prompts (float32; a reply cut at ``max_tokens`` ends its last step earlier in the engine,
    hence the small tolerance)."""
    directory = workdir / "greedy"
    directory.mkdir()
    conversations = synthesized(target, directory, count=16, max_new_tokens=40, temperature=0.0)
    examples = tokenize_all(read_conversations(conversations), target.tokenizer, 512)
    write_dump(target.model, examples, LAYERS, directory / "dump", target_name="tiny")
    dataset = DumpDataset(directory / "dump")
    head = _fresh_head(dataset)
    source = OfflineTarget(dataset.target_tensors(), torch.device("cpu"))
    options = FitOptions(steps=2, batch_size=8, lr=3e-3, ttt_steps=4)
    fit(head, source, dataset, options, World())
    predicted = evaluate(head, source, dataset, options, World()).acceptance_length
    export(head, str(directory / "head"), "safeailab", torch.float32, "tiny", (), 4)
    prompts = [r["conversations"][0]["content"] for r in read_conversations(conversations)]
    config = {"decoding_type": "eagle3", "speculative_model": str(directory / "head"), "max_draft_len": 4,
              "adaptive_draft_len": False, "use_sa_spec": False}  # the head's own drafts, as predicted
    with LLM(target.model, config, tokenizer=target.tokenizer) as llm:
        llm.generate(prompts, SamplingParams(max_tokens=40), chat=True)
        measured = llm.get_metrics().mean_acceptance_length
    # Two steps of training leave the head mid-way (about 2.4 of 5), where a wrong walk would show.
    assert 1.5 < measured < 3.5 and abs(predicted - measured) < 0.05 * measured, (predicted, measured)


def test_chain_walk_counts_steps_as_the_engine_does() -> None:
    """Each reply starts with a token the target writes itself; a step keeps drafts up to the first
    miss (or a whole chain) and adds the target's next token; no step drafts past the reply's
    end, which is its last assistant token or its first stop token."""
    mask = torch.tensor([[False, False, True, True, True, True, True, True, False, True, True, True, False, False],
                         [False, True, True, True, True, True, True, True, True, True, True, True, True, False]])
    ids = torch.zeros_like(mask, dtype=torch.long)
    ids[1, 10] = 7  # row 1's reply stops at token 10; tokens 11, 12 (the template's) are never generated
    hits = torch.zeros(2, 14, 3, dtype=torch.bool)
    hits[0, 1] = torch.tensor([True, True, False])  # anchor 1 (token 2 written): tokens 3, 4 right, 5 wrong
    hits[0, 4] = torch.tensor([True, True, True])   # anchor 4 (token 5 from the target): 6, 7; 8 is no reply token
    hits[0, 8] = torch.tensor([True, True, True])   # second reply: anchor 8: tokens 10, 11, then it ends
    hits[1, 0] = torch.tensor([True, True, True])   # anchor 0: a whole chain, tokens 2-4, then token 5 from the target
    hits[1, 4] = torch.tensor([True, True, True])   # anchor 4 (reads token 5): tokens 6-8, then token 9 from the target
    hits[1, 10] = torch.tensor([True, True, True])  # anchor 10 lies past the stop
    # Row 0: anchors 1, 4, 8 keep 2 each. Row 1: anchors 0 and 4 keep 3 each; anchor 8 misses
    # token 10, which the target writes, and the reply ends there.
    assert chain_walk(hits, mask, ids, stop_ids=[7]) == (6, 12)
    # Without the stop, row 1 goes on: anchor 9 misses token 11, anchor 10 keeps token 12.
    assert chain_walk(hits, mask, ids) == (8, 13)
    # Anchor 4 now misses: its step keeps nothing; anchor 5 (token 6 from the target) misses too, and
    # token 7, the target's, ends the reply.
    hits[0, 4, 0] = False
    assert chain_walk(hits[:1], mask[:1], ids[:1]) == (4, 4)


def test_online_signals_equal_the_dumps(target, workdir: Path) -> None:
    """Online mode computes from a live target forward what offline mode reads from the dump."""
    dataset = DumpDataset(workdir / "dump")
    head = _fresh_head(dataset)
    offline = OfflineTarget(dataset.target_tensors(), torch.device("cpu"))
    online = OnlineTarget(target.model, LAYERS)
    for source in (offline, online):
        source.use_draft_vocabulary(head.draft_to_target())
    items = [dataset[n] for n in (0, 10, 20)]  # different lengths: padding is exercised
    lengths = torch.tensor([len(i["input_ids"]) for i in items])
    assert len(set(lengths.tolist())) > 1
    a = offline.signals(collate(items))
    b = online.signals(collate([{"input_ids": i["input_ids"], "loss_mask": i["loss_mask"], "length": n}
                                for i, n in zip(items, lengths)]))
    real = torch.arange(a.input_ids.shape[1])[None] < lengths[:, None]
    for name in ("input_ids", "loss_mask"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert torch.equal(a.target_argmax[real], b.target_argmax[real])
    torch.testing.assert_close(a.features[real], b.features[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a.draft_logits[real], b.draft_logits[real], atol=1e-4, rtol=1e-4)
    assert torch.equal(offline.embed(a.input_ids), online.embed(a.input_ids))


def test_online_training_learns(target, workdir: Path) -> None:
    """Online mode trains too (fewer steps: it runs the target every step)."""
    examples = tokenize_all(read_conversations(workdir / "conversations.jsonl"), target.tokenizer, 512)
    dataset = ExampleDataset(examples)
    assistant, every = token_counts(dataset.sequences(), 36)
    d2t, t2d = calibrate(assistant, every, DRAFT_VOCAB)
    weights = {"norm.weight": target.model.model.norm.weight, "lm_head.weight": target.model.lm_head.weight}
    head = new_head(target.model.config.to_dict(), LAYERS, d2t, t2d, weights)
    reports = []
    fit(head, OnlineTarget(target.model, LAYERS), dataset, FitOptions(steps=40, batch_size=8, lr=3e-3, ttt_steps=2),
        World(), reports.append)
    assert reports[-1].accuracies[0] > reports[0].accuracies[0] + 0.2


def test_a_continued_head_moves_to_a_new_draft_vocabulary(workdir: Path) -> None:
    """Recalibrating a trained head's vocabulary keeps what it learned: a token in both vocabularies
    gets exactly the logit it had, every other weight is the head's own, and a new token's output
    row is its target row carried into the head's space by the map the shared rows reveal."""
    config = {**DumpDataset(workdir / "dump").index["target_config"], "hidden_size": 8, "intermediate_size": 16,
              "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4}
    vocab = int(config["vocab_size"])
    torch.manual_seed(0)
    target_rows = torch.randn(vocab, 8)
    old = torch.arange(0, vocab, 2)  # 18 tokens: more than the hidden size, so the map is determined
    old_t2d = torch.zeros(vocab, dtype=torch.bool)
    old_t2d[old] = True
    head = new_head(config, LAYERS, old - torch.arange(old.numel()), old_t2d)
    moved_space = torch.randn(8, 8)  # training moved the head's output space by this map
    with torch.no_grad():
        head.lm_head.weight.copy_(target_rows[old] @ moved_space)
        for param in head.midlayer.parameters():
            param.add_(0.01 * torch.randn_like(param))
    chosen = torch.cat((old[::3], torch.arange(1, vocab, 4))).sort().values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[chosen] = True
    moved = with_draft_vocabulary(head, chosen - torch.arange(chosen.numel()), t2d, target_rows)
    assert moved.config.draft_vocab_size == chosen.numel() and torch.equal(moved.draft_to_target(), chosen)
    hidden = torch.randn(5, 8)
    old_logits, new_logits = head.logits(hidden), moved.logits(hidden)
    shared = old_t2d[chosen]
    old_index = {int(t): d for d, t in enumerate(old)}
    assert shared.any() and not shared.all()
    for d in torch.nonzero(shared).flatten().tolist():
        assert torch.equal(new_logits[:, d], old_logits[:, old_index[int(chosen[d])]])
    torch.testing.assert_close(moved.lm_head.weight[~shared], target_rows[chosen[~shared]] @ moved_space, atol=1e-4, rtol=1e-4)
    for name, tensor in head.state_dict().items():
        if name not in ("lm_head.weight", "d2t", "t2d"):
            assert torch.equal(moved.state_dict()[name], tensor), name
    assert moved.training


def test_a_grown_head_computes_what_it_did_then_trains_its_new_layer(target, workdir: Path) -> None:
    """``with_more_layers`` appends a decoder layer that starts as an identity: the grown head's
    training-time test gives the trained head's states exactly. Training then moves the new layer
    and keeps its agreement, and the two-layer head (speculators layout) drafts losslessly."""
    dataset = DumpDataset(workdir / "dump")
    head = _fresh_head(dataset)
    source = OfflineTarget(dataset.target_tensors(), torch.device("cpu"))
    fit(head, source, dataset, FitOptions(steps=60, batch_size=8, lr=3e-3, ttt_steps=3), World())
    grown = with_more_layers(head, 2, seed=1)
    assert grown.config.num_layers == 2 and grown.training
    signals = source.signals(collate([dataset[n] for n in range(4)]))
    with torch.no_grad():
        before, after = (ttt_forward(h.eval(), source.embed, signals.input_ids, signals.loss_mask, signals.features,
                                     signals.draft_logits, signals.target_argmax, 3) for h in (head, grown))
    for k in range(3):
        assert torch.equal(before.hiddens[k], after.hiddens[k]), k
    options = FitOptions(steps=30, batch_size=8, lr=1e-3, ttt_steps=3)
    agreement = evaluate(head, source, dataset, options, World())
    fit(grown, source, dataset, options, World())
    assert grown.later_layers[0].self_attn.o_proj.weight.abs().sum() > 0
    assert grown.later_layers[0].mlp.down_proj.weight.abs().sum() > 0
    assert evaluate(grown, source, dataset, options, World()).agreement[0] >= agreement.agreement[0] - 0.05
    export(grown, str(workdir / "grown"), "speculators", torch.float32, "tiny", (), 4)
    assert load_head(workdir / "grown").config.num_layers == 2
    accepted, tokens = _acceptance(target, workdir / "grown")
    assert accepted > 2.0, accepted
    with LLM(target.model, None, tokenizer=target.tokenizer) as plain:
        assert tokens == [o.token_ids for o in plain.generate(PROMPTS, SamplingParams(max_tokens=40), chat=True)]
    with pytest.raises(ConfigError, match="cannot lose layers"):
        with_more_layers(grown, 1)


@pytest.mark.parametrize("layout", ["safeailab", "speculators"])
def test_export_loads_in_both_layouts(target, workdir: Path, layout: str) -> None:
    """The exported head reloads with its calibrated vocabulary and recorded layers, in either layout."""
    head = _fresh_head(DumpDataset(workdir / "dump"))
    export(head, str(workdir / layout), layout, torch.float32, "org/tiny", ("LlamaForCausalLM",), 5)
    loaded = load_head(workdir / layout)
    assert loaded.config.layers_to_capture == LAYERS and loaded.config.draft_vocab_size == DRAFT_VOCAB
    for name, tensor in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
