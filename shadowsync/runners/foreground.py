"""Foreground synchronization, ShadowSync's FR-MA / FR-BMUF / FR-EASGD baselines.

The same rules as the background runner, run inside training: after every `every` steps of
each worker, the trainer's workers stop at a gate, one round runs, and they resume. The time
workers spend at the gate is the cost ShadowSync removes.
"""

from __future__ import annotations

import threading
import time
from multiprocessing.context import BaseContext

from torch import nn

from shadowsync.runners.base import HookDefaults
from shadowsync.runners.groups import ParamGroup
from shadowsync.runners.rounds import GroupRunner
from shadowsync.transport.collectives import TrainerExchange


class StepGate(HookDefaults):
    """Shared by a trainer and its worker processes (multiprocessing primitives).

    Workers call `step()` after each step and `finish()` at the end; the trainer's sync thread
    calls `wait_for_round()` then `release()`.
    """

    def __init__(self, ctx: BaseContext, workers: int, every: int) -> None:
        self.workers = workers
        self.every = every
        self._cond = ctx.Condition()
        self._arrived = ctx.Value("i", 0, lock=False)
        self._finished = ctx.Value("i", 0, lock=False)
        self._generation = ctx.Value("i", 0, lock=False)
        self._steps = 0  # per worker process: each has its own copy after pickling

    def step(self) -> float:
        self._steps += 1
        if self._steps % self.every:
            return 0.0
        t0 = time.perf_counter()
        with self._cond:
            gen = self._generation.value
            self._arrived.value += 1
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._generation.value != gen)
        return time.perf_counter() - t0

    def finish(self, shared_model: nn.Module | None = None,
               trained: nn.Module | None = None) -> None:
        with self._cond:
            self._finished.value += 1
            self._cond.notify_all()

    def wait_for_round(self, stop: threading.Event) -> bool:
        """Block until every still-training worker is at the gate. True if none is left."""
        with self._cond:
            while True:
                active = self.workers - self._finished.value
                if active == 0 or self._arrived.value >= active:
                    return active == 0
                self._cond.wait(timeout=0.5)
                if stop.is_set() and self.workers - self._finished.value == 0:
                    return True

    def release(self) -> None:
        with self._cond:
            self._arrived.value = 0
            self._generation.value += 1
            self._cond.notify_all()


class ForegroundSync(GroupRunner):
    """Runs a round whenever all workers reach the gate; they wait while it runs."""

    kind = "foreground"
    blocks_workers = True

    def __init__(self, groups: list[ParamGroup], exchange: TrainerExchange, every: int) -> None:
        super().__init__(groups, exchange)
        self.every = every
        self.gate: StepGate | None = None

    def worker_hook(self, ctx: BaseContext, workers: int) -> StepGate:
        self.gate = StepGate(ctx, workers, self.every)
        return self.gate

    def _loop(self) -> None:
        assert self.gate is not None
        while True:
            done = self.gate.wait_for_round(self._workers_done)
            last, _, _ = self.run_round(done)
            self.gate.release()
            if last:
                return

    def _on_error(self) -> None:
        if self.gate is not None:
            self.gate.release()

    def describe(self) -> dict[str, object]:
        return {"sync_every": self.every}
