"""Prepacked bfloat16 linears and skinny float32 ones compute what ``F.linear`` does, only where
that is the same computation, follow weight changes, and can be switched off."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch.nn import functional as F

from specdec.errors import ConfigError
from specdec.prepacked_linear import (
    PREPACK_ENV, ROW_BLOCK, SKINNY_MIN_WEIGHT, PrepackedLinear, SkinnyLinear, padded_rows, prepack_linears,
)
from specdec.runner import ModelRunner
from specdec.testing import needs_prepacked_linears


def _layers(dtype: torch.dtype = torch.bfloat16, bias: bool = True) -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 96, bias=bias), torch.nn.ReLU(), torch.nn.Linear(96, 40)).to(dtype)


def _reference(model: torch.nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    hidden = torch.relu(F.linear(x, model[0].weight, model[0].bias))
    return F.linear(hidden, model[2].weight, model[2].bias)


def _packed_run(rows: int) -> tuple[torch.nn.Sequential, torch.Tensor, torch.Tensor]:
    """Packed bfloat16 layers, an input of ``rows`` rows, and their output under inference mode."""
    model = _layers()
    prepack_linears(model)
    x = torch.randn(rows, 64).to(torch.bfloat16)
    with torch.inference_mode():
        return model, x, model(x)


def _assert_like_f_linear(model: torch.nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        out = model(x)
    torch.testing.assert_close(out.float(), _reference(model, x).float(), atol=2e-2, rtol=2e-2)
    return out


@needs_prepacked_linears
@pytest.mark.parametrize("shape", [(1, 64), (13, 64), (2, 5, 64)])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_layers_match_f_linear(shape, bias):
    """One-token, multi-token and batched 3-D inputs, with and without bias, use the packed weight
    and give F.linear's outputs (to bfloat16 rounding)."""
    model = _layers(bias=bias)
    assert prepack_linears(model) == 2
    assert all(type(model[i]) is PrepackedLinear for i in (0, 2))
    _assert_like_f_linear(model, torch.randn(shape).to(torch.bfloat16))
    assert model[0]._packed is not None and model[2]._packed is not None
    assert set(model[0].state_dict()) == ({"weight", "bias"} if bias else {"weight"})


@needs_prepacked_linears
def test_training_and_other_dtypes_use_f_linear():
    """With autograd on, a layer runs F.linear and gradients flow; a layer later cast to float32
    runs F.linear too."""
    model = _layers()
    prepack_linears(model)
    x = torch.randn(3, 64).to(torch.bfloat16)
    model(x).float().sum().backward()
    assert model[0].weight.grad is not None and model[0]._packed is None
    model.float()
    x = x.float()
    with torch.inference_mode():
        assert torch.equal(model(x), _reference(model, x))
    assert model[0]._packed is None


@needs_prepacked_linears
def test_packed_weight_follows_weight_changes():
    """An in-place update or a replaced weight repacks, so outputs never come from stale weights."""
    model, x, before = _packed_run(4)
    with torch.no_grad():
        model[2].weight.mul_(-1)
    _assert_like_f_linear(model, x)
    model[0].weight = torch.nn.Parameter(torch.zeros_like(model[0].weight))
    after = _assert_like_f_linear(model, x)
    assert not torch.equal(before, after)


@needs_prepacked_linears
def test_copies_and_pickles_repack():
    """A deep copy or an unpickled copy of used packed layers (whose packed weight cannot be
    copied) packs its own and computes the same."""
    model, x, out = _packed_run(2)
    for other in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert type(other[0]) is PrepackedLinear
        with torch.inference_mode():
            assert torch.equal(other(x), out)
        assert other[0]._packed is not None


@pytest.mark.parametrize("shape", [
    (1, 64), (2, 64), (3, 64), (1, 3, 64), (2, 5, 64), (7, 64), (9, 64), (1, 13, 64), (ROW_BLOCK - 1, 64), (ROW_BLOCK, 64),
    (ROW_BLOCK + 1, 64),
])
@pytest.mark.parametrize("bias", [False, True])
def test_float32_layers_multiply_few_rows_as_w_times_x_transposed(shape, bias):
    """float32 CPU layers become skinny ones (not counted as packed: they hold no packed weight),
    whose inference outputs are F.linear's to float32 rounding for one row (doubled), three
    (padded to four), seven (to eight), thirteen (to sixteen), a batch, ``ROW_BLOCK - 1`` rows (to
    ``ROW_BLOCK``), ``ROW_BLOCK`` and past it (where F.linear itself runs)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 1024, bias=bias), torch.nn.ReLU(), torch.nn.Linear(1024, 64))
    assert min(model[i].weight.numel() for i in (0, 2)) >= SKINNY_MIN_WEIGHT
    assert prepack_linears(model) == 0
    assert all(type(model[i]) is SkinnyLinear for i in (0, 2))
    x = torch.randn(shape)
    with torch.inference_mode():
        out = model(x)
    assert out.shape == (*shape[:-1], 64) and out.is_contiguous()  # as F.linear's: later kernels keep their layout
    torch.testing.assert_close(out, _reference(model, x), atol=1e-5, rtol=1e-5)


def test_padding_never_shrinks_never_doubles_and_keeps_the_row_block():
    """A skinny layer multiplies at least its rows, never more than twice them, and a count up to
    ``ROW_BLOCK`` stays within it (one call)."""
    for rows in range(1, ROW_BLOCK + 1):
        assert rows <= padded_rows(rows) <= min(2 * rows, ROW_BLOCK)
    assert [padded_rows(n) for n in (1, 3, 5, 6, 7, 8, 9, 12, 13, 16, 17, 20, 127)] == [2, 4, 5, 6, 8, 8, 9, 16, 16, 16, 17, 24, 128]


def test_float32_training_runs_f_linear_and_off_leaves_layers_alone(monkeypatch):
    """With autograd on, a skinny layer is F.linear bit for bit (and trains); ``off`` switches nothing."""
    model = _layers(torch.float32)
    prepack_linears(model)
    x = torch.randn(3, 64, requires_grad=True)
    out = model(x)
    assert torch.equal(out, _reference(model, x))
    out.sum().backward()
    assert model[0].weight.grad is not None
    monkeypatch.setenv(PREPACK_ENV, "off")
    for dtype in (torch.float32, torch.bfloat16):
        model = _layers(dtype)
        assert prepack_linears(model) == 0
        assert type(model[0]) is torch.nn.Linear


def test_unknown_mode_names_the_variable(monkeypatch):
    monkeypatch.setenv(PREPACK_ENV, "always")
    with pytest.raises(ConfigError, match=f"{PREPACK_ENV}: expected one of auto, off, got 'always'"):
        prepack_linears(_layers())


@needs_prepacked_linears
def test_runner_packs_bf16_targets_and_keeps_their_logits(tiny, monkeypatch):
    """A bfloat16 target's every linear layer is packed by the runner; its forwards (prefill, one
    token, a draft tree) give the logits of the unpacked model to bfloat16 rounding. Packing is
    for CPU weights, so the model is a CPU copy whatever the device under test."""
    packed = ModelRunner(copy.deepcopy(tiny.model).to("cpu", torch.bfloat16))
    linears = sum(isinstance(m, torch.nn.Linear) for m in packed.model.modules())
    assert packed.prepacked_linears == linears > 0
    monkeypatch.setenv(PREPACK_ENV, "off")
    plain = ModelRunner(copy.deepcopy(tiny.model).to("cpu", torch.bfloat16))
    assert plain.prepacked_linears == 0
    assert ModelRunner(copy.deepcopy(tiny.model).cpu()).prepacked_linears == 0
    prompt = tiny.encode("hello there, how are you?")
    outputs = []
    for runner in (packed, plain):
        cache = runner.new_cache()
        steps = [runner.forward(cache, prompt).logits, runner.forward(cache, [5]).logits]
        steps += [o.logits for o in runner.forward_rows(cache, [[6, 7, 8, 9]], parents=[[-1, 0, 0, 1]])]
        outputs.append(steps)
    for mine, theirs in zip(*outputs):
        torch.testing.assert_close(mine, theirs, atol=5e-2, rtol=5e-2)


@needs_prepacked_linears
def test_a_row_gets_the_same_bits_however_many_rows_share_the_call():
    """Batch invariance (issue 48): each row's output is the one it gets alone, at row counts up
    to ROW_BLOCK and past it, 2-D and 3-D. The shape is SmolLM2's 1,536-to-576 layer, which
    oneDNN, called with all rows at once, gave other bits at 150 to 260 rows."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1536, 576)).to(torch.bfloat16)
    prepack_linears(model)
    x = torch.randn(300, 1536).to(torch.bfloat16)
    with torch.inference_mode():
        alone = torch.cat([model(x[i : i + 1]) for i in range(300)])
        for rows in (2, 7, ROW_BLOCK, ROW_BLOCK + 1, 200, 256, 300):
            assert torch.equal(model(x[:rows]), alone[:rows]), rows
        assert torch.equal(model(x.view(2, 150, 1536)), alone.view(2, 150, 576))
