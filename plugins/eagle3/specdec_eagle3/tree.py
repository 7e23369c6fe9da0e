"""The EAGLE-3 head's attention over an EAGLE-2 draft tree's frontier.

The tree itself (candidates scored by cumulative draft log-probability, the best kept parents
first) is the core's :class:`specdec.trees.TreeCandidates`.
"""

from __future__ import annotations

import torch


def frontier_mask(num_cached: int, ancestors: torch.Tensor) -> torch.Tensor:
    """Head attention mask ``[F, num_cached + drafted + F]`` for ``F`` frontier nodes drafted together.

    Each node sees the committed cache (``num_cached`` positions), the cache slots of its own
    ancestors (``ancestors``: boolean ``[F, drafted]`` over the slots drafted so far) and itself.
    """
    count = ancestors.shape[0]
    committed = ancestors.new_ones((count, num_cached))
    itself = torch.eye(count, dtype=torch.bool, device=ancestors.device)
    return torch.cat((committed, ancestors, itself), dim=1)
