"""Background (shadow) synchronization, ShadowSync's S-MA / S-BMUF / S-EASGD (Zheng et al.,
arXiv 2003.03477).

A thread beside the trainer's Hogwild workers runs sync rounds on the shared dense model
while the workers keep training on it: workers never wait for synchronization. The loop's
pace is a fixed interval, back to back (interval 0), or `auto`: it measures the CPU each round
costs and sleeps just long enough to keep synchronization within a CPU budget (a fraction of
the trainer's cores), so the job syncs as often as the hardware can afford without tuning.
"""

from __future__ import annotations

import os

from shadowsync.runners.groups import ParamGroup
from shadowsync.runners.rounds import GroupRunner
from shadowsync.transport.collectives import TrainerExchange


class Pace:
    """How long to rest between rounds."""

    def __init__(self, interval: float | None, budget: float,
                 cores: float | None = None) -> None:
        self.interval = interval  # None: auto
        self.budget_cores = budget * (cores or len(os.sched_getaffinity(0)))
        self._cost: float | None = None

    def rest_after(self, cpu_s: float, wall_s: float) -> float:
        if self.interval is not None:
            return max(0.0, self.interval - wall_s)
        # A smoothed cost keeps one slow round from stalling the loop for long.
        self._cost = cpu_s if self._cost is None else 0.8 * self._cost + 0.2 * cpu_s
        return max(0.0, self._cost / self.budget_cores - wall_s)

    def describe(self) -> dict[str, object]:
        if self.interval is None:
            return {"sync_interval": "auto", "sync_budget_cores": self.budget_cores}
        return {"sync_interval": self.interval}


class BackgroundSync(GroupRunner):
    """Runs rounds of every group's rule in a thread until all trainers agree to stop."""

    kind = "background"

    def __init__(self, groups: list[ParamGroup], exchange: TrainerExchange, pace: Pace) -> None:
        super().__init__(groups, exchange)
        self.pace = pace

    def _loop(self) -> None:
        while True:
            done = self._workers_done.is_set()
            last, cpu, wall = self.run_round(done)
            if last:
                return
            if not done:
                self._workers_done.wait(self.pace.rest_after(cpu, wall))

    def describe(self) -> dict[str, object]:
        return self.pace.describe()
