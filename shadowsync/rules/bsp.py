"""Bulk-synchronous parallel (BSP) on a parameter server, as in Sync-Switch (Li, Mangoubi, Xu,
Guo, "Sync-Switch: Hybrid Parameter Synchronization for Distributed Deep Learning", ICDCS
2021, arXiv 2104.08364).

A step has members: trainers, each expected to push w gradients (one per worker). The server
waits until every member has pushed its w, applies the mean of the n = sum of w gradients once,
and every member continues from the same new parameters. Guarantee: one update per n
gradients, equal to one step with the global batch of n x b examples; every member pulls
identical parameters after it. A gradient from a trainer that is not a member, or one more
than its w, is refused: a step is formed by who pushed, not by how many pushes arrived.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from shadowsync.protocols import Protocol


class BulkSynchronous:
    name = Protocol.BSP

    def __init__(self, members: Mapping[int, int]) -> None:
        """`members`: trainer id -> gradients it pushes in each step."""
        self.members = {t: n for t, n in members.items() if n > 0}
        self.workers = sum(self.members.values())
        if self.workers < 1:
            raise ValueError("a BSP step needs at least one member")
        self._sum: torch.Tensor | None = None
        self._got: dict[int, int] = {}

    @classmethod
    def of_trainers(cls, trainers: int, per_trainer: int = 1,
                    isolated: Iterable[int] = ()) -> BulkSynchronous:
        """Every trainer but the `isolated`, each with `per_trainer` gradients a step."""
        left_out = set(isolated)
        return cls({t: per_trainer for t in range(trainers) if t not in left_out})

    @property
    def waiting(self) -> int:
        """Gradients of the current step received so far."""
        return sum(self._got.values())

    def offer(self, grad: torch.Tensor, trainer: int = 0) -> torch.Tensor | None:
        """Take one gradient of member `trainer`; the mean of the step once every member's
        gradients have arrived."""
        got = self._got.get(trainer, 0)
        if got >= self.members.get(trainer, 0):
            raise ValueError(f"a BSP step got a gradient from trainer {trainer}, which is "
                             f"{'not a member' if trainer not in self.members else 'done'} "
                             f"(members: {sorted(self.members)})")
        self._sum = grad.clone() if self._sum is None else self._sum.add_(grad)
        self._got[trainer] = got + 1
        if self.waiting < self.workers:
            return None
        mean = self._sum / self.workers
        self._sum, self._got = None, {}
        return mean
