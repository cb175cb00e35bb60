"""Bulk-synchronous parallel (BSP) on a parameter server, as in Sync-Switch (Li, Mangoubi, Xu,
Guo, "Sync-Switch: Hybrid Parameter Synchronization for Distributed Deep Learning", ICDCS
2021, arXiv 2104.08364).

Each of the n workers pushes one gradient per step; the server waits for all n, applies their
mean once, and every worker continues from the same new parameters. Guarantee: one update per
n gradients, equal to one step with the global batch of n x b examples; every worker pulls
identical parameters after it.
"""

from __future__ import annotations

import torch

from shadowsync.protocols import Protocol


class BulkSynchronous:
    name = Protocol.BSP

    def __init__(self, workers: int) -> None:
        if workers < 1:
            raise ValueError(f"BSP needs at least one worker, got {workers}")
        self.workers = workers
        self._sum: torch.Tensor | None = None
        self._count = 0

    @property
    def waiting(self) -> int:
        """Gradients of the current step received so far."""
        return self._count

    def offer(self, grad: torch.Tensor) -> torch.Tensor | None:
        """Take one worker's gradient; the mean of the step once the n-th has arrived."""
        self._sum = grad.clone() if self._sum is None else self._sum.add_(grad)
        self._count += 1
        if self._count < self.workers:
            return None
        mean = self._sum / self.workers
        self._sum, self._count = None, 0
        return mean
