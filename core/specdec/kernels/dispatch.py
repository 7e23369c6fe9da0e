"""Which implementation runs the verify operations: the Triton kernels or the torch path.

``SPECDEC_VERIFY_BACKEND`` (read at every call) chooses:

- ``auto`` (default): the kernels for CUDA tensors when triton works, the torch path otherwise;
- ``torch``: always the torch path;
- ``triton``: always the kernels; an error if triton cannot run them (CPU tensors need the
  Triton interpreter, ``TRITON_INTERPRET=1``).

Whether triton works is probed once, lazily (importing triton costs about a second): a failed
``import triton`` or a missing GPU driver is recorded as a reason and the torch path is used.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import logging
import os
from dataclasses import dataclass
from types import ModuleType

import torch

from specdec.environment import env_choice
from specdec.errors import SpecdecError

BACKEND_ENV = "SPECDEC_VERIFY_BACKEND"
BACKENDS = ("auto", "torch", "triton")

log = logging.getLogger("specdec.kernels")


@dataclass(frozen=True)
class TritonStatus:
    """Whether the kernels can run here: ``reason`` says why not, or how they run."""

    usable: bool
    reason: str
    interpreted: bool = False


def requested_backend() -> str:
    """The backend ``SPECDEC_VERIFY_BACKEND`` asks for (``auto`` when unset)."""
    return env_choice(BACKEND_ENV, BACKENDS)


@functools.cache
def triton_status() -> TritonStatus:
    """Probe triton once: installed, importable, and with a GPU (or the interpreter) to run on.

    Without CUDA and without the interpreter triton is not imported at all (it takes a second).
    """
    interpreting = os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes")
    if not interpreting and not torch.cuda.is_available():
        try:
            installed = f"triton {importlib.metadata.version('triton')} is installed"
        except importlib.metadata.PackageNotFoundError:
            installed = "triton is not installed"
        return TritonStatus(False, f"no CUDA device; {installed}")
    try:
        triton = importlib.import_module("triton")
    except Exception as exc:  # ImportError, or a broken install raising anything at import
        return TritonStatus(False, f"import triton failed: {type(exc).__name__}: {exc}")
    version = getattr(triton, "__version__", "?")
    if interpreting:
        return TritonStatus(True, f"triton {version} interpreter (TRITON_INTERPRET=1)", interpreted=True)
    try:
        target = triton.runtime.driver.active.get_current_target()
    except Exception as exc:
        return TritonStatus(False, f"triton {version} has no usable GPU driver: {type(exc).__name__}: {exc}")
    return TritonStatus(True, f"triton {version} on {target.backend} (arch {target.arch})")


@functools.cache
def _kernels() -> ModuleType:
    return importlib.import_module("specdec.kernels.triton_kernels")


def _reference() -> ModuleType:
    return importlib.import_module("specdec.kernels.reference")


@functools.cache
def _log_choice(device_type: str, backend: str, reason: str) -> None:
    log.debug("verify backend for %s tensors: %s (%s)", device_type, backend, reason)


def backend_for(device: torch.device) -> str:
    """``"triton"`` or ``"torch"``: what runs the verify operations for tensors on ``device``."""
    requested = requested_backend()
    if requested == "torch":
        _log_choice(device.type, "torch", f"{BACKEND_ENV}=torch")
        return "torch"
    status = triton_status()
    runs_here = status.usable and (device.type == "cuda" or status.interpreted)
    if requested == "triton":
        if not status.usable:
            raise SpecdecError(f"{BACKEND_ENV}=triton, but the kernels cannot run: {status.reason}")
        if not runs_here:
            raise SpecdecError(
                f"{BACKEND_ENV}=triton, but the tensors are on {device.type}: the kernels need CUDA "
                "tensors (or the Triton interpreter, TRITON_INTERPRET=1)"
            )
    backend = "triton" if runs_here and (device.type == "cuda" or requested == "triton") else "torch"
    _log_choice(device.type, backend, status.reason)
    return backend


def implementation(device: torch.device) -> ModuleType:
    """The module whose functions run the verify operations for tensors on ``device``."""
    return _kernels() if backend_for(device) == "triton" else _reference()


def describe() -> str:
    """One line for humans: what verifies on CUDA and on CPU here, and why."""
    requested = requested_backend()
    if requested == "torch":
        return f"torch everywhere ({BACKEND_ENV}=torch)"
    status = triton_status()
    if requested == "triton":
        return f"triton kernels forced ({BACKEND_ENV}=triton): {status.reason}"
    if status.usable and status.interpreted:
        return f"torch ({BACKEND_ENV}=auto; set it to triton to run the kernels under {status.reason})"
    if status.usable:
        return f"triton kernels on CUDA, torch on CPU ({status.reason})"
    return f"torch ({status.reason})"
