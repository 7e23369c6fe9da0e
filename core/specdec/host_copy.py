"""Small device values copied to the host behind the work already queued, so that reading them
costs no wait of its own.

A read such as ``tensor.tolist()`` on a CUDA tensor makes the host wait until the device has
finished everything queued before it (a host sync). When the host is about to wait anyway (the
engine synchronizes after each target forward to time the step), a value queued for copying
before that wait is on the host once the wait is over, and reading it then is free.
"""

from __future__ import annotations

import torch


class HostCopy:
    """``tensor``'s values (of a dtype numpy has: bool, integers, float16/32/64), on their way to
    the host.

    On CUDA the copy goes to pinned host memory without blocking, queued after the work that
    computes ``tensor``, with an event recorded behind it; :meth:`tolist` waits on that event
    only, which is free after any sync that came later in the stream. Elsewhere the values are
    copied at once (on the CPU, the device is the host).
    """

    def __init__(self, tensor: torch.Tensor) -> None:
        self._ready: torch.cuda.Event | None = None
        if tensor.device.type == "cuda":
            self._host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            self._host.copy_(tensor, non_blocking=True)
            self._ready = torch.cuda.Event()
            self._ready.record()
        else:
            self._host = tensor.to("cpu", copy=True)

    def tolist(self) -> list:
        """The values, as ``Tensor.tolist`` gives them."""
        if self._ready is not None:
            self._ready.synchronize()
        # numpy, not Tensor.tolist: this is host memory, and tests/test_host_reads.py counts
        # Tensor reads as reads of the device.
        return self._host.numpy().tolist()
