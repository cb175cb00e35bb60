"""A trainer's Hogwild worker processes: what each is handed (`worker_specs`), their start,
the queue they report on, how the trainer sees one fail, and their end."""

from __future__ import annotations

import queue as queue_mod
import signal
from dataclasses import dataclass
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event

import torch

from shadowsync.config import ClusterConfig, DataConfig, OptimConfig, TestingConfig
from shadowsync.embeddings import EmbeddingClient
from shadowsync.errors import PeerLost
from shadowsync.forkserver import start_worker
from shadowsync.lifecycle.exits import TrainingDiverged
from shadowsync.lifecycle.stop import STOP
from shadowsync.runners.base import WorkerHook
from shadowsync.runners.reports import WorkerDone, WorkerFailed, WorkerReport
from shadowsync.train.quiesce import Parking
from shadowsync.train.schedule import LrSchedule
from shadowsync.train.state import WorkerSlots, examples_in
from shadowsync.train.tasks import DataPlan
from shadowsync.train.worker import DataSlice, WorkerSpec, worker_main


@dataclass(frozen=True)
class Shared:
    """What a trainer's workers share with it: their slots in shared memory, the events it
    sets (stop after the current step; start the learning-rate decay) and, with --val-share,
    where they park at the validation points `gates` ((step, point) pairs)."""

    slots: WorkerSlots
    stop: Event | None = None  # None: this mode cannot stop early
    decay: Event | None = None  # --lr-decay-on-plateau
    parking: Parking | None = None
    gates: tuple[tuple[int, int], ...] = ()


def worker_specs(plan: DataPlan, data: DataConfig, optim: OptimConfig, cluster: ClusterConfig,
                 testing: TestingConfig, *, task: str, seed: int, trainer: int, lockstep: bool,
                 shared: Shared) -> list[WorkerSpec]:
    """Each worker of trainer `trainer`: its shard of the training rows and its settings."""
    shards = cluster.trainers * cluster.workers
    stop = plan.train_stop
    if lockstep:  # workers step in lockstep with all others
        # Every rank must take the same number of steps, or its last collective waits
        # forever for the ranks that ran out of data: drop the uneven tail.
        stop = (stop // optim.batch_size // shards) * shards * optim.batch_size
    return [
        WorkerSpec(
            trainer=trainer, worker=w,
            data=DataSlice(task, plan.open_path or data.path, plan.open_examples, seed,
                           data.skip_bad_lines, 0, stop,
                           shard=trainer * cluster.workers + w, num_shards=shards,
                           epoch_rows=plan.epoch_rows),
            batch_size=optim.batch_size, table_size=list(plan.features.id_modulus),
            optimizer=optim.optimizer, lr=optim.lr, schedule=LrSchedule.of(optim),
            report_every=max(1, min(64, 8192 // optim.batch_size)), seed=seed,
            straggler=testing.straggler, start_step=start, slots=shared.slots,
            stop=shared.stop, poison_at_step=poison_step(testing, cluster, optim, trainer, w),
            decay=shared.decay, gates=shared.gates, parking=shared.parking,
        )
        for w, start in zip(range(cluster.workers), shared.slots.start_steps(), strict=True)
    ]


def poison_step(testing: TestingConfig, cluster: ClusterConfig, optim: OptimConfig,
                trainer: int, worker: int) -> int | None:
    """--inject-nan-at N: the step of trainer 0's worker 0 at which the job has trained
    about N examples (every worker reads at the same pace)."""
    n = testing.inject_nan_at
    if n is None or trainer != 0 or worker != 0:
        return None
    return n // (cluster.trainers * cluster.workers * optim.batch_size)


def as_error(failure: WorkerFailed) -> Exception:
    """The error a worker's reported failure ends its trainer with."""
    return (TrainingDiverged if failure.diverged else PeerLost)(failure.message)


class WorkerPool:
    """The worker processes of one trainer, started from `specs`, and their reports."""

    def __init__(self, context: BaseContext, specs: list[WorkerSpec]) -> None:
        self.context, self.specs = context, specs
        self.messages = context.Queue()
        self.procs: list[BaseProcess] = []

    def __len__(self) -> int:
        return len(self.specs)

    def examples_at(self, steps: list[int]) -> int:
        """Examples the workers have read after `steps` steps each."""
        return sum(examples_in(k, s.data.shard, s.data.num_shards, s.data.start, s.data.stop,
                               s.batch_size) for k, s in zip(steps, self.specs, strict=True))

    def start(self, model: torch.nn.Module, tables: EmbeddingClient,
              hook: WorkerHook | None) -> None:
        """Start every worker on the shared `model` and `tables`.

        Workers start with SIGINT blocked (until they can act on it, and then it only quiets
        them): a Ctrl-C reaches the whole terminal's group, and the trainer alone decides
        when its workers stop. Blocked in this thread only, so the trainer itself still takes
        a Ctrl-C that comes while it starts them (ignoring it here lost it, and left the job
        waiting)."""
        # Kept while they run: the semaphores behind it go when it is collected, and a worker
        # still unpickling its arguments then fails to find them.
        self.ready = self.context.Barrier(len(self.specs))
        self.procs = []
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            with STOP.starting_children() as adopt:
                for spec in self.specs:
                    p = start_worker(self.context, worker_main,
                                     (spec, model, tables, self.messages, self.ready, hook))
                    self.procs.append(p)
                    adopt(p.pid)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    def next_message(self, timeout: float) -> WorkerReport | WorkerDone | None:
        """The next report or end of a worker within `timeout` seconds (None: none came); a
        worker's reported failure is raised."""
        try:
            msg = self.messages.get(timeout=timeout)
        except queue_mod.Empty:
            return None
        if isinstance(msg, WorkerFailed):
            raise as_error(msg)
        return msg

    def check(self, done: set[int]) -> None:
        """PeerLost if a worker not `done` has exited with an error."""
        dead = [i for i, p in enumerate(self.procs)
                if i not in done and not p.is_alive() and p.exitcode not in (0, None)]
        if dead:
            raise PeerLost(f"trainer {self.specs[dead[0]].trainer}: worker {dead[0]} exited "
                           f"with code {self.procs[dead[0]].exitcode}")

    def reported_failure(self) -> Exception | None:
        """The failure a worker reported before it exited, if one waits behind the reports
        not yet read: a diverged worker exits right after saying so, and an evaluation can
        keep the trainer from reading its message before the exit is seen."""
        while True:
            try:
                msg = self.messages.get(timeout=0.2)
            except queue_mod.Empty:
                return None
            if isinstance(msg, WorkerFailed):
                return as_error(msg)

    def join(self, timeout: float = 30) -> None:
        """Wait for the workers to exit, then end any that has not."""
        for p in self.procs:
            p.join(timeout=timeout)
        self.terminate()

    def terminate(self, at_once: bool = False) -> None:
        """End every worker still running: SIGTERM first (it stops after its current step)
        unless `at_once`, then SIGKILL."""
        for p in self.procs:
            if p.is_alive() and at_once:
                p.kill()
                p.join(timeout=5)
            if p.is_alive():
                p.terminate()
                p.join(timeout=2)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
