"""The compute straggler's injection, one worker at a time (`--straggler`, parsed into
`shadowsync.spec.straggler.Straggler`, whose docstring says what the option does and why the
reference step time is frozen when the window opens)."""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass, field

from shadowsync.spec.straggler import Straggler

REFERENCE_STEPS = 20  # the last steps before the window that set the normal step time


def pace_of(spec: Straggler, trainer: int) -> StragglerPace | None:
    """One worker's injection state (each worker keeps its own reference); None for a
    network kind (applied to the pushes, `Straggler.link`)."""
    return StragglerPace(spec, trainer) if not spec.slows.delays_pushes else None


@dataclass
class StragglerPace:
    spec: Straggler
    trainer: int
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=REFERENCE_STEPS))
    reference_s: float | None = None  # the normal step time, frozen when the window opens

    def delay(self, at: float, step_s: float) -> float:
        """Seconds to sleep after a step that took `step_s`; `at`: where the job is on the
        window's scale (`Straggler.at`)."""
        if self.trainer not in self.spec.trainers:
            return 0.0
        if not self.spec.active(self.trainer, at):
            if self.reference_s is None:
                self.recent.append(step_s)
            return 0.0
        if self.reference_s is None:  # a window open from the first step: its own first step
            self.reference_s = statistics.median(self.recent) if self.recent else step_s
        return max(0.0, self.spec.slowdown * self.reference_s - step_s)

    def sleep_after_step(self, at: float, step_s: float) -> float:
        d = self.delay(at, step_s)
        if d > 0:
            time.sleep(d)
        return d
