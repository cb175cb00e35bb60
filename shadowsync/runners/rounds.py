"""The threaded group runner that the background and foreground rules share: a sync thread over
parameter groups, its start, its agreed stop, and its counters. Subclasses decide only when a
round runs (`_loop`). Runners that run nothing between steps implement `base.Runner` without
this thread (`base.StepRunner`)."""

from __future__ import annotations

import threading
import time

from shadowsync.runners.base import RunnerDefaults
from shadowsync.runners.groups import ParamGroup
from shadowsync.state_dicts import nest, part
from shadowsync.transport.collectives import TrainerExchange


class GroupRunner(RunnerDefaults):
    def __init__(self, groups: list[ParamGroup], exchange: TrainerExchange) -> None:
        super().__init__()
        self.groups = groups
        self.exchange = exchange
        self.rounds = 0  # rounds while this trainer's workers were training
        self.all_rounds = 0  # including those run after, until every trainer was done
        self.sync_cpu_s = 0.0
        self._workers_done = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._restored: dict[str, object] | None = None
        self._round = threading.Lock()  # held through a round, and by `held`

    def state_dict(self) -> dict[str, object]:
        """The rules' own state for a checkpoint (e.g. BMUF's global model and block
        momentum), by group. Before `start` it has the right shapes (as a load needs)."""
        out: dict[str, object] = {}
        for g in self.groups:
            if self._thread is None and self._restored is None:
                g.rule.start(g.flat())
            out.update(nest(f"{g.name}.", g.rule.state_dict()))
        return out

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore the rules' state; applied at `start` (which would otherwise reset it)."""
        self._restored = dict(state)

    def start(self) -> None:
        for g in self.groups:
            g.rule.start(g.flat())
            if self._restored is not None:
                g.rule.load_state_dict(part(self._restored, f"{g.name}."))
            if g.rule.needs_servers:  # the centre starts as the (identical) initial model
                self.exchange.init_centre(g.name, g.flat())
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._guarded_loop, name=f"{self.kind}-sync",
                                        daemon=True)
        self._thread.start()

    def _guarded_loop(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # surfaced by stop() in the trainer's main thread
            self._error = e
            self._on_error()

    def _loop(self) -> None:
        raise NotImplementedError

    def _on_error(self) -> None:
        pass

    def run_round(self, done: bool) -> tuple[bool, float, float]:
        """One round over every group. Returns (was it the agreed last round, cpu s, wall s)."""
        with self._round:
            w0, c0 = time.perf_counter(), time.process_time()
            self.exchange.begin_round(done)
            for g in self.groups:
                g.sync_round(self.exchange)
            last = self.exchange.end_round()
            cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        self.sync_cpu_s += cpu
        self.all_rounds += 1
        if not done:
            self.rounds += 1
        return last, cpu, wall

    def held(self) -> threading.Lock:
        """Inside, no round starts on this trainer, nor (waiting for it) on any other."""
        return self._round

    def stop(self) -> None:
        """Called when this trainer's workers have finished; returns after the round every
        trainer agreed was the last."""
        self._t_end = time.perf_counter()
        self._workers_done.set()
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise RuntimeError(f"{self.kind} synchronization failed: {self._error}") from None

    def metrics(self) -> dict[str, object]:
        elapsed = (self._t_end or time.perf_counter()) - self._t0
        return {
            "syncs": self.rounds,
            "syncs_per_min": 60.0 * self.rounds / elapsed if elapsed > 0 else 0.0,
            "sync_cpu_s": round(self.sync_cpu_s, 3),
            "sync_bytes_per_round": (self.exchange.bytes_sent / self.all_rounds
                                     if self.exchange is not None and self.all_rounds
                                     else None),
        }

    def settings(self) -> dict[str, object]:
        wire = {"sync_dtype": self.exchange.dtype} if self.exchange is not None else {}
        return {"runner": self.kind, **self.describe(), **wire,
                "groups": {g.name: {"rule": g.rule.name, "write_back": g.write_back,
                                    "params": g.numel(), **g.rule.settings()}
                           for g in self.groups}}
