"""Check and normalise the tensors passed to the verify operations, before either backend runs.

Both backends then see the same layout: contiguous int64 ids and counts, probabilities in their
own float dtype (fp32, fp16 or bf16; cast to fp32 inside), float32 random numbers. Content checks
(counts in range, draft ids inside the vocabulary, parents before children) cost one device sync
in total; they keep a bad caller from reading out of bounds in a kernel.
"""

from __future__ import annotations

import torch

from specdec.errors import VerifyInputError

PROB_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def ids(name: str, tensor: torch.Tensor, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    return _tensor(name, tensor, shape, device, integer=True).to(torch.long).contiguous()


def probs(name: str, tensor: torch.Tensor, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    tensor = _tensor(name, tensor, shape, device, integer=False)
    if tensor.dtype not in PROB_DTYPES:
        raise VerifyInputError(f"{name}: dtype {tensor.dtype} is not float32, float16 or bfloat16")
    return tensor.contiguous()


def randoms(name: str, tensor: torch.Tensor, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    return _tensor(name, tensor, shape, device, integer=False).to(torch.float32).contiguous()


def matrix(name: str, tensor: torch.Tensor) -> tuple[int, int]:
    """The ``[B, K]`` shape of ``tensor``, which must be 2-D."""
    if not isinstance(tensor, torch.Tensor) or tensor.dim() != 2:
        got = f"shape {list(tensor.shape)}" if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise VerifyInputError(f"{name}: expected a 2-D tensor [batch, length], got {got}")
    return tensor.shape[0], tensor.shape[1]


def vocab_size(name: str, tensor: torch.Tensor, batch: int, rows: int) -> int:
    if not isinstance(tensor, torch.Tensor) or tensor.dim() != 3 or tuple(tensor.shape[:2]) != (batch, rows):
        got = f"shape {list(tensor.shape)}" if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise VerifyInputError(f"{name}: expected shape [{batch}, {rows}, vocab], got {got}")
    if tensor.shape[2] == 0:
        raise VerifyInputError(f"{name}: the vocabulary is empty")
    return tensor.shape[2]


def require(checks: list[tuple[torch.Tensor, str]]) -> None:
    """Raise for the first check whose boolean tensor holds any ``False`` (one sync for all)."""
    if not checks:
        return
    passed = torch.stack([flag.all() for flag, _ in checks]).tolist()
    for ok, (_, message) in zip(passed, checks):
        if not ok:
            raise VerifyInputError(message)


def _tensor(name: str, tensor: torch.Tensor, shape: tuple[int, ...], device: torch.device, integer: bool) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise VerifyInputError(f"{name}: expected a tensor, got {type(tensor).__name__}")
    if tuple(tensor.shape) != shape:
        raise VerifyInputError(f"{name}: expected shape {list(shape)}, got {list(tensor.shape)}")
    if tensor.device != device:
        raise VerifyInputError(f"{name}: on {tensor.device}, the other inputs are on {device}")
    if integer and (tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool):
        raise VerifyInputError(f"{name}: expected integer ids, got dtype {tensor.dtype}")
    if not integer and not tensor.is_floating_point():
        raise VerifyInputError(f"{name}: expected a floating-point tensor, got dtype {tensor.dtype}")
    return tensor
