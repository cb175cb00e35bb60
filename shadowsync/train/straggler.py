"""Injected stragglers, for tests and benchmarks: `--straggler trainer=ID,slowdown=3,start=S,
duration=D` makes every worker of one trainer take `slowdown` times as long per step from S to
S + D seconds after training started, by sleeping after each step for (slowdown - 1) times the
step's own compute time (not the time it waited on synchronization). This is the transient
compute straggler of Sync-Switch's online policies (Li et al., ICDCS 2021, arXiv 2104.08364).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from shadowsync.errors import UserError

FIELDS = ("trainer", "slowdown", "start", "duration")


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

    def delay(self, trainer: int, since_start_s: float, compute_s: float) -> float:
        """Seconds to sleep after a step of `compute_s` seconds."""
        if trainer != self.trainer or not self.start <= since_start_s < self.start + self.duration:
            return 0.0
        return (self.slowdown - 1.0) * compute_s

    def sleep_after_step(self, trainer: int, since_start_s: float, compute_s: float) -> float:
        d = self.delay(trainer, since_start_s, compute_s)
        if d > 0:
            time.sleep(d)
        return d
