"""specdec.kernels: the torch path against plain-Python oracles, input errors, backend dispatch,
the kernels compiled for sm80 / sm90 without a GPU, and the interpreter tests in their own process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specdec import kernels
from specdec.errors import ConfigError, SpecdecError, VerifyInputError
from specdec.kernels import dispatch
from specdec.testing import DEVICE_ENV

ROOT = Path(__file__).resolve().parent.parent

# -- the torch path against independent oracles -------------------------------------------------


def _greedy_oracle(drafts: list[int], argmax: list[int]) -> tuple[int, list[int]]:
    n = 0
    while n < len(drafts) and drafts[n] == argmax[n]:
        n += 1
    return n, drafts[:n] + [argmax[n]]


def test_greedy_accept_matches_a_python_oracle() -> None:
    """Over random padded batches, each row's accepted count and output ids equal a per-request
    Python loop; padding is -1."""
    g = torch.Generator().manual_seed(0)
    for batch, k in ((1, 1), (6, 5), (4, 0)):
        draft_ids = torch.randint(0, 3, (batch, k), generator=g)
        num_drafts = torch.randint(0, k + 1, (batch,), generator=g)
        target_argmax = torch.randint(0, 3, (batch, k + 1), generator=g)
        got = kernels.greedy_accept(draft_ids, num_drafts, target_argmax)
        for row in range(batch):
            nd = int(num_drafts[row])
            n, out = _greedy_oracle(draft_ids[row, :nd].tolist(), target_argmax[row].tolist())
            assert int(got.num_accepted[row]) == n
            assert got.output_ids[row].tolist() == out + [-1] * (k - n)


def _rejection_oracle(drafts, p, q, u, e) -> tuple[int, int]:
    """One request, written as a loop over drafts; ``q`` is None for one-hot drafts."""
    for i, x in enumerate(drafts):
        qx = float(q[i, x]) if q is not None else 1.0
        if float(u[i]) * qx >= float(p[i, x]):
            q_row = q[i] if q is not None else torch.nn.functional.one_hot(torch.tensor(x), p.shape[1]).float()
            w = (p[i] - q_row).clamp_min(0)
            w = w if (w > 0).any() else p[i]
            return i, int(torch.where(w > 0, w / e, -1.0).argmax())
    k = len(drafts)
    return k, int(torch.where(p[k] > 0, p[k] / e, -1.0).argmax())


@pytest.mark.parametrize("one_hot", [False, True])
def test_rejection_accept_matches_a_python_oracle(one_hot: bool) -> None:
    """Batched, padded rejection sampling gives each row the decision a per-request loop takes
    with the same random numbers (the batching and padding change nothing)."""
    g = torch.Generator().manual_seed(1)
    batch, k, vocab = 8, 4, 6
    p = torch.rand(batch, k + 1, vocab, generator=g) ** 3
    p = p / p.sum(-1, keepdim=True)
    q = torch.rand(batch, k, vocab, generator=g) ** 3
    q = None if one_hot else q / q.sum(-1, keepdim=True)
    draft_ids = torch.randint(0, vocab, (batch, k), generator=g)
    num_drafts = torch.randint(0, k + 1, (batch,), generator=g)
    u, e = torch.rand(batch, k, generator=g), torch.empty(batch, vocab).exponential_(generator=g)
    got = kernels.rejection_accept(draft_ids, num_drafts, q, p, u, e)
    seen = set()
    for row in range(batch):
        nd = int(num_drafts[row])
        n, token = _rejection_oracle(draft_ids[row, :nd].tolist(), p[row], None if q is None else q[row], u[row], e[row])
        assert int(got.num_accepted[row]) == n
        assert got.output_ids[row].tolist() == draft_ids[row, :n].tolist() + [token] + [-1] * (k - n)
        seen.add(n == nd)
    assert seen == {True, False}, "the batch should hold rows with and without a rejection"


def _tree_oracle(tokens: list[int], parents: list[int], argmax: list[int]) -> tuple[list[int], int]:
    """Enumerate every root-to-node path; keep the longest fully matching one (lowest end node)."""
    best: list[int] = []
    for end in range(len(tokens)):
        path, node = [], end
        while node >= 0:
            path.insert(0, node)
            node = parents[node]
        if all(tokens[n] == argmax[parents[n] + 1] for n in path) and len(path) > len(best):
            best = path
    return best, argmax[best[-1] + 1] if best else argmax[0]


def test_tree_accept_matches_a_path_enumerating_oracle() -> None:
    """On random trees with a 2-token alphabet (so deep paths get accepted), the accepted path and
    next token equal an oracle that enumerates every root-to-node path."""
    g = torch.Generator().manual_seed(2)
    batch, n = 40, 9
    parents = torch.stack([torch.tensor([int(torch.randint(-1, i, (), generator=g)) for i in range(n)]) for _ in range(batch)])
    node_ids = torch.randint(0, 2, (batch, n), generator=g)
    num_nodes = torch.randint(0, n + 1, (batch,), generator=g)
    target_argmax = torch.randint(0, 2, (batch, n + 1), generator=g)
    got = kernels.tree_accept(node_ids, parents, num_nodes, target_argmax)
    depths = set()
    for row in range(batch):
        m = int(num_nodes[row])
        path, token = _tree_oracle(node_ids[row, :m].tolist(), parents[row, :m].tolist(), target_argmax[row].tolist())
        assert int(got.num_accepted[row]) == len(path)
        assert got.accepted_nodes[row].tolist() == path + [-1] * (n - len(path))
        assert int(got.next_token[row]) == token
        depths.add(len(path))
    assert max(depths) >= 3 and 0 in depths


# -- input errors -------------------------------------------------------------------------------


def _rejection_args(**changes):
    args = {
        "draft_ids": torch.tensor([[1, 2]]),
        "num_drafts": torch.tensor([2]),
        "draft_probs": None,
        "target_probs": torch.full((1, 3, 4), 0.25),
        "uniform": torch.rand(1, 2),
        "exponential": torch.ones(1, 4),
    }
    return {**args, **changes}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"draft_ids": torch.tensor([1, 2])}, "draft_ids: expected a 2-D tensor"),
        ({"draft_ids": torch.tensor([[1.0, 2.0]])}, "draft_ids: expected integer ids"),
        ({"draft_ids": torch.tensor([[1, 4]])}, r"draft_ids: every draft must lie in \[0, 4\)"),
        ({"num_drafts": torch.tensor([3])}, r"num_drafts: every count must lie in \[0, 2\]"),
        ({"num_drafts": torch.tensor([2, 2])}, r"num_drafts: expected shape \[1\]"),
        ({"target_probs": torch.full((1, 2, 4), 0.25)}, r"target_probs: expected shape \[1, 3, vocab\]"),
        ({"target_probs": torch.full((1, 3, 4), 0.25, dtype=torch.float64)}, "target_probs: dtype torch.float64"),
        ({"draft_probs": torch.full((1, 2, 5), 0.2)}, r"draft_probs: expected shape \[1, 2, 4\]"),
        ({"uniform": torch.rand(1, 3)}, r"uniform: expected shape \[1, 2\]"),
        ({"exponential": torch.ones(4)}, r"exponential: expected shape \[1, 4\]"),
    ],
)
def test_rejection_accept_rejects_bad_input(changes, message) -> None:
    """Bad tensors raise VerifyInputError with one line naming the argument and the reason."""
    with pytest.raises(VerifyInputError, match=message) as info:
        kernels.rejection_accept(**_rejection_args(**changes))
    assert "\n" not in str(info.value)


def test_padding_past_the_counts_is_not_checked() -> None:
    """Entries past num_drafts / num_nodes are padding: any value there is accepted and ignored."""
    out = kernels.rejection_accept(**_rejection_args(draft_ids=torch.tensor([[1, -7]]), num_drafts=torch.tensor([1])))
    assert out.output_ids[0, 2] == -1
    tree = kernels.tree_accept(torch.tensor([[3, 9]]), torch.tensor([[-1, 5]]), torch.tensor([1]), torch.tensor([[3, 4, 0]]))
    assert tree.accepted_nodes.tolist() == [[0, -1]] and tree.next_token.tolist() == [4]


def test_tree_and_greedy_reject_bad_input() -> None:
    """A parent that does not come before its child, counts out of range and shapes that do not
    fit are one-line VerifyInputErrors."""
    ids, argmax = torch.tensor([[1, 2]]), torch.tensor([[1, 2, 3]])
    with pytest.raises(VerifyInputError, match="parents: each parent must be -1 or an earlier node"):
        kernels.tree_accept(ids, torch.tensor([[-1, 1]]), torch.tensor([2]), argmax)
    with pytest.raises(VerifyInputError, match=r"num_nodes: every count must lie in \[0, 2\]"):
        kernels.tree_accept(ids, torch.tensor([[-1, 0]]), torch.tensor([-1]), argmax)
    with pytest.raises(VerifyInputError, match=r"target_argmax: expected shape \[1, 3\]"):
        kernels.greedy_accept(ids, torch.tensor([2]), torch.tensor([[1, 2]]))


# -- dispatch -----------------------------------------------------------------------------------

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
HAS_CUDA = torch.cuda.is_available()  # read before any test patches it


@pytest.fixture
def probe(monkeypatch: pytest.MonkeyPatch):
    """A fresh triton probe for the test (and after it), with the backend variable unset and no
    CUDA device (also on a machine that has one; a test that wants CUDA patches it back)."""
    monkeypatch.delenv(dispatch.BACKEND_ENV, raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    dispatch.triton_status.cache_clear()
    yield monkeypatch
    dispatch.triton_status.cache_clear()


def test_backend_setting(probe: pytest.MonkeyPatch) -> None:
    """auto uses torch for CPU tensors; torch is always allowed; triton on CPU without the
    interpreter is a one-line error that says what is missing; an unknown value names the variable."""
    assert kernels.backend_for(CPU) == "torch"
    probe.setenv(dispatch.BACKEND_ENV, "torch")
    assert kernels.backend_for(CPU) == kernels.backend_for(CUDA) == "torch"
    assert "torch everywhere" in kernels.describe()
    probe.setenv(dispatch.BACKEND_ENV, "triton")
    with pytest.raises(SpecdecError, match="SPECDEC_VERIFY_BACKEND=triton, but the kernels cannot run: no CUDA device"):
        kernels.backend_for(CPU)
    probe.setenv("TRITON_INTERPRET", "1")
    dispatch.triton_status.cache_clear()
    assert kernels.backend_for(CPU) == "triton"
    probe.setenv(dispatch.BACKEND_ENV, "cuda")
    with pytest.raises(ConfigError, match="SPECDEC_VERIFY_BACKEND: expected one of auto, torch, triton, got 'cuda'"):
        kernels.backend_for(CPU)


@pytest.mark.skipif(HAS_CUDA, reason="this machine has a GPU driver, so its absence cannot be tested")
def test_no_gpu_driver_falls_back_to_torch(probe: pytest.MonkeyPatch) -> None:
    """With CUDA tensors but no GPU driver for triton (the real triton on this GPU-less machine,
    told that CUDA is there), auto falls back to torch and keeps the reason; forcing triton
    reports it."""
    probe.setattr(torch.cuda, "is_available", lambda: True)
    status = kernels.triton_status()
    assert not status.usable and "no usable GPU driver" in status.reason
    assert kernels.backend_for(CUDA) == "torch"
    assert status.reason in kernels.describe()
    probe.setenv(dispatch.BACKEND_ENV, "triton")
    with pytest.raises(SpecdecError, match="no usable GPU driver"):
        kernels.backend_for(CUDA)


def test_failed_triton_import_falls_back_to_torch(probe: pytest.MonkeyPatch) -> None:
    """If `import triton` fails, auto uses torch for CUDA tensors and the reason names the error."""
    probe.setattr(torch.cuda, "is_available", lambda: True)
    probe.setitem(sys.modules, "triton", None)  # makes `import triton` raise ImportError
    status = kernels.triton_status()
    assert not status.usable and status.reason.startswith("import triton failed: ModuleNotFoundError")
    assert kernels.backend_for(CUDA) == "torch"


def test_without_cuda_triton_is_not_imported(probe: pytest.MonkeyPatch) -> None:
    """On a machine without CUDA the probe answers without importing triton (a second saved)."""
    probe.setitem(sys.modules, "triton", None)
    assert kernels.triton_status().reason.startswith("no CUDA device; triton")
    assert kernels.backend_for(CPU) == "torch"


# -- the kernels compile for real GPUs ----------------------------------------------------------

I64 = "*i64"
COMPILE_CASES = {
    "greedy": ("greedy_accept_kernel", dict.fromkeys(("draft_ids_ptr", "num_drafts_ptr", "target_argmax_ptr",
                                                       "num_accepted_ptr", "output_ids_ptr"), I64) | {"K": "i32"},
               {"BLOCK_K": 16}, 1),
    "tree": ("tree_accept_kernel", dict.fromkeys(("node_ids_ptr", "parents_ptr", "num_nodes_ptr", "target_argmax_ptr",
                                                   "num_accepted_ptr", "accepted_nodes_ptr", "next_token_ptr"), I64)
             | {"N": "i32"}, {"BLOCK_N": 64}, 4),
}
for _dtype, _has_q in (("fp32", True), ("fp32", False), ("fp16", True), ("bf16", True)):
    COMPILE_CASES[f"rejection-{_dtype}-{'q' if _has_q else 'onehot'}"] = (
        "rejection_accept_kernel",
        {"draft_ids_ptr": I64, "num_drafts_ptr": I64, "draft_probs_ptr": f"*{_dtype}", "target_probs_ptr": f"*{_dtype}",
         "uniform_ptr": "*fp32", "exponential_ptr": "*fp32", "num_accepted_ptr": I64, "output_ids_ptr": I64,
         "K": "i32", "V": "i32"},
        {"HAS_DRAFT_PROBS": _has_q, "BLOCK_K": 16, "BLOCK_V": 1024},
        4,
    )


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="the interpreter replaces the compiler")
@pytest.mark.parametrize("arch", [80, 90])
def test_kernels_compile_for_sm80_and_sm90(arch: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every kernel variant compiles to PTX and a cubin for sm80 and sm90 with the wheel's ptxas,
    no GPU needed: this catches what the interpreter lets through (loop variables changing
    type, Python constructs the compiler rejects). Rejection sampling's divisions are IEEE
    round-to-nearest (div.rn), as torch's, and no multiply-add is fused, so its float math
    rounds exactly as the torch path's."""
    pytest.importorskip("triton", reason="triton ships Linux wheels only")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from specdec.kernels import triton_kernels

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # compile for real, not from a cache
    for name, (kernel, signature, constexprs, num_warps) in COMPILE_CASES.items():
        fn = getattr(triton_kernels, kernel)
        src = ASTSource(fn, signature | dict.fromkeys(constexprs, "constexpr"), constexprs)
        options = {"enable_fp_fusion": False, "num_warps": num_warps}  # as the launchers use them
        compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
        ptx = compiled.asm["ptx"]
        assert f".target sm_{arch}" in ptx and compiled.asm["cubin"], name
        if kernel == "rejection_accept_kernel":
            assert "div.rn.f32" in ptx and "div.full" not in ptx and "div.approx" not in ptx, name
            assert "fma.rn.f32" not in ptx, name


# -- the interpreter tests, in their own process --------------------------------------------------


def _interpreter_works() -> bool:
    """Triton's interpreter before 3.9 turns kernel scalars into one-element arrays and calls
    ``int()`` on them, which NumPy 2.4 refuses (specdec asks for triton>=3.9; a GPU machine's
    torch may pin an older one, whose compiler the kernels still support)."""
    from importlib.metadata import version

    def release(name: str) -> tuple[int, ...]:
        return tuple(int(part) for part in version(name).split(".")[:2])

    return release("triton") >= (3, 9) or release("numpy") < (2, 4)


def test_kernels_under_the_triton_interpreter() -> None:
    """tests/kernels_interpret passes under TRITON_INTERPRET=1 in a separate pytest process (the
    variable must be set before the kernels are defined, and must not leak into this process):
    kernels equal the torch path exactly, sample the target distribution, and drive the engine.

    The process sees no GPU, also on a machine that has one: the interpreter runs on CPU tensors,
    and every "CUDA when present" default there (a model's device, bench-kernels' device, the
    backend probe) must pick the CPU, as on the machines CI runs on."""
    pytest.importorskip("triton", reason="triton ships Linux wheels only")
    if not _interpreter_works():
        pytest.skip("this triton's interpreter cannot run with this NumPy (triton<3.9, numpy>=2.4)")
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": "", DEVICE_ENV: "cpu"}
    env.pop(dispatch.BACKEND_ENV, None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(ROOT / "tests" / "kernels_interpret")],
        capture_output=True, text=True, timeout=600, env=env, cwd=ROOT,
    )
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, summary


# -- specdec bench-kernels ------------------------------------------------------------------------


def test_bench_kernels_inputs_are_on_the_device_asked_for() -> None:
    """Every operation's inputs go to ``--device`` (the tree's once stayed on the CPU, which only a
    GPU run could show); the meta device stands in for CUDA."""
    from specdec.cli.bench_kernels import OPS, _inputs

    for op in OPS:
        args = _inputs(op, 2, 3, 16, torch.device("meta"), torch.float32)
        assert all(a.device.type == "meta" for a in args if isinstance(a, torch.Tensor)), op


def test_bench_kernels_runs_the_torch_path_on_cpu(capsys: pytest.CaptureFixture[str], probe: pytest.MonkeyPatch) -> None:
    """On a machine without a GPU, `specdec bench-kernels` times every operation on the torch path,
    prints the table and says why the kernels were not timed."""
    from specdec.cli.main import main

    probe.setenv("COLUMNS", "200")
    assert main(["bench-kernels", "--batch", "1,3", "--draft-len", "3", "--vocab", "50", "--iters", "2", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("│")]
    assert len(rows) == 8, out  # 4 operations x 2 batch sizes
    assert all(float(row.split("│")[3]) > 0 for row in rows)
    assert "triton kernels not timed: no CUDA device" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ops", "greedy,foo"], "--ops: unknown foo; choose from greedy, rejection, rejection-onehot, tree"),
        (["--batch", "1,x"], "--batch: expected a comma list of integers"),
        (["--batch", "0"], "--batch: batch sizes must be at least 1"),
        (["--device", "cuda"], "--device: cuda requested, but no CUDA device is available"),
    ],
)
def test_bench_kernels_bad_input(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Bad options are one line on stderr and exit code 2."""
    from specdec.cli.main import main

    if "cuda" in args and HAS_CUDA:
        pytest.skip("this machine has CUDA")
    assert main(["bench-kernels", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
