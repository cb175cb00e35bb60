"""Weight averaging over time: the running mean of a model's snapshots.

Stochastic weight averaging (Izmailov et al., "Averaging Weights Leads to Wider Optima and
Better Generalization", UAI 2018) averages the weights a run passes through late in training
instead of keeping one of them. It is not a synchronization rule (it averages one model over
time, not replicas): with --val-share the validations fold each epoch's end model into it
(`shadowsync.train.validation`), and each process that holds a part of the model keeps the
average of its own part (`shadowsync.checkpoint.shards`).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


def fold_into_mean(mean: torch.Tensor, snapshot: torch.Tensor, count: int) -> None:
    """In place, the mean of `count` snapshots from that of the first count - 1 and the last:
    ``m_n = m_{n-1} + (x_n - m_{n-1}) / n``, so ``m_n = (x_1 + ... + x_n) / n``."""
    mean.add_(snapshot - mean, alpha=1.0 / count)


class RunningAverage:
    """The mean of the snapshots folded so far, tensor by tensor (`count` of them)."""

    def __init__(self) -> None:
        self.count = 0
        self.mean: dict[str, torch.Tensor] = {}

    def fold(self, snapshot: Mapping[str, torch.Tensor]) -> None:
        """Take one more snapshot (the same keys each time) into the mean; the first is
        copied."""
        self.count += 1
        with torch.no_grad():
            for key, value in snapshot.items():
                if self.count == 1:
                    self.mean[key] = value.detach().clone()
                else:
                    fold_into_mean(self.mean[key], value, self.count)

    def exchange(self, live: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The mean to put in place of `live`, which is kept in its stead: a second exchange
        with what the first returned gives back `live` and the mean as they were."""
        out, self.mean = self.mean, {k: v.detach().clone() for k, v in live.items()}
        return out
