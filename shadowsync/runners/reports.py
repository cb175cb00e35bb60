"""What worker processes tell their trainer, as typed messages over a multiprocessing queue.

The trainer folds `WorkerReport`s into its running metrics and hands each to its runner
(`Runner.observe`), which is where policies that react to step times (stragglers) and
protocol statistics (staleness) read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class WorkerReport:
    """One worker's progress since its previous report."""

    trainer: int
    worker: int
    examples: int
    loss_sum: float
    label_sum: float
    busy_s: float  # wall seconds since the previous report
    blocked_s: float  # of which waiting on synchronization
    step_s: list[float] = field(default_factory=list)  # wall seconds of each step
    sync: dict[str, object] = field(default_factory=dict)  # the runner's own counters
    cpu_s: float = 0.0  # CPU seconds of the worker's process since the previous report


@dataclass
class WorkerDone:
    trainer: int
    worker: int
    train_start: float  # time.time() of its first step
    train_end: float


@dataclass
class WorkerFailed:
    trainer: int
    worker: int
    message: str  # one line, shown to the user as is
    diverged: bool = False  # NaN / Inf: a restart would diverge again (a rollback may not)
