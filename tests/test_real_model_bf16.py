"""Batch invariance on the embedded default model in bfloat16 (issue 48): where the CPU has
oneDNN's bfloat16 kernels, greedy speculative output with every method, chains and trees, is
plain bfloat16 decoding's token for token, alone and batched, and so is a seeded request's; a
request gets the same text alone and among others.
"""

from __future__ import annotations

import random

import pytest
import torch

from specdec import LLM, SamplingParams
from specdec.bench.dataset import load_questions
from specdec.requests import DraftProposal
from specdec.testing import needs_prepacked_linears, prefilled_batch
from specdec.testing.real_model import plain_bf16  # noqa: F401 (a fixture)
from specdec.trees import path_to

pytestmark = [pytest.mark.real_model, needs_prepacked_linears]

#: Spec-Bench prompts whose answers the shipped drafters and n-gram lookup draft well.
PROMPTS = [q.turns[0] for q in load_questions("spec_bench", ["coding", "summarization", "roleplay"], per_category=1)]
GREEDY = [SamplingParams(max_tokens=n) for n in (40, 32, 48)]


@pytest.fixture(scope="module")
def expected(plain_bf16: LLM) -> list[list[int]]:
    """Each prompt's plain bfloat16 greedy output, decoded alone."""
    return [plain_bf16.generate(p, sp, chat=True)[0].token_ids for p, sp in zip(PROMPTS, GREEDY)]


def test_plain_decoding_gives_a_request_the_same_tokens_alone_and_batched(plain_bf16: LLM, expected) -> None:
    outputs = plain_bf16.generate(PROMPTS, GREEDY, chat=True)
    assert [o.token_ids for o in outputs] == expected


@pytest.mark.parametrize("method", ["ngram", "eagle3", "mtp", "draft_target"])
def test_greedy_speculation_is_plain_bf16_decoding_token_for_token(plain_bf16: LLM, expected, method: str) -> None:
    """Each method drafts chains of 3 (fixed, so that drafts are verified whatever this CPU's
    costs); alone and in a batch of three, the output is plain decoding's, and drafts were kept."""
    config = {"method": method, "num_speculative_tokens": 3, "adaptive_draft_len": False}
    with LLM(plain_bf16.model, config, tokenizer=plain_bf16.tokenizer) as llm:
        alone = [llm.generate(p, sp, chat=True)[0] for p, sp in zip(PROMPTS, GREEDY)]
        batched = llm.generate(PROMPTS, GREEDY, chat=True)
    assert [o.token_ids for o in alone] == expected
    assert [o.token_ids for o in batched] == expected
    assert sum(o.metrics.num_accepted_tokens for o in alone) > 0


@pytest.mark.parametrize(
    "config",
    [
        {"method": "medusa"},
        {"method": "eagle3", "eagle_topk": 4, "num_speculative_tokens": 4, "num_draft_tokens": 12},
        {"method": "suffix"},
        {"method": "lookahead"},
    ],
    ids=["medusa", "eagle3_tree", "suffix", "lookahead"],
)
def test_greedy_tree_speculation_is_plain_bf16_decoding_token_for_token(plain_bf16: LLM, expected, config: dict) -> None:
    """Tree methods draft whole trees (no adaptive length); the engine cuts each to the nodes the
    runner lays out tile-aligned. Alone and in a batch of three, the output is plain decoding's."""
    with LLM(plain_bf16.model, {**config, "adaptive_draft_len": False}, tokenizer=plain_bf16.tokenizer) as llm:
        alone = [llm.generate(p, sp, chat=True)[0] for p, sp in zip(PROMPTS, GREEDY)]
        batched = llm.generate(PROMPTS, GREEDY, chat=True)
    assert [o.token_ids for o in alone] == expected
    assert [o.token_ids for o in batched] == expected
    assert sum(o.metrics.num_accepted_tokens for o in alone) > 0


@pytest.mark.parametrize("length", [100, 600])
def test_every_node_of_a_draft_tree_has_its_chains_bits(plain_bf16: LLM, length: int) -> None:
    """Random 24-node trees verified in one forward on the real model: every node's logits have
    the bits of decoding its path one token at a time. Laid out flat, about one node in ten got
    other bits here; tile-aligned (specdec.tree_layout), none."""
    runner = plain_bf16.runner
    rng = random.Random(length)
    prompt = [rng.randrange(100, 40000) for _ in range(length)]

    differ, checked = [], 0
    for _ in range(3):
        parents: list[int] = []
        for node in range(24):  # often a child of the node before: branches a few deep
            parents.append(node - 1 if rng.random() < 0.4 else rng.choice([-1, *range(node)]))
        proposal = runner.fit_tree(DraftProposal([rng.randrange(100, 40000) for _ in parents], parents=parents), length)
        root = rng.randrange(100, 40000)
        tree = runner.forward_rows(prefilled_batch(runner, [prompt]), [[root, *proposal.token_ids]], parents=[[-1, *(p + 1 for p in proposal.parents)]])[0]
        for leaf in set(range(len(proposal))) - set(proposal.parents):
            chain = prefilled_batch(runner, [prompt])
            path = path_to(leaf, proposal.parents)
            alone = [runner.forward(chain, [t]).logits[0] for t in [root, *(proposal.token_ids[n] for n in path)]]
            checked += len(path)
            differ += [n for n, logits in zip(path, alone[1:]) if not torch.equal(tree.logits[n + 1], logits)]
    assert checked > 20
    assert differ == []


def test_seeded_speculation_is_plain_seeded_bf16_decoding(plain_bf16: LLM) -> None:
    seeded = SamplingParams(temperature=0.8, seed=7, max_tokens=40)
    want = plain_bf16.generate(PROMPTS[0], seeded, chat=True)[0].token_ids
    config = {"method": "ngram", "num_speculative_tokens": 3, "adaptive_draft_len": False}
    with LLM(plain_bf16.model, config, tokenizer=plain_bf16.tokenizer) as llm:
        assert llm.generate(PROMPTS[0], seeded, chat=True)[0].token_ids == want
        assert llm.generate(PROMPTS, [seeded, *GREEDY[1:]], chat=True)[0].token_ids == want


EDIT = SamplingParams(max_tokens=192)


@pytest.fixture(scope="module")
def code_edits(plain_bf16: LLM) -> tuple[list[str], list[list[int]]]:
    """Held-out code edits (renames: long copied spans) and their plain bfloat16 greedy outputs."""
    prompts = [q.turns[0] for q in load_questions("code_edits", ["rename"], per_category=5)[1:4]]
    return prompts, [plain_bf16.generate(p, EDIT, chat=True)[0].token_ids for p in prompts]


@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_long_drafts_on_code_edits_are_plain_bf16_decoding(plain_bf16: LLM, code_edits, method: str) -> None:
    """n-gram and suffix drafts run long on code edits (verify forwards of up to 25 tokens, their
    keys crossing blocks), with the default adaptive policy: the output is plain decoding's. With
    keys read in blocks of 32 rather than 512, 2 of 15 turns (n-gram) and 4 of 15 (suffix) once
    differed on an AVX512-BF16 EPYC: a verify read 320 keys where decoding alone read 288."""
    prompts, expected = code_edits
    with LLM(plain_bf16.model, {"method": method}, tokenizer=plain_bf16.tokenizer) as llm:
        outputs = [llm.generate(p, EDIT, chat=True)[0] for p in prompts]
    assert [o.token_ids for o in outputs] == expected
    assert sum(o.metrics.num_accepted_tokens for o in outputs) > 100


@pytest.mark.parametrize(("context", "widths"), [(100, range(1, 41)), (830, range(1, 9)), (1020, range(1, 9))])
def test_a_verify_forward_of_any_width_gives_each_token_its_plain_bits(plain_bf16: LLM, context: int, widths: range) -> None:
    """Chains of several widths in one forward: every token's logits are the bits of decoding it
    alone. Without the attention's padded query rows (attention.block_padding), a 2-token forward
    (6 folded rows against plain decoding's 3) gave its first token other bits, and 11 tokens (33
    rows, the last alone in its block) its last; without a one-row input multiplied as two
    (prepacked_linear), SmolLM2's 1,536-input layers did; at 830 keys, without whole key blocks
    past 512 (kv_cache.padded_key_length), a verify crossing 864 keys did; at 1020 one crosses 1,024."""
    runner = plain_bf16.runner
    prompt = [(7 * i) % 40000 + 100 for i in range(context)]
    tokens = [(13 * i) % 30000 + 200 for i in range(max(widths))]

    cache = prefilled_batch(runner, [prompt])
    alone = torch.stack([runner.forward(cache, [t]).logits[0] for t in tokens])
    differ = []
    for width in widths:
        logits = runner.forward_rows(prefilled_batch(runner, [prompt]), [tokens[:width]])[0].logits
        differ += [(width, j) for j in range(width) if not torch.equal(logits[j], alone[j])]
    assert differ == []
