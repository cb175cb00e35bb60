"""What a trainer makes of its workers' reports while they train: its statistics, the running
training metric, the progress bar, a row of metrics.jsonl every --log-every examples and, where
it evaluates for the plot, a held-out sample's metric every so many examples."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from tqdm.auto import tqdm

from shadowsync.runners.base import Runner
from shadowsync.runners.reports import WorkerDone, WorkerReport
from shadowsync.train.report import MetricsLog
from shadowsync.train.tasks.base import RunningMetric


@dataclass
class TrainerStats:
    examples: int = 0
    busy_s: float = 0.0
    blocked_s: float = 0.0
    cpu_s: float = 0.0  # the workers' CPU seconds while training
    wall_s: float = 0.0
    train_start: float = float("inf")  # time.time() of the first worker's first step
    train_end: float = 0.0

    @property
    def train_eps(self) -> float:
        """Examples per second while workers were training (no start-up, no evaluation)."""
        span = self.train_end - self.train_start
        return self.examples / span if span > 0 else 0.0


class Progress:
    """Trainer `trainer`'s progress: `running` the task's running training metric (e.g. NE
    over recent examples), `sync` its runner (it sees every report and adds its metrics to a
    row), `log` metrics.jsonl, `bar` the progress bar."""

    def __init__(self, trainer: int, running: RunningMetric, *, sync: Runner | None = None,
                 log: MetricsLog | None = None, bar: tqdm | None = None) -> None:
        self.trainer, self.running, self.sync, self.log, self.bar = trainer, running, sync, log, bar
        self.stats = TrainerStats()
        self.t0 = 0.0
        self._next_log = self._next_eval = self._log_every = self._eval_every = 0
        self._sample_eval: tuple[str, Callable[[], float]] | None = None

    def begin(self, t0: float, log_every: int, expected: int, evaluations: int = 0,
              sample_eval: tuple[str, Callable[[], float]] | None = None) -> None:
        """Training starts at perf_counter() `t0`, with `stats.examples` already trained (a
        resumed run) of `expected`: a row every `log_every` examples and, with
        `sample_eval` = (the row's key, the evaluation), `evaluations` of them evenly."""
        start = self.stats.examples
        self.t0, self._log_every = t0, log_every
        self._next_log = (start // log_every + 1) * log_every
        self._sample_eval = sample_eval if evaluations > 0 else None
        self._eval_every = max(1, expected // max(1, evaluations))
        self._next_eval = (start // self._eval_every + 1) * self._eval_every

    def wall(self) -> float:
        return time.perf_counter() - self.t0

    def finished(self, msg: WorkerDone) -> None:
        """A worker has taken its last step."""
        self.stats.train_start = min(self.stats.train_start, msg.train_start)
        self.stats.train_end = max(self.stats.train_end, msg.train_end)

    def take(self, msg: WorkerReport) -> None:
        """A worker's report: count it, show it, and write a row when one is due."""
        s, n = self.stats, msg.examples
        s.examples += n
        s.busy_s += msg.busy_s
        s.blocked_s += msg.blocked_s
        s.cpu_s += msg.cpu_s
        self.running.add(n, msg.loss_sum, msg.label_sum)
        if self.sync:
            self.sync.observe(msg)
        wall = self.wall()
        if self.bar is not None:
            self.bar.update(n)
            self.bar.set_postfix(eps=f"{s.examples / wall:,.0f}", refresh=False,
                                 **{self.running.name: f"{self.running.value:.4f}"})
        row = None
        if s.examples >= self._next_log:
            self._next_log += self._log_every
            row = self.row(wall)
        if s.examples >= self._next_eval and self._sample_eval is not None:
            self._next_eval += self._eval_every
            row = row or self.row(wall)
            key, sample_eval = self._sample_eval
            row[key] = sample_eval()
        if row is not None:
            self.write(row)

    def row(self, wall: float | None = None) -> dict[str, object]:
        """A row of metrics.jsonl as of now (`wall` seconds into training)."""
        s = self.stats
        wall = self.wall() if wall is None else wall
        row: dict[str, object] = {
            "trainer": self.trainer, "examples": s.examples, "wall_s": round(wall, 3),
            "eps": s.examples / wall if wall > 0 else 0.0,
            f"train_{self.running.name}": self.running.value,
            "sync_blocked_fraction": s.blocked_s / s.busy_s if s.busy_s > 0 else 0.0,
        }
        if self.sync:
            row.update(self.sync.metrics())
        return row

    def write(self, row: dict[str, object]) -> None:
        if self.log is not None:
            self.log.write(row)
