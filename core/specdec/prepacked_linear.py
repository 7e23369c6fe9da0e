"""CPU linear layers shaped for decoding: bfloat16 weights prepacked for oneDNN, and float32
layers that multiply a few rows as ``W @ x^T``.

**bfloat16.** ``F.linear`` on a bfloat16 CPU tensor hands oneDNN a weight in PyTorch's plain row-major layout on
every call. Reordering it once into oneDNN's blocked layout (``torch.ops.mkldnn._reorder_linear_weight``,
what PyTorch's inductor does for frozen CPU models) and multiplying with
``torch.ops.mkldnn._linear_pointwise`` is 2-3x faster for the shapes of decoding: measured on a
2-core AVX512-BF16 CPU, SmolLM2-135M's 49,152-row output layer took 1.5 ms instead of 4.3 ms for
one token and 3.1 ms instead of 6.7 ms for 13, and a whole one-token forward 34 ms instead of
48 ms. Plain decoding and every speculative forward go through the same layers, so speedups
stay ratios of like with like.

oneDNN picks its blocking, and with it each output's summation order, from the number of rows it
multiplies: on a 2-core AVX512-BF16 Xeon, SmolLM2's 1,536-to-576 layer gave some rows other bits
at 150 to 260 rows than one row at a time (every count up to 149 agreed, for every layer of the
model). A packed layer therefore multiplies at most :data:`ROW_BLOCK` rows per call, so a token's
output is the same whether a forward holds it alone, in a draft of eight or in a batch of 32
(issue 48's batch invariance; :mod:`specdec.kv_cache` pads the attention's keys for the same
reason). Prefill's long inputs run as several calls of that size, at oneDNN's full speed.
A layer whose lone rows oneDNN sums in another order than rows among others multiplies one row
as two (the row repeated; found once per shape by trying, :func:`_single_row_differs`): on a
2-core AMD EPYC with AVX512-BF16 (oneDNN without AMX), SmolLM2's 1,536-input layers gave some
tokens other bits alone than among 2 to 128 rows, which all agreed, and its other layers none;
the repeated row cost those layers 1 us each (32 against 31 us).

**float32.** ``F.linear(x, W)`` asks the BLAS for ``x @ W^T``: a few rows times the large weight,
transposed. For two or more rows torch's MKL then took about twice as long as for one, as if it
copied the weight into another layout on every call, and a verify forward of two to sixteen
tokens cost 1.6-2x a one-token forward (2-core AMD EPYC, AVX2; a 2-core AVX-512F Xeon stepped to
2x from four tokens), where streaming the weights once should cost little more than one token
does. ``(W @ x^T)^T`` is the same product with the weight as the left-hand matrix the BLAS
streams through: SmolLM2-135M's linear layers (each layer's weights once, 30 layers) took 53 ms
for two rows and 57 ms for four, against 129 and 139 ms. The BLAS is fastest at some row counts,
so a layer multiplies as many rows as cost least at or just above its count (:func:`padded_rows`,
the first rows repeated): one row as two, which streamed faster than the BLAS's matrix-vector
product (46 against 60 ms for the layers above), three as four (46 against 59 ms), seven as eight,
and above eight, one to four rows short of a multiple of eight as that multiple (16 rows took
75-85 ms against 93-152 for 12 to 15, 24 rows 96 ms against 116-140 for 22 and 23; medians of 9,
2-core AMD EPYC, AVX2). Counts just above a multiple of eight, and five or six rows, cost about
what the next multiple does or less, and are left as they are; a whole forward of 12 to 15
tokens took 0.69-0.84 of its time unpadded, one of 22, 23 or 31 tokens 0.77-0.88. Up to
:data:`ROW_BLOCK` rows
(measured faster up to 128, even at 256) take this path; more take ``F.linear``, as do weights
under :data:`SKINNY_MIN_WEIGHT` elements, which stay in cache. The sums are
float32's in another order, so outputs differ from ``F.linear``'s in the last bits, as
``F.linear``'s own outputs differ between row counts.

:func:`prepack_linears` turns a module's ``nn.Linear`` layers into :class:`PrepackedLinear`
(bfloat16) or :class:`SkinnyLinear` (float32), with the same parameters and ``state_dict``. A
layer takes its path only for inference on CPU: a CPU input of the weight's dtype with autograd
off (``torch.inference_mode`` or ``torch.no_grad``); anything else (training, another device or
dtype, compiling) runs ``F.linear``. A packed copy (bfloat16 only) costs the layer's weight size
again in memory, is rebuilt when the weight is replaced or changed in place, and is not used for
a weight created under ``torch.inference_mode``, whose changes PyTorch does not count.

``SPECDEC_PREPACK`` chooses: ``auto`` (the default: bfloat16 layers, when this PyTorch build
and CPU run oneDNN's bfloat16 kernels, and float32 layers) or ``off``.
"""

from __future__ import annotations

import functools
import logging

import torch
from torch import nn
from torch.nn import functional as F

from specdec.environment import env_choice

PREPACK_ENV = "SPECDEC_PREPACK"
_MODES = ("auto", "off")

log = logging.getLogger("specdec.prepacked_linear")

try:
    _reorder = torch.ops.mkldnn._reorder_linear_weight
    _linear = torch.ops.mkldnn._linear_pointwise
except (AttributeError, RuntimeError):
    _reorder = _linear = None
_NO_SCALARS: list[float] = []

#: The most rows one packed multiply takes (see the module docstring).
ROW_BLOCK = 128
#: The fewest weight elements a skinny float32 layer multiplies as ``W @ x^T``: a smaller weight
#: stays in cache, where the path gains nothing and its extra calls cost more than the product.
SKINNY_MIN_WEIGHT = 1 << 16
#: Row counts up to eight that a skinny layer multiplies as more rows (module docstring).
PADDED_ROWS = {1: 2, 3: 4, 7: 8}
#: Above eight rows, a count within half of this below a multiple of it is multiplied as that multiple.
ROW_MULTIPLE = 8


class PrepackedLinear(nn.Linear):
    """An ``nn.Linear`` that multiplies by a oneDNN-packed copy of its weight when it may."""

    _packed: torch.Tensor | None = None
    _packed_key: tuple[int, int] | None = None

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if weight.is_inference() or not _cpu_inference(input, weight, torch.bfloat16):
            return F.linear(input, weight, self.bias)
        key = (weight.data_ptr(), weight._version)
        if self._packed_key != key:
            self._packed = _reorder(weight.detach(), 1)
            self._packed_key = key
        rows = input.numel() // input.shape[-1] if input.shape[-1] else 0
        if 1 < rows <= ROW_BLOCK:
            return _linear(input, self._packed, self.bias, "none", _NO_SCALARS, "")
        blocks = input.reshape(-1, input.shape[-1]).split(ROW_BLOCK)
        out = torch.cat([self._multiply(block) for block in blocks])
        return out.reshape(*input.shape[:-1], out.shape[-1])

    def _multiply(self, rows: torch.Tensor) -> torch.Tensor:
        """``rows`` (at most :data:`ROW_BLOCK`) times the packed weight; one row as two where
        oneDNN multiplies a single row in another order (module docstring)."""
        if rows.shape[0] == 1 and _single_row_differs(self._packed, self.in_features, self.out_features, torch.get_num_threads()):
            return _linear(torch.cat([rows, rows]), self._packed, self.bias, "none", _NO_SCALARS, "")[:1]
        return _linear(rows, self._packed, self.bias, "none", _NO_SCALARS, "")

    def __getstate__(self) -> dict:
        """Copies and pickles leave the packed weight out (oneDNN's opaque tensors have no storage
        to copy); a copy packs its own at its first forward."""
        state = self.__dict__.copy()
        state.pop("_packed", None)
        state.pop("_packed_key", None)
        return state


#: Per (in, out, threads): whether one row is multiplied in another order than several.
_single_row_orders: dict[tuple[int, int, int], bool] = {}


def _single_row_differs(packed: torch.Tensor, in_features: int, out_features: int, threads: int) -> bool:
    """Whether oneDNN sums one row of this shape in another order than the same row among 2 to
    :data:`ROW_BLOCK` rows: tried once per shape and thread count on random rows (the order is
    the kernel's, not the values'; in bfloat16 it shows in a few outputs of each hundred rows)."""
    key = (in_features, out_features, threads)
    if key not in _single_row_orders:
        rows = torch.randn(ROW_BLOCK, in_features, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
        together = _linear(rows, packed, None, "none", _NO_SCALARS, "")
        alone = torch.cat([_linear(row[None], packed, None, "none", _NO_SCALARS, "") for row in rows])
        _single_row_orders[key] = not torch.equal(together, alone)
    return _single_row_orders[key]


def _cpu_inference(input: torch.Tensor, weight: torch.Tensor, dtype: torch.dtype) -> bool:
    return (
        input.dtype == dtype
        and weight.dtype == dtype
        and input.is_cpu
        and weight.is_cpu
        and not (torch.is_grad_enabled() and (input.requires_grad or weight.requires_grad))
        and not torch.compiler.is_compiling()  # inductor lowers (and packs) the layers its own way
    )


class SkinnyLinear(nn.Linear):
    """A float32 ``nn.Linear`` that multiplies up to :data:`ROW_BLOCK` rows as ``(W @ x^T)^T`` on
    CPU (see the module docstring)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        rows = input.numel() // input.shape[-1] if input.shape[-1] else 0
        if not (0 < rows <= ROW_BLOCK and weight.numel() >= SKINNY_MIN_WEIGHT
                and _cpu_inference(input, weight, torch.float32)):
            return F.linear(input, weight, self.bias)
        flat = input.reshape(rows, input.shape[-1])
        padded = padded_rows(rows)
        if padded > rows:
            flat = torch.cat([flat, flat[: padded - rows]])
        # Contiguous, as F.linear's output: later kernels see the layout they always did.
        out = torch.mm(weight, flat.t()).t()[:rows].contiguous()
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*input.shape[:-1], weight.shape[0])


def padded_rows(rows: int) -> int:
    """The rows a skinny layer multiplies for ``rows`` (at least ``rows``, at most twice): the
    count the BLAS multiplies fastest at or just above it (see the module docstring)."""
    if rows <= ROW_MULTIPLE:
        return PADDED_ROWS.get(rows, rows)
    short = -rows % ROW_MULTIPLE
    return rows + short if short <= ROW_MULTIPLE // 2 else rows


def prepack_mode() -> str:
    """``SPECDEC_PREPACK``, checked: ``auto`` or ``off``."""
    return env_choice(PREPACK_ENV, _MODES)


@functools.cache
def prepack_status() -> tuple[bool, str]:
    """Whether this PyTorch build and CPU can run packed bfloat16 linears, and why not."""
    if not torch.backends.mkldnn.is_available() or _linear is None:
        return False, "PyTorch was built without oneDNN linear packing"
    try:
        if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            return False, "this CPU has no oneDNN bfloat16 kernels"
        weight = torch.randn(24, 16).to(torch.bfloat16)
        inputs = torch.randn(3, 16).to(torch.bfloat16)
        packed = _linear(inputs, _reorder(weight, 1), None, "none", _NO_SCALARS, "")
    except (AttributeError, RuntimeError) as exc:
        return False, f"oneDNN linear packing failed: {type(exc).__name__}: {exc}"
    if not torch.allclose(packed.float(), F.linear(inputs, weight).float(), atol=1e-2, rtol=1e-2):
        return False, "oneDNN packed linear disagrees with F.linear"
    return True, "oneDNN bfloat16"


def prepack_linears(module: nn.Module) -> int:
    """Make every bfloat16 CPU ``nn.Linear`` in ``module`` a :class:`PrepackedLinear` and every
    float32 one a :class:`SkinnyLinear`, in place.

    :param module: a model or draft head, already on its device and in its dtype.
    :return: how many of its layers are :class:`PrepackedLinear` now (switched by this call or an
        earlier one); none are switched when ``SPECDEC_PREPACK=off``, and no bfloat16 layer when
        packing cannot run here (:func:`prepack_status`).
    """
    cpu_layers = [m for m in module.modules() if type(m) is nn.Linear and m.weight.device.type == "cpu"]
    if cpu_layers and prepack_mode() == "auto":
        packable = any(m.weight.dtype == torch.bfloat16 for m in cpu_layers)
        if packable and not prepack_status()[0]:
            log.info("linear weights stay unpacked: %s", prepack_status()[1])
            packable = False
        for layer in cpu_layers:
            if layer.weight.dtype == torch.float32:
                layer.__class__ = SkinnyLinear
            elif layer.weight.dtype == torch.bfloat16 and packable:
                layer.__class__ = PrepackedLinear
    return sum(isinstance(m, PrepackedLinear) for m in module.modules())
