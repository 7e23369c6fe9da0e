"""The core's default hook implementations: lossless verification and an empty resource manager.

Verification batches the step's requests onto :mod:`specdec.kernels` (Triton kernels on CUDA).

Registered ``trylast`` so a method plugin overrides them by returning a result for its config.
"""

from __future__ import annotations

import torch

from specdec.config import SpeculativeConfig
from specdec.hookspecs import hookimpl
from specdec.requests import DraftProposal, Request, VerifyResult
from specdec.resources import ResourceManager, TargetContext
from specdec.verify import verify_requests


@hookimpl(trylast=True)
def specdec_verify(
    requests: list[Request], proposals: list[DraftProposal], target_logits: list[torch.Tensor]
) -> list[VerifyResult]:
    return verify_requests(requests, proposals, target_logits)


@hookimpl(trylast=True)
def specdec_resource_manager(config: SpeculativeConfig, target: TargetContext) -> ResourceManager:
    return ResourceManager()
