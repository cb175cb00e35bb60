"""A delayed link between straggling trainers and the servers: the value `--straggler
kind=delay` and `kind=jitter` parse into.

Sync-Switch's original injected network stragglers with `tc qdisc ... netem delay D` on a
worker's interface (10 ms on one worker, 30 ms on two, once or four times a run): every
exchange of that worker took D longer. Here `ms` is that D, the time the link adds to each
round trip, split in half between the two directions: D / 2 before a request leaves the
trainer (`LinkDelay.request_s`) and D / 2 before its reply reaches it. How the delay is
applied, and what it covers, is `shadowsync.transport.delay`.

The delay is on while the job is inside one of its episodes: the window [start, start +
duration) (shares of the job's gradients, or seconds) cut into 2K - 1 equal slices, on in the
1st, 3rd, ... (K episodes with K - 1 equal breaks between them), so online policies must also
switch back. Jitter (every trainer, D +- J uniformly per push, drawn from a generator seeded
by the trainer) emulates a shared network where BSP waits for the slowest push of each step.
"""

from __future__ import annotations

import math
import random
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
    trainers: tuple[int, ...]  # whose links are delayed
    ms: float  # added to each round trip
    jitter_ms: float = 0.0
    start: float = 0.0
    duration: float = math.inf
    episodes: int = 1
    of_job: bool = True  # start and duration are shares of the job, else seconds

    def seconds(self, trainer: int, at: float, rng: random.Random | None = None) -> float:
        """What one round trip of `trainer` gains when the job is at `at` (its share of the
        job or seconds, as `of_job` says)."""
        if trainer not in self.trainers or not in_episode(at, self.start, self.duration,
                                                          self.episodes):
            return 0.0
        jitter = (rng or random).uniform(-self.jitter_ms, self.jitter_ms) if self.jitter_ms else 0
        return max(0.0, self.ms + jitter) / 1000.0

    def request_s(self, trainer: int, at: float, rng: random.Random | None = None) -> float:
        """One direction's share of a round trip's delay (the reply waits as long)."""
        return self.seconds(trainer, at, rng) / 2
