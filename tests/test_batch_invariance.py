"""Batch invariance (issue 48): in bfloat16 on a CPU with oneDNN's bfloat16 kernels, a token's
logits have the same bits whether the runner computes it alone, among the drafts of a verify
forward or next to other requests of other lengths. That is what makes greedy speculative output
plain greedy decoding's, token for token, in bfloat16.

Without the padded key length (:func:`specdec.kv_cache.padded_key_length`) this fails on a CPU with
AVX512-BF16: PyTorch's flash attention then sums a token's keys in an order that depends on how
many keys follow it. Elsewhere (float32, whose MKL multiplies depend on the row count, CUDA, a CPU
without bfloat16 kernels) the bits may differ, so the tests skip there.
"""

from __future__ import annotations

import random

import pytest
import torch
import transformers

from specdec.kv_cache import KEY_SPLIT, padded_key_length
from specdec.requests import DraftProposal
from specdec.runner import ModelRunner
from specdec.testing import needs_prepacked_linears, prefilled_batch
from specdec.testing.tiny import make_tiny_target
from specdec.trees import path_to

#: Three prompts and their continuations, over the tiny vocabulary's ids 3 to 35; long enough that
#: every request crosses 32- and 64-key blocks.
PROMPTS = [[(5 * i + r) % 33 + 3 for i in range(n)] for r, n in enumerate((21, 30, 45))]
TOKENS = [[(7 * i + 11 * r) % 33 + 3 for i in range(48)] for r in range(3)]


@pytest.fixture
def model() -> torch.nn.Module:
    return make_tiny_target(num_layers=2, hidden=128).model.to(torch.bfloat16)


def _decode(runner: ModelRunner, requests: list[int], widths: list[list[int]]) -> list[torch.Tensor]:
    """Prefill each of ``requests`` (indices into PROMPTS) alone, then forward their TOKENS
    together, ``widths[step][b]`` tokens of request ``b`` per forward; each request's logits."""
    cache = prefilled_batch(runner, [PROMPTS[r] for r in requests])
    done = [0] * len(requests)
    logits: list[list[torch.Tensor]] = [[] for _ in requests]
    for step in widths:
        rows = [TOKENS[r][done[b] : done[b] + step[b]] for b, r in enumerate(requests)]
        # One request forwards as the engine forwards it alone (ModelRunner.forward).
        outputs = [runner.forward(cache, rows[0])] if len(rows) == 1 else runner.forward_rows(cache, rows)
        for b, out in enumerate(outputs):
            logits[b].append(out.logits)
            done[b] += step[b]
    return [torch.cat(parts) for parts in logits]


#: Verify widths of request 0 (48 tokens in all), and of the two requests beside it in a batch.
CHAINS = [2, 5, 3, 9, 1, 7, 4, 8, 6, 3]
BATCHED = [[(w + 3) % 5 + 1, w, (2 * w) % 7 + 1] for w in CHAINS]


@needs_prepacked_linears
def test_a_token_has_the_same_logits_alone_in_a_verify_forward_and_in_a_batch(model: torch.nn.Module) -> None:
    """Request 0 decoded one token per forward is the reference. Verify forwards of 1 to 9
    tokens, alone and in a batch of three requests of other lengths and widths, give every one of
    its tokens the same bits."""
    runner = ModelRunner(model)
    plain = _decode(runner, [0], [[1]] * 48)[0]
    assert torch.equal(_decode(runner, [0], [[w] for w in CHAINS])[0], plain)
    assert torch.equal(_decode(runner, [1, 0, 2], BATCHED)[1], plain)


@needs_prepacked_linears
def test_the_static_path_gives_the_eager_bits(model: torch.nn.Module) -> None:
    """The static-shape path attends over its key length buckets (here 512 keys) where the eager
    one reads the fewest whole blocks: the same batch of verify forwards gets the same bits."""
    eager = ModelRunner(model)
    static = ModelRunner(model, execution="static")
    static.prepare(max_rows=3, max_width=9)
    assert static.static
    assert torch.equal(_decode(static, [1, 0, 2], BATCHED)[1], _decode(eager, [1, 0, 2], BATCHED)[1])


@needs_prepacked_linears
def test_the_static_paths_last_bucket_gives_the_eager_bits(model: torch.nn.Module) -> None:
    """With a context limit of 600 the static path's longest bucket is its whole capacity: on the
    CPU 1,024 keys, two whole blocks as the eager path reads them, not 640: a last block of 128
    keys, whose length changes its sums without AMX (:func:`padded_key_length`). The tiny model's
    bits agreed even then; the capacity is what fails without the rounding."""
    eager = ModelRunner(model, max_model_len=600)
    static = ModelRunner(model, execution="static", max_model_len=600)
    static.prepare(max_rows=2, max_width=9)
    assert static._static.cache.capacity == 2 * KEY_SPLIT
    prompts = [[(5 * i + r) % 33 + 3 for i in range(n)] for r, n in enumerate((530, 500))]
    # Row 0 verifies chains of 9 from 530 keys on, row 1 chains of 3 from 500, crossing 512.
    steps = [[TOKENS[0][9 * k : 9 * k + 9], TOKENS[1][3 * k : 3 * k + 3]] for k in range(4)]
    logits = []
    for runner in (static, eager):
        cache = prefilled_batch(runner, prompts)
        logits.append([out.logits for rows in steps for out in runner.forward_rows(cache, rows)])
    assert all(torch.equal(s, e) for s, e in zip(*logits))


def test_keys_are_read_in_whole_blocks() -> None:
    """Every forward's attention multiplies whole blocks of 512 keys."""
    assert [padded_key_length(n) for n in (1, KEY_SPLIT - 1, KEY_SPLIT, KEY_SPLIT + 1, 830, 2 * KEY_SPLIT + 1)] == [
        KEY_SPLIT, KEY_SPLIT, KEY_SPLIT, 2 * KEY_SPLIT, 2 * KEY_SPLIT, 3 * KEY_SPLIT
    ]


def _random_tree(rng: random.Random, nodes: int) -> list[int]:
    """Parents of a random draft tree (``-1``: a child of the root), bushy and up to 7 deep."""
    parents: list[int] = []
    depths: list[int] = []
    for _ in range(nodes):
        parent = rng.choice([-1] + [n for n in range(len(parents)) if depths[n] < 7])
        parents.append(parent)
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return parents


#: Trees per request.
TREES = 3


def _smollm2_shaped(window: int | None) -> torch.nn.Module:
    """Two random layers with SmolLM2's attention (9 query heads of 64 over 3 key/value heads)
    and widths, in bfloat16, the shapes the real model's attention runs at; Mistral for a sliding
    window."""
    fields = {"vocab_size": 40, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 2,
              "num_attention_heads": 9, "num_key_value_heads": 3, "max_position_embeddings": 1024,
              "tie_word_embeddings": False}
    torch.manual_seed(0)
    if window is None:
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**fields)).eval().to(torch.bfloat16)
    return transformers.MistralForCausalLM(transformers.MistralConfig(**fields, sliding_window=window)).eval().to(torch.bfloat16)


@needs_prepacked_linears
@pytest.mark.parametrize(("window", "lengths"), [(None, (21, 100, 300, 490, 700)), (16, (21, 100, 300))])
def test_every_node_of_a_tree_has_its_chains_bits(window: int | None, lengths: tuple[int, ...]) -> None:
    """Random 24-node draft trees, cut to fit (ModelRunner.fit_tree) and verified in one forward
    for several requests of other lengths at once (one near the 512th key, one past it): every
    node's logits have the bits of decoding its path one token at a time. (Random weights rarely
    show a flat layout's other bits: about one node in 200 here, one in ten on the real model,
    which tests/test_real_model_bf16.py checks.) The sliding-window model checks that copied
    keys keep their positions for the window."""
    runner = ModelRunner(_smollm2_shaped(window))
    assert runner.aligned_trees
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 36) for _ in range(n)] for n in lengths]
    differ = []
    for _ in range(TREES):
        roots = [rng.randrange(3, 36) for _ in prompts]
        proposals = [
            runner.fit_tree(DraftProposal([rng.randrange(3, 36) for _ in range(24)], parents=_random_tree(rng, 24)), len(p))
            for p in prompts
        ]
        assert any(p.parents != list(range(-1, len(p) - 1)) for p in proposals)  # not just chains
        assert 490 not in lengths or len(proposals[lengths.index(490)]) < 24  # near the block's end: cut
        trees = runner.forward_rows(
            prefilled_batch(runner, prompts),
            [[root, *p.token_ids] for root, p in zip(roots, proposals)],
            parents=[[-1, *(q + 1 for q in p.parents)] for p in proposals],
        )
        for prompt, root, proposal, tree in zip(prompts, roots, proposals, trees):
            for leaf in set(range(len(proposal))) - set(proposal.parents):
                chain = prefilled_batch(runner, [prompt])
                path = path_to(leaf, proposal.parents)
                alone = [runner.forward(chain, [token]).logits[0] for token in [root, *(proposal.token_ids[n] for n in path)]]
                differ += [(len(prompt), n) for n, logits in zip(path, alone[1:]) if not torch.equal(tree.logits[n + 1], logits)]
    assert differ == []


@needs_prepacked_linears
def test_a_short_tree_on_the_longest_row_beside_a_wide_chain(model: torch.nn.Module) -> None:
    """A batch whose longest request verifies a tree taking few slots (here a single chain of two
    drafts) while a shorter one verifies a wide chain: the forward's keys end where its rows' writes
    do, not at the longest row's start plus the widest row (which crossed a key block here and
    failed with mismatched sizes), and each row gets its bits alone."""
    runner = ModelRunner(model)
    assert runner.aligned_trees
    prompts = [PROMPTS[0][:19] + TOKENS[0][:40], PROMPTS[1][:10]]  # 59 and 10 tokens
    rows = [TOKENS[1][:3], TOKENS[2][:9]]
    together = runner.forward_rows(prefilled_batch(runner, prompts), rows, parents=[[-1, 0, 1], None])
    for prompt, row, out in zip(prompts, rows, together):
        alone = runner.forward(prefilled_batch(runner, [prompt]), row)
        assert torch.equal(out.logits, alone.logits)
