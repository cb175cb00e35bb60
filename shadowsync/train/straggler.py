"""Injected stragglers, for tests and benchmarks: `--straggler trainer=ID,slowdown=3,start=S,
duration=D` makes every worker of one trainer take `slowdown` times its own normal step time
from S to S + D seconds after training started. This is the transient compute straggler of
Sync-Switch's online policies (Li et al., ICDCS 2021, arXiv 2104.08364).

A step's time here is its compute: from the worker's last synchronization to its next one,
not the time it waited on synchronization (that is the other trainers' pace, not its own).
The normal step time is the median of the worker's steps before the window opens, frozen
there: the straggler sleeps after each step of the window until the step has taken
`slowdown` x that reference. Measuring the slowdown against each slowed step's own compute
instead would drift on a machine with fewer cores than processes: while the straggler
sleeps, the others get its CPU, its own next step runs faster, and the sleep shrinks with it.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass, field

from shadowsync.errors import UserError

FIELDS = ("trainer", "slowdown", "start", "duration")
REFERENCE_STEPS = 20  # the last steps before the window that set the normal step time


@dataclass(frozen=True)
class Straggler:
    trainer: int
    slowdown: float
    start: float  # seconds after the first step
    duration: float

    @staticmethod
    def parse(text: str, trainers: int) -> Straggler:
        values: dict[str, str] = {}
        for item in text.split(","):
            key, sep, value = item.partition("=")
            if not sep or key.strip() not in FIELDS:
                raise UserError(f"--straggler: '{item}' must be KEY=VALUE with KEY one of "
                                f"{', '.join(FIELDS)}")
            values[key.strip()] = value.strip()
        try:
            s = Straggler(int(values.get("trainer", "0")), float(values.get("slowdown", "3")),
                          float(values.get("start", "0")),
                          float(values.get("duration", "inf")))
        except ValueError:
            raise UserError(f"--straggler: '{text}' has a value that is not a number") from None
        if not 0 <= s.trainer < trainers:
            raise UserError(f"--straggler: trainer={s.trainer} is not in [0, {trainers})")
        if not s.slowdown >= 1 or s.start < 0 or not s.duration > 0:
            raise UserError("--straggler: needs slowdown >= 1, start >= 0 and duration > 0")
        return s

    def active(self, trainer: int, since_start_s: float) -> bool:
        return trainer == self.trainer and self.start <= since_start_s < self.start + self.duration

    def pace(self, trainer: int) -> StragglerPace:
        """One worker's injection state (each worker keeps its own reference)."""
        return StragglerPace(self, trainer)


@dataclass
class StragglerPace:
    spec: Straggler
    trainer: int
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=REFERENCE_STEPS))
    reference_s: float | None = None  # the normal step time, frozen when the window opens

    def delay(self, since_start_s: float, compute_s: float) -> float:
        """Seconds to sleep after a step whose compute took `compute_s`."""
        if self.trainer != self.spec.trainer:
            return 0.0
        if not self.spec.active(self.trainer, since_start_s):
            if self.reference_s is None:
                self.recent.append(compute_s)
            return 0.0
        if self.reference_s is None:  # a window open from the first step: its own first step
            self.reference_s = statistics.median(self.recent) if self.recent else compute_s
        return max(0.0, self.spec.slowdown * self.reference_s - compute_s)

    def sleep_after_step(self, since_start_s: float, compute_s: float) -> float:
        d = self.delay(since_start_s, compute_s)
        if d > 0:
            time.sleep(d)
        return d
