"""Emulated link delay on a trainer's pushes to the dense servers.

Sync-Switch's original injected network stragglers with `tc qdisc ... netem delay D` on a
worker's interface (10 ms on one worker, 30 ms on two, once or four times a run). This
machine's kernel has no `netem` qdisc (only `tbf` and `htb`, rate limits), so the delay is
emulated where a packet would wait: the worker sleeps D seconds before each push leaves it
(`LinkDelay.before_push`). A BSP step then waits D longer for that worker's gradient, an ASP
step of that worker is D longer, as with netem on its egress; what is not emulated is the
delay of the reply, of the embedding traffic, and any effect on TCP's window (a sleep adds
latency, not loss or queueing).

The delay is on while the job is inside one of its episodes: the window [start, start +
duration) (shares of the job's gradients, or seconds) cut into 2K - 1 equal slices, on in the
1st, 3rd, ... (K episodes with K - 1 equal breaks between them), so online policies must also
switch back. Jitter (every trainer, D +- J uniformly per push, drawn from a generator seeded
by the trainer) emulates a shared network where BSP waits for the slowest push of each step.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass


def in_episode(at: float, start: float, duration: float, episodes: int = 1) -> bool:
    """`at` inside one of `episodes` equal on-slices of [start, start + duration) (slices
    2i of 2K - 1)."""
    if not start <= at < start + duration:
        return False
    if episodes <= 1 or math.isinf(duration):
        return True
    return int((at - start) / (duration / (2 * episodes - 1))) % 2 == 0


@dataclass(frozen=True)
class LinkDelay:
    trainers: tuple[int, ...]  # whose pushes are delayed
    ms: float
    jitter_ms: float = 0.0
    start: float = 0.0
    duration: float = math.inf
    episodes: int = 1
    of_job: bool = True  # start and duration are shares of the job, else seconds

    def seconds(self, trainer: int, at: float, rng: random.Random | None = None) -> float:
        """The delay of one push of `trainer` when the job is at `at` (its share of the job
        or seconds, as `of_job` says)."""
        if trainer not in self.trainers or not in_episode(at, self.start, self.duration,
                                                          self.episodes):
            return 0.0
        jitter = (rng or random).uniform(-self.jitter_ms, self.jitter_ms) if self.jitter_ms else 0
        return max(0.0, self.ms + jitter) / 1000.0

    def before_push(self, trainer: int, at: float, rng: random.Random | None = None) -> float:
        d = self.seconds(trainer, at, rng)
        if d > 0:
            time.sleep(d)
        return d
