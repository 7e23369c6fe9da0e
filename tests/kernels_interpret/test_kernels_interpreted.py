"""The Triton kernels equal the torch path exactly, and sample the target distribution.

Run under the Triton interpreter on CPU, or compiled on CUDA tensors with
``SPECDEC_TEST_DEVICE=cuda`` (see conftest.py). Shapes stay small: the interpreter runs each
program in Python (about 10 ms per request for rejection sampling, 40 ms for a tree).
"""

from __future__ import annotations

import itertools
import os
from collections import Counter

import pytest
import torch
from triton.runtime.interpreter import InterpretedFunction

from specdec import LLM, SamplingParams, kernels
from specdec.kernels import dispatch, reference
from specdec.kernels import triton_kernels as tk
from specdec.testing.conformance import P_VALUE_FLOOR, chi_square_p_value


def test_the_kernels_under_test_run() -> None:
    """Under TRITON_INTERPRET=1 the kernels really are the interpreter's (the comparisons below
    are not torch vs torch) and CPU tensors keep the torch path unless the triton backend is
    forced; otherwise they are compiled, and CUDA tensors go to them."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    for kernel in (tk.greedy_accept_kernel, tk.rejection_accept_kernel, tk.tree_accept_kernel):
        assert isinstance(kernel, InterpretedFunction) is interpreted
    if interpreted:
        assert dispatch.implementation(torch.device("cpu")) is dispatch._reference()
    else:
        assert dispatch.implementation(torch.device("cuda")) is dispatch._kernels()


def _on(device: torch.device, *tensors: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    """The inputs on the device under test: the interpreter reads CPU tensors, compiled kernels CUDA ones."""
    return tuple(t.to(device) if t is not None else None for t in tensors)


def _assert_same(got: tuple, expected: tuple) -> None:
    for name, a, b in zip(type(expected)._fields, got, expected):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(a, b), f"{name}: kernel {a.tolist()} != torch {b.tolist()}"


# -- greedy acceptance --------------------------------------------------------------------------


def _greedy_case(batch: int, k: int, kind: str, seed: int):
    g = torch.Generator().manual_seed(seed)
    draft_ids = torch.randint(0, 6, (batch, k), generator=g)
    num_drafts = torch.randint(0, k + 1, (batch,), generator=g) if kind == "mixed" else torch.full((batch,), k)
    target_argmax = torch.randint(0, 6, (batch, k + 1), generator=g)
    if kind == "all":
        target_argmax[:, :k] = draft_ids
    elif kind == "none":
        target_argmax[:, 0] = (draft_ids[:, 0] + 1) % 6
    elif kind == "mixed":  # each row matches a random prefix, then anything
        for row in range(batch):
            cut = int(torch.randint(0, k + 1, (), generator=g))
            target_argmax[row, :cut] = draft_ids[row, :cut]
    return draft_ids, num_drafts, target_argmax


@pytest.mark.parametrize(
    ("batch", "k", "kind"),
    [(1, 1, "all"), (1, 1, "none"), (1, 8, "all"), (1, 8, "none"), (1, 8, "mixed"), (5, 8, "mixed"), (4, 1, "mixed"), (3, 0, "all")],
)
def test_greedy_accept_equals_torch(batch: int, k: int, kind: str, device: torch.device) -> None:
    """Greedy acceptance: same accepted counts and padded output ids as the torch path, for batch
    1 and 5, draft lengths 0, 1 and 8, all accepted, none accepted and mixed padded rows."""
    draft_ids, num_drafts, target_argmax = _on(device, *_greedy_case(batch, k, kind, seed=batch * 10 + k))
    expected = reference.greedy_accept(draft_ids, num_drafts, target_argmax)
    _assert_same(tk.greedy_accept(draft_ids, num_drafts, target_argmax), expected)
    if kind == "all":
        assert torch.equal(expected.num_accepted, num_drafts)
    if kind == "none":
        assert not expected.num_accepted.any()


# -- rejection sampling -------------------------------------------------------------------------


def _distributions(shape: tuple[int, ...], g: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """Peaked random distributions with some exact zeros (as top-k leaves)."""
    x = torch.rand(shape, generator=g) ** 6
    x = torch.where(torch.rand(shape, generator=g) < 0.2, 0.0, x)
    x[..., 0] += 1e-3  # no all-zero row
    return (x / x.sum(-1, keepdim=True)).to(dtype)


def _rejection_case(batch: int, k: int, vocab: int, kind: str, dtype: torch.dtype, with_q: bool, seed: int):
    g = torch.Generator().manual_seed(seed)
    p = _distributions((batch, k + 1, vocab), g, dtype)
    q = _distributions((batch, k, vocab), g, dtype)
    draft_ids = torch.randint(0, vocab, (batch, k), generator=g)
    if kind != "none":  # drafts the target likes, so acceptance happens
        draft_ids = p[:, :k].float().argmax(-1)
    num_drafts = torch.randint(0, k + 1, (batch,), generator=g) if kind == "mixed" else torch.full((batch,), k)
    uniform = torch.rand(batch, k, generator=g)
    if kind == "all":
        uniform.zero_()  # u * q < p for every draft with p > 0
    if kind == "none":
        uniform.fill_(1.0 - 2**-24)
        q = torch.nn.functional.one_hot(draft_ids, vocab).to(dtype)  # u * 1 >= p unless p == 1
    if kind == "residual_empty":  # p == q, zero at the draft: rejected, and max(p - q, 0) == 0
        p = p.float()
        p[:, :k].scatter_(2, draft_ids[:, :, None], 0.0)
        p = (p / p.sum(-1, keepdim=True)).to(dtype)
        q = p[:, :k].clone()
    exponential = torch.empty(batch, vocab).exponential_(generator=g)
    return draft_ids, num_drafts, q if with_q else None, p, uniform, exponential


REJECTION_CASES = [
    # (batch, k, vocab, kind, dtype, with draft probs)
    (1, 1, 7, "random", torch.float32, True),
    (1, 1, 7, "random", torch.float32, False),
    (1, 8, 11, "all", torch.float32, True),
    (1, 8, 11, "none", torch.float32, True),
    (1, 8, 11, "none", torch.float32, False),
    (4, 8, 13, "mixed", torch.float32, True),
    (4, 8, 13, "mixed", torch.float32, False),
    (3, 4, 9, "residual_empty", torch.float32, True),
    (3, 0, 9, "random", torch.float32, False),
    (2, 3, 49152, "random", torch.float32, True),
    (3, 5, 17, "mixed", torch.float16, True),
    (3, 5, 17, "mixed", torch.float16, False),
    (3, 5, 17, "mixed", torch.bfloat16, True),
    (3, 5, 17, "mixed", torch.bfloat16, False),
]


@pytest.mark.parametrize(
    ("batch", "k", "vocab", "kind", "dtype", "with_q"),
    REJECTION_CASES,
    ids=[f"b{b}-k{k}-v{v}-{kind}-{str(d)[6:]}-{'q' if q else 'onehot'}" for b, k, v, kind, d, q in REJECTION_CASES],
)
def test_rejection_accept_equals_torch(batch, k, vocab, kind, dtype, with_q, device: torch.device) -> None:
    """Rejection sampling with the same random numbers: same accepted counts, same recovered and
    bonus tokens as the torch path, over batch 1 to 4, draft lengths 0 to 8, all / none / mixed
    accepted, an empty residual (p == q), a 49152-token vocabulary, fp32, fp16 and bf16 inputs,
    with draft probabilities and with one-hot drafts."""
    args = _on(device, *_rejection_case(batch, k, vocab, kind, dtype, with_q, seed=batch * 100 + k + vocab))
    expected = reference.rejection_accept(*args)
    _assert_same(tk.rejection_accept(*args), expected)
    num_drafts = args[1]
    if kind == "all":
        assert torch.equal(expected.num_accepted, num_drafts)
    if kind in ("none", "residual_empty"):
        assert not expected.num_accepted.any()
    if kind == "residual_empty":  # the fallback drew from p: a token p gives mass
        p0 = args[3][torch.arange(batch), 0].float()
        assert (p0.gather(1, expected.output_ids[:, :1]) > 0).all()


def _exact_outcomes(drafts: list[int], p: torch.Tensor, q: torch.Tensor) -> dict[tuple[int, int], float]:
    """P(num_accepted, next token) of rejection sampling with fixed drafts, computed exactly."""
    out: dict[tuple[int, int], float] = {}
    reach = 1.0
    for i, x in enumerate(drafts):
        keep = min(1.0, float(p[i, x] / q[i, x]))
        residual = (p[i] - q[i]).clamp_min(0)
        residual = residual / residual.sum()
        for token, mass in enumerate(residual.tolist()):
            out[(i, token)] = reach * (1 - keep) * mass
        reach *= keep
    for token, mass in enumerate(p[len(drafts)].tolist()):
        out[(len(drafts), token)] = reach * mass
    return out


def test_rejection_kernel_samples_the_target_distribution(device: torch.device) -> None:
    """Sampled output follows the target. 500 requests draw their drafts from q and go through
    the kernel in one batch: the first emitted token follows p (the lossless property), and the
    (accepted count, next token) pairs fit their exact probabilities, which check the acceptance
    rule, the recovered tokens and the bonus token (chi-square, small cells pooled)."""
    g = torch.Generator().manual_seed(7)
    p = torch.tensor([[0.10, 0.40, 0.20, 0.30], [0.30, 0.05, 0.25, 0.40], [0.25, 0.25, 0.10, 0.40]])
    q = torch.tensor([[0.05, 0.15, 0.50, 0.30], [0.10, 0.60, 0.10, 0.20]])
    n = 500
    draft_ids = torch.stack([torch.multinomial(q[i], n, replacement=True, generator=g) for i in range(2)], dim=1)
    got = tk.rejection_accept(*_on(
        device, draft_ids, torch.full((n,), 2), q.expand(n, 2, 4), p.expand(n, 3, 4),
        torch.rand(n, 2, generator=g), torch.empty(n, 4).exponential_(generator=g),
    ))
    first = Counter((row[0],) for row in got.output_ids.tolist())
    assert chi_square_p_value(first, {(t,): float(p[0, t]) for t in range(4)}, n) > P_VALUE_FLOOR

    exact: Counter = Counter()
    for d0, d1 in itertools.product(range(4), repeat=2):
        for outcome, mass in _exact_outcomes([d0, d1], p, q).items():
            exact[outcome] += float(q[0, d0] * q[1, d1]) * mass
    next_tokens = got.output_ids.gather(1, got.num_accepted[:, None])[:, 0]
    pairs = Counter(zip(got.num_accepted.tolist(), next_tokens.tolist()))
    assert all(exact[o] > 0 for o in pairs), "an outcome of probability 0 was drawn"
    assert {0, 1, 2} <= {o[0] for o in pairs}, "too few acceptance counts seen for the test to mean anything"
    assert chi_square_p_value(pairs, dict(exact), n) > P_VALUE_FLOOR


# -- tree acceptance ----------------------------------------------------------------------------

BINARY_TREE = [-1, -1, 0, 0, 1, 1, 2, 2]  # two roots' children, each with two children, ...


def _tree_case(batch: int, parents: list[int], kind: str, seed: int):
    g = torch.Generator().manual_seed(seed)
    n = len(parents)
    parents_t = torch.tensor([parents] * batch, dtype=torch.long)  # an empty list would make floats
    node_ids = torch.randint(0, 3, (batch, n), generator=g)
    target_argmax = torch.randint(0, 3, (batch, n + 1), generator=g)
    num_nodes = torch.randint(0, n + 1, (batch,), generator=g) if kind == "mixed" else torch.full((batch,), n)
    for row in range(batch):
        for i, parent in enumerate(parents):
            if kind == "all":
                target_argmax[row, parent + 1] = node_ids[row, i]
            if kind == "none" and parent < 0:
                node_ids[row, i] = (target_argmax[row, 0] + 1) % 3
    if kind == "all":  # siblings share their parent's argmax: make them equal so all are accepted
        for i, parent in enumerate(parents):
            node_ids[:, i] = target_argmax[:, parent + 1]
    return node_ids, parents_t, num_nodes, target_argmax


TREE_CASES = [
    (1, [-1], "random"),
    (1, [-1, 0, 1, 2, 3, 4, 5, 6], "all"),  # a chain of 8
    (1, BINARY_TREE, "all"),
    (1, BINARY_TREE, "none"),
    (3, BINARY_TREE, "random"),
    (3, [-1, 0, -1, 2, 1, 0, 4, 3], "mixed"),
    (2, [], "random"),
]


@pytest.mark.parametrize(("batch", "parents", "kind"), TREE_CASES, ids=[f"b{b}-n{len(p)}-{k}-{i}" for i, (b, p, k) in enumerate(TREE_CASES)])
def test_tree_accept_equals_torch(batch: int, parents: list[int], kind: str, device: torch.device) -> None:
    """Tree acceptance: same path length, path nodes and next token as the torch path, for one
    node, a chain of 8, a binary tree (all, none, random accepted), padded mixed trees and an
    empty tree."""
    args = _on(device, *_tree_case(batch, parents, kind, seed=batch + len(parents)))
    expected = reference.tree_accept(*args)
    _assert_same(tk.tree_accept(*args), expected)
    if kind == "none":
        assert not expected.num_accepted.any()
    if kind == "all" and parents:
        depth = {-1: 0}
        for i, parent in enumerate(parents):
            depth[i] = depth[parent] + 1
        assert expected.num_accepted.tolist() == [max(depth.values())] * batch


def test_tree_accept_ties_go_to_the_lowest_node(device: torch.device) -> None:
    """Two accepted paths of equal length: both backends keep the one ending at the lower index."""
    node_ids = torch.tensor([[5, 5, 7, 7]])
    parents = torch.tensor([[-1, -1, 0, 1]])
    target_argmax = torch.tensor([[5, 7, 7, 1, 2]])  # root -> 5 (both children), each -> 7
    args = _on(device, node_ids, parents, torch.tensor([4]), target_argmax)
    expected = reference.tree_accept(*args)
    assert expected.accepted_nodes.tolist() == [[0, 2, -1, -1]] and expected.next_token.tolist() == [1]
    _assert_same(tk.tree_accept(*args), expected)


# -- the engine through the kernels -------------------------------------------------------------


def test_engine_on_the_kernels_matches_the_torch_path(tiny, monkeypatch: pytest.MonkeyPatch) -> None:
    """With SPECDEC_VERIFY_BACKEND=triton the engine verifies sampled requests through the kernels: greedy output
    equals plain greedy; a sampled request (rejection sampling, torch's generator seeded alike)
    gives the very tokens the torch path gives (same random numbers, same decisions), with drafts
    both kept and rejected; and so does a seeded one (its own draws, matched greedily)."""
    prompt = tiny.encode("hello world, hello world, hello")
    config = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "adaptive_draft_len": False}
    plain = LLM(tiny.model, None, tokenizer=tiny.tokenizer).generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=16))[0]
    sampled = SamplingParams(temperature=1.0, top_k=4, max_tokens=12, ignore_eos=True)
    launches = Counter()
    for name in ("greedy_accept", "rejection_accept"):
        launch = getattr(tk, name)
        monkeypatch.setattr(tk, name, lambda *args, _launch=launch, _name=name: launches.update([_name]) or _launch(*args))
    outputs, seeded = {}, {}
    for backend in ("torch", "triton"):
        monkeypatch.setenv(dispatch.BACKEND_ENV, backend)
        assert kernels.backend_for(tiny.model.device) == backend
        with LLM(tiny.model, config, tokenizer=tiny.tokenizer) as llm:
            greedy = llm.generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=16))[0]
            assert greedy.token_ids == plain.token_ids and greedy.metrics.num_accepted_tokens > 0
            outputs[backend] = []
            for s in range(3):
                torch.manual_seed(s)
                outputs[backend].append(llm.generate({"prompt_token_ids": prompt}, sampled)[0])
            launches_before = launches["rejection_accept"]
            seeded[backend] = [
                llm.generate({"prompt_token_ids": prompt}, sampled.model_copy(update={"seed": s}))[0].token_ids
                for s in range(3)
            ]
            assert launches["rejection_accept"] == launches_before, "seeded requests need no rejection sampling"
    assert [o.token_ids for o in outputs["triton"]] == [o.token_ids for o in outputs["torch"]]
    assert seeded["triton"] == seeded["torch"]
    steps = sum(o.metrics.num_steps for o in outputs["triton"])
    # Greedy and seeded requests compare their drafts with the picks on the host.
    assert launches["rejection_accept"] == steps and launches["greedy_accept"] == 0
    accepted = sum(o.metrics.num_accepted_tokens for o in outputs["triton"])
    drafted = sum(o.metrics.num_draft_tokens for o in outputs["triton"])
    assert 0 < accepted < drafted


def test_bench_kernels_times_the_kernels(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                        device: torch.device) -> None:
    """`specdec bench-kernels` runs the kernels beside the torch path (under the interpreter, or
    compiled on CUDA) and finds the same results for every operation and batch size."""
    from specdec.cli.main import main

    monkeypatch.setenv("COLUMNS", "200")
    assert main(["bench-kernels", "--batch", "1,2", "--draft-len", "3", "--vocab", "64", "--iters", "1", "--device", device.type]) == 0
    rows = [line.split("│") for line in capsys.readouterr().out.splitlines() if line.startswith("│")]
    assert len(rows) == 8 and all(row[6].strip() == "yes" and float(row[4]) > 0 for row in rows), rows
