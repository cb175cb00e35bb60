"""A trainer's evaluations on the held-out rows: a sample of them while it trains (the plot's
points, which a stop abandons) and all of them when training is over."""

from __future__ import annotations

import torch

from shadowsync.embeddings import EmbeddingClient
from shadowsync.train.tasks import DataPlan, Task

EVAL_SAMPLE = 20_000  # held-out rows of one evaluation while training


class _Abandoned(Exception):
    pass


class HeldOut:
    """`task`'s evaluations of the shared `model` (with `tables`) on `plan`'s held-out rows."""

    def __init__(self, task: Task, model: torch.nn.Module, tables: EmbeddingClient,
                 plan: DataPlan) -> None:
        self.task, self.model, self.tables, self.plan = task, model, tables, plan
        self.stopped = False
        self._evaluating = False

    def abandon(self) -> None:
        """From a signal handler: no sample from now on, and the one under way ends here (it
        only feeds the plot; the stop's final checkpoint should not wait for it)."""
        self.stopped = True
        if self._evaluating:
            self._evaluating = False
            raise _Abandoned

    def sample(self) -> float:
        """The task's headline metric on the first `EVAL_SAMPLE` held-out rows (NaN if a stop
        came first or cut it short)."""
        p = self.plan
        stop = min(p.eval_stop, p.eval_start + EVAL_SAMPLE)
        if self.stopped:
            return float("nan")
        try:
            self._evaluating = True
            return self.task.evaluate(self.model, self.tables, p, p.eval_start,
                                      stop)[self.task.metric]
        except _Abandoned:
            return float("nan")
        finally:
            self._evaluating = False

    def final(self) -> dict[str, float]:
        """Every metric of the task on all the held-out rows."""
        p = self.plan
        return self.task.evaluate(self.model, self.tables, p, p.eval_start, p.eval_stop)
