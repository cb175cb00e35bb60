"""Background (shadow) synchronization, ShadowSync's S-MA / S-BMUF / S-EASGD (Zheng et al.,
arXiv 2003.03477).

A thread beside the trainer's Hogwild workers runs sync rounds on the shared dense model
while the workers keep training on it: workers never wait for synchronization. The loop's
pace is a fixed interval, back to back (interval 0), `auto`: it measures the CPU each round
costs and sleeps just long enough to keep synchronization within a CPU budget (a fraction of
the trainer's cores), so the job syncs as often as the hardware can afford without tuning, or
a number of worker steps: a round begins once the trainer's workers have taken that many steps
each since the last one began, so the rounds fall at the same points of training on a busy or
a slow machine as on an idle one (a time-paced round comes every fewer steps there).

`auto` also begins a round, at the latest, once each worker has taken 1/MIN_ROUNDS of its
pass since the last one began: about MIN_ROUNDS rounds a job or more (fewer only where a
round takes longer than that many steps, and then they run back to back). A long job's budget
pace comes far sooner (the default job of 1.5M examples runs hundreds of rounds a trainer),
so only a short job is paced by its steps: a few hundred steps a worker, which the budget
alone gave 3 to 9 rounds, fewer on an idle machine than on a busy one.
"""

from __future__ import annotations

import os
import threading
import time
from multiprocessing.context import BaseContext

from torch import nn

from shadowsync.runners.base import HookDefaults
from shadowsync.runners.groups import ParamGroup
from shadowsync.runners.rounds import GroupRunner
from shadowsync.spec.interval import SyncInterval
from shadowsync.transport.collectives import TrainerExchange

POLL_S = (0.0005, 0.02)  # bounds on the rest between two looks at the workers' step counts
# No step for this long after the workers' first: they are held (a validation, a gate) and a
# peer trainer's round may be waiting on this one, so a step-paced loop starts its round anyway.
STALL_S = 0.1
# An auto-paced round begins at the latest once each worker has taken 1/MIN_ROUNDS of its
# planned steps since the last began: rounds enough for the rules' warm-up
# (`--sync-warmup-rounds`, 20) to end within the first half of a job.
MIN_ROUNDS = 40


class StepCounter(HookDefaults):
    """Each worker's steps, counted in memory its trainer shares (one slot a worker, so no
    lock): what a step-paced background loop waits on."""

    def __init__(self, ctx: BaseContext, workers: int) -> None:
        self.workers = workers
        self.counts = ctx.Array("q", workers, lock=False)
        self.planned = ctx.Array("q", workers, lock=False)  # each worker's pass, in steps
        self._worker = 0
        self._begun = 0  # the trainer's: its workers' steps when the last round began
        self.rate = 0.0  # the trainer's: steps a second its workers took in the last wait

    def prepare(self, model: nn.Module, trainer: int, worker: int,
                steps: int = 0) -> nn.Module:
        self._worker = worker
        self.planned[worker] = steps
        return model

    def share_of_pass(self, parts: int) -> int | None:
        """1/`parts` of the shortest worker's pass, in steps (at least 1); None until every
        worker has said how long its pass is."""
        shortest = min(self.planned)
        return max(1, shortest // parts) if shortest > 0 else None

    def step(self) -> float:
        self.counts[self._worker] += 1
        return 0.0

    def total(self) -> int:
        return sum(self.counts)

    def wait(self, steps: int, done: threading.Event, timeout: float | None = None) -> None:
        """Until the workers have taken `steps` each since the last round began, `done`, and
        either `timeout` seconds or, without one, (once they have started) no step for
        STALL_S. Looks again after about half the time the steps left should take at the
        workers' pace (the one seen in the last wait that saw steps: a wait that starts
        without one looks every few milliseconds until a step comes, and each look takes a
        core from a worker); with a timeout, not later than it, and without, at least every
        POLL_S[1] (the stall's resolution)."""
        target = self._begun + steps * self.workers
        t0 = moved = time.perf_counter()
        n0 = n = self.total()
        while n < target and not done.is_set():
            now = time.perf_counter()
            if (now - t0 >= timeout) if timeout is not None else (n and now - moved > STALL_S):
                break
            rate = (n - n0) / (now - t0) if n > n0 else self.rate
            rest = 0.5 * (target - n) / rate if rate else POLL_S[0] * 4
            rest = min(rest, t0 + timeout - now) if timeout is not None else min(rest, POLL_S[1])
            done.wait(max(POLL_S[0], rest))
            seen, n = n, self.total()
            if n != seen:
                moved = time.perf_counter()
        if n > n0:
            self.rate = (n - n0) / (time.perf_counter() - t0)
        self._begun = n


class Pace:
    """How long to rest between rounds."""

    def __init__(self, interval: SyncInterval, budget: float,
                 cores: float | None = None, min_rounds: int = MIN_ROUNDS) -> None:
        self.interval = interval.seconds  # None (and steps None): auto
        self.steps = interval.steps
        self.auto = self.interval is None and self.steps is None
        self.budget_cores = budget * (cores or len(os.sched_getaffinity(0)))
        self.min_rounds = min_rounds
        self._cost: float | None = None
        self.counter: StepCounter | None = None

    def worker_hook(self, ctx: BaseContext, workers: int) -> StepCounter | None:
        if self.steps is not None or self.auto:
            self.counter = StepCounter(ctx, workers)
        return self.counter

    def rest(self, cpu_s: float, wall_s: float, done: threading.Event) -> None:
        """After a round: until the next is due, or `done`."""
        if self.steps is not None:
            assert self.counter is not None, "worker_hook makes the counter before training"
            self.counter.wait(self.steps, done)
            return
        rest = self.rest_after(cpu_s, wall_s)
        if not (self.auto and self.counter is not None):
            done.wait(rest)
            return
        # The first rounds can come before the workers have said how long their pass is: a
        # short job's whole pass may fit in one budget rest, so look for it while resting.
        deadline = time.perf_counter() + rest
        most = self.counter.share_of_pass(self.min_rounds)
        while most is None and not done.is_set() and time.perf_counter() < deadline:
            done.wait(min(POLL_S[1], max(0.0, deadline - time.perf_counter())))
            most = self.counter.share_of_pass(self.min_rounds)
        if most is not None:
            self.counter.wait(most, done, timeout=max(0.0, deadline - time.perf_counter()))

    def rest_after(self, cpu_s: float, wall_s: float) -> float:
        if self.interval is not None:
            return max(0.0, self.interval - wall_s)
        # A smoothed cost keeps one slow round from stalling the loop for long.
        self._cost = cpu_s if self._cost is None else 0.8 * self._cost + 0.2 * cpu_s
        return max(0.0, self._cost / self.budget_cores - wall_s)

    def describe(self) -> dict[str, object]:
        if self.steps is not None:
            return {"sync_interval": f"{self.steps}steps"}
        if self.interval is None:
            return {"sync_interval": "auto", "sync_budget_cores": self.budget_cores,
                    "sync_min_rounds": self.min_rounds}
        return {"sync_interval": self.interval}


class BackgroundSync(GroupRunner):
    """Runs rounds of every group's rule in a thread until all trainers agree to stop."""

    kind = "background"

    def __init__(self, groups: list[ParamGroup], exchange: TrainerExchange, pace: Pace) -> None:
        super().__init__(groups, exchange)
        self.pace = pace

    def worker_hook(self, ctx: BaseContext, workers: int) -> StepCounter | None:
        return self.pace.worker_hook(ctx, workers)

    def _loop(self) -> None:
        while True:
            done = self._workers_done.is_set()
            last, cpu, wall = self.run_round(done)
            if last:
                return
            if not done:
                self.pace.rest(cpu, wall, self._workers_done)

    def describe(self) -> dict[str, object]:
        return self.pace.describe()
