"""A Hogwild worker process (Recht et al. 2011).

Several workers of one trainer update the same shared-memory dense model and embedding tables
without locks. They must be processes: Python threads serialise on the GIL and were measured
here at about 1x the speed of one thread, processes at about 2x.
"""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier, Event

import torch

from shadowsync.data.dataset import Batch, EpochOrder, batches, num_batches
from shadowsync.embeddings import EmbeddingClient
from shadowsync.errors import failure_line
from shadowsync.lifecycle.attempts import note_process
from shadowsync.lifecycle.exits import TrainingDiverged
from shadowsync.lifecycle.stop import (
    SIGNALS,
    STOP,
    silence_stderr,
    stderr_silenced,
    watch_parent,
    watch_signals,
)
from shadowsync.runners.base import HookDefaults, WorkerHook
from shadowsync.runners.reports import WorkerDone, WorkerFailed, WorkerReport
from shadowsync.spec.straggler import Straggler
from shadowsync.train.prefetch import RowPipeline, depth_of
from shadowsync.train.quiesce import Parking
from shadowsync.train.schedule import LrSchedule
from shadowsync.train.state import WorkerSlots
from shadowsync.train.straggler import pace_of
from shadowsync.train.tasks import task_of


@dataclass
class DataSlice:
    """Which rows this worker reads: global batches of [start, stop) striped over shards."""

    task: str
    path: str
    examples: int | None
    seed: int
    skip_bad_lines: bool
    start: int
    stop: int
    shard: int
    num_shards: int
    epoch_rows: int | None = None  # --epochs: [start, stop) are logical rows of shuffled passes


@dataclass
class WorkerSpec:
    trainer: int
    worker: int
    data: DataSlice
    batch_size: int
    table_size: list[int]  # rows of each table
    optimizer: str
    lr: float
    schedule: LrSchedule  # its length is set by the worker, from its shard
    report_every: int  # steps between progress messages
    seed: int
    straggler: Straggler | None = None
    start_step: int = 0  # steps of this shard already trained (a resumed run)
    slots: WorkerSlots | None = None  # shared optimizer state and positions, for checkpoints
    stop: Event | None = None  # stop after the current step (None: this mode cannot stop early)
    poison_at_step: int | None = None  # --inject-nan-at: NaN into the dense model at this step
    decay: Event | None = None  # --lr-decay-on-plateau: the decay starts once this is set
    # --val-share: (step, validation point) pairs: after that step, park in `parking` until
    # trainer 0 has validated the point (see `shadowsync.train.quiesce`)
    gates: tuple[tuple[int, int], ...] = ()
    parking: Parking | None = None


def make_dense_optimizer(name: str, params: Iterable[torch.nn.Parameter],
                         lr: float) -> torch.optim.Optimizer:
    """The worker's optimizer, fused (one kernel over every parameter: a tenth of a DLRM
    step on one core) where this torch and these parameters allow it."""
    cls = torch.optim.Adagrad if name == "adagrad" else torch.optim.SGD
    params = list(params)
    try:
        return cls(params, lr=lr, fused=True)
    except (RuntimeError, TypeError, ValueError):  # an older torch, or a dtype it cannot fuse
        return cls(params, lr=lr)


def stop_on_signals(spec: WorkerSpec) -> threading.Event:
    """Ctrl-C reaches every process of the terminal's group: the trainer decides when its
    workers stop (it sets `spec.stop`), so SIGINT does not stop a worker, and SIGTERM asks it
    to stop after its current step, where the mode allows stopping early (else the protocol's
    servers, or the trainer's end, stop it).

    Either signal means the job is ending, and the launcher says how in one line: from then
    on the worker writes nothing to stderr, at once (not when its main thread is next in
    Python), since its peers leaving would make TensorPipe log each closed connection."""
    local = threading.Event()
    STOP.uninstall()  # taken over on import (a job's process); a worker decides here

    def on_signal(signum: int) -> None:
        silence_stderr()
        if signum == signal.SIGTERM and spec.stop is not None:
            local.set()

    for sig in SIGNALS:
        signal.signal(sig, lambda *_: None)  # acted on by `watch_signals`' thread
    watch_signals(on_signal)
    # Started with SIGINT blocked (see `Trainer.run`): a Ctrl-C from now on only quiets it.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    return local


# Steps between a worker's looks at --lr-decay-on-plateau's event (a lock taken each).
PLATEAU_LOOK_EVERY = 8
# Mean loss per example above which training has exploded: far beyond any loss a model that
# learns anything reaches (log 2 = 0.69 for a coin flip, log 10 = 2.3 for a 10-way guess).
EXPLODED_LOSS = 100.0


def check_loss(loss_sum: float, examples: int, spec: WorkerSpec, seen: int,
               where: str = "") -> None:
    """Stop with one clear line on a NaN, infinite or exploding loss (an ASP phase with too
    high a learning rate diverges this way)."""
    mean = loss_sum / max(1, examples)
    if not math.isfinite(mean) or mean > EXPLODED_LOSS:
        what = f"loss is {mean}" if not math.isfinite(mean) else \
            f"mean loss {mean:.3g} per example exploded past {EXPLODED_LOSS:g}"
        raise TrainingDiverged(f"training diverged: {what} in trainer {spec.trainer} worker "
                               f"{spec.worker}{where} after {seen} examples; try a lower --lr")


def poison(model: torch.nn.Module) -> None:
    """--inject-nan-at: what a numerical blow-up leaves behind, for tests and benchmarks."""
    with torch.no_grad():
        next(model.parameters()).fill_(float("nan"))


def endless(one_pass: Callable[[], Iterator[Batch]]) -> Iterator[Batch]:
    """Pass after pass over a worker's shard, for runners that end training themselves."""
    while True:
        empty = True
        for batch in one_pass():
            empty = False
            yield batch
        if empty:
            return


def worker_main(spec: WorkerSpec, shared_model: torch.nn.Module, tables: EmbeddingClient,
                queue: Queue, ready: Barrier, hook: WorkerHook | None = None) -> None:
    """Train on this worker's shard, sending `WorkerReport`s, then `WorkerDone` (or
    `WorkerFailed`) to the trainer.

    `hook` is the runner's part inside the worker: a foreground gate that may block after a
    step while a round runs, or a DDP / periodic-averaging wrapper around a private replica.
    """
    hook = hook or HookDefaults()
    note_process(f"trainer{spec.trainer}-worker{spec.worker}")
    watch_parent()
    stopped = stop_on_signals(spec)
    try:
        run = WorkerRun(spec, shared_model, tables, hook, stopped)
        # Start together: process start-up (importing torch, joining RPC) is not training.
        ready.wait()
        run.train(queue)
        run.finish(queue)
    except TrainingDiverged as e:
        queue.put(WorkerFailed(spec.trainer, spec.worker, str(e), diverged=True))
    except Exception as e:  # report any failure to the trainer instead of dying silently
        queue.put(WorkerFailed(spec.trainer, spec.worker,
                               f"worker {spec.worker} of trainer {spec.trainer} failed: "
                               f"{failure_line(e)}"))


class WorkerRun:
    """One worker's training, in phases: open its data, model and optimizer (`__init__`),
    train step after step (`train`), then settle and say it is done (`finish`)."""

    def __init__(self, spec: WorkerSpec, shared_model: torch.nn.Module, tables: EmbeddingClient,
                 hook: WorkerHook, stopped: threading.Event) -> None:
        self.spec, self.shared_model, self.tables, self.hook = spec, shared_model, tables, hook
        self.stopped = stopped
        torch.set_num_threads(1)
        torch.manual_seed(spec.seed * 1000 + spec.trainer * 100 + spec.worker)
        # While the job meets, a Ctrl-C ends its other processes at once, and TensorPipe here
        # would log each connection they close; a real failure to join still reaches the
        # trainer, as WorkerFailed.
        with stderr_silenced():
            tables.attach(f"trainer{spec.trainer}-worker{spec.worker}")
        d = spec.data
        self.task = task_of(d.task)
        self.data = self.task.open_data(d.path, d.examples, d.seed, d.skip_bad_lines)
        self.planned = len(range(d.shard, num_batches(d.start, d.stop, spec.batch_size),
                                 d.num_shards))
        self.model = hook.prepare(shared_model, spec.trainer, spec.worker, steps=self.planned)
        self.tables = hook.wrap_tables(tables)
        opt = make_dense_optimizer(spec.optimizer, self.model.parameters(), spec.lr)
        if spec.slots is not None:
            spec.slots.attach_optimizer(spec.worker, opt)
            hook.attach_slots(spec.slots, spec.start_step)
        self.schedule = spec.schedule.over(self.planned)
        self.lr_steps = self.schedule.attach(opt, spec.start_step)
        self.decay = spec.decay
        self.gates = [g for g in spec.gates if g[0] > spec.start_step]
        self.opt = hook.wrap_optimizer(opt)
        self.steps = spec.start_step
        self._clear_counts()

    def stopping(self) -> bool:
        spec = self.spec
        return spec.stop is not None and (spec.stop.is_set() or self.stopped.is_set())

    def _clear_counts(self) -> None:
        self.n = self.loss_sum = self.label_sum = self.blocked = 0.0
        self.step_s: list[float] = []

    def report(self, now: float) -> WorkerReport:
        spec = self.spec
        cpu, self.cpu_at_report = self.cpu_at_report, time.process_time()
        return WorkerReport(spec.trainer, spec.worker, int(self.n), self.loss_sum,
                            self.label_sum, now - self.t_report, self.blocked, self.step_s,
                            self.hook.report(), self.cpu_at_report - cpu)

    def stream(self) -> Iterator[Batch]:
        """The worker's batches: one pass over its shard, or pass after pass for runners that
        end training themselves. A resumed worker skips the steps its position counts; one
        whose data wrapped around (a fast worker under ASP) skips them within its pass."""
        spec, d, hook = self.spec, self.spec.data, self.hook
        skip = [spec.start_step % self.planned if hook.endless_data and self.planned
                else spec.start_step]
        order = EpochOrder(d.epoch_rows, d.seed) if d.epoch_rows else None

        def one_pass() -> Iterator[Batch]:
            first, skip[0] = skip[0], 0
            return batches(self.data, d.start, d.stop, spec.batch_size, shard=d.shard,
                           num_shards=d.num_shards, table_size=spec.table_size, skip=first,
                           order=order)

        return endless(one_pass) if hook.endless_data else one_pass()

    def train(self, queue: Queue) -> None:
        """Step until the data, the runner or a stop ends it, reporting every few steps."""
        spec, hook = self.spec, self.hook
        self.t_start = time.time()  # wall clock, comparable across the trainer's processes
        self.t_report = self.t_step = time.perf_counter()
        self.cpu_at_report = time.process_time()
        self.pace = pace_of(spec.straggler, spec.trainer) if spec.straggler is not None else None
        # --prefetch: the rows of the next batches on their way while a step computes
        self.pipeline = pipe = RowPipeline(self.tables, depth_of(self.tables), self.stream())
        while pipe.batch is not None:
            dense, _, labels = pipe.batch
            vectors = pipe.rows()
            lv = self.forward_backward(dense, vectors, labels)
            stop = hook.agree_stop(self.stopping())  # every step: lockstep hooks count calls
            grad = vectors.grad if vectors.grad is not None else torch.zeros_like(vectors)
            # This step's embedding gradients out; the next step's rows in (at depth 0 in the
            # same round trip, deeper asked for steps ago)
            pipe.advance(grad, not (hook.finished() or stop),
                         lr_scale=self.schedule.embedding(self.steps))
            if not hook.step_taken():  # released unapplied by a stop: not trained
                continue
            self.count_step(len(labels), lv, float(labels.sum()), queue)
            self.park_at_gate()
        queue.put(self.report(time.perf_counter()))

    def park_at_gate(self) -> None:
        """--val-share: after a validation point's step, park until trainer 0 has validated
        it (or validates no more), with every embedding push answered and the position exact
        (see `shadowsync.train.quiesce`). The time parked is no step's: the next step's time
        (`step_s`, what straggler detectors and pacing read) starts after it."""
        point = None
        while self.gates and self.steps >= self.gates[0][0]:
            point = self.gates.pop(0)[1]
        if point is not None and self.spec.parking is not None:
            self.t_step += self.spec.parking.park(self.spec.worker, self.steps, point,
                                                  self.settle, self.stopping)

    def settle(self) -> None:
        """Every push of this worker applied by the servers, its position counting every
        step taken (where the shared model holds them: no private replica ahead of it), and
        no row read ahead of the point left to train after it (`RowPipeline.drain`)."""
        self.pipeline.drain()
        self.tables.flush()
        slots = self.spec.slots
        if slots is not None and int(slots.held[0]) < 0:
            slots.advance(self.spec.worker, self.steps, settled=True)

    def forward_backward(self, dense: torch.Tensor, vectors: torch.Tensor,
                         labels: torch.Tensor) -> float:
        """One dense step on the looked-up rows; returns the batch's summed loss."""
        spec, steps = self.spec, self.steps
        if steps == spec.poison_at_step:
            poison(self.model)
        vectors.requires_grad_()
        loss = self.task.loss_sum(self.model(dense, vectors), labels)
        lv = loss.item()
        check_loss(lv, len(labels), spec, steps * spec.batch_size, self.hook.where())
        self.opt.zero_grad(set_to_none=True)
        (loss / len(labels)).backward()
        self.opt.step()
        self.lr_steps.step()
        if (self.decay is not None and steps % PLATEAU_LOOK_EVERY == 0
                and self.decay.is_set()):
            self.schedule, self.decay = self.schedule.decaying_from(steps), None
            self.lr_steps = self.schedule.attach(self.lr_steps.optimizer, steps + 1)
        return lv

    def count_step(self, examples: int, loss: float, labels: float, queue: Queue) -> None:
        """A step taken: count it, let the runner act (it may block), pace a straggler, and
        report every `report_every` steps."""
        spec = self.spec
        self.n += examples
        self.loss_sum += loss
        self.label_sum += labels
        self.steps += 1
        if spec.slots is not None:
            spec.slots.advance(spec.worker, self.steps)
        self.blocked += self.hook.step()
        now = time.perf_counter()
        if self.pace is not None:
            done = self.steps / self.planned if self.planned else 1.0
            at = spec.straggler.at(time.time() - self.t_start, self.hook.progress(done))
            self.pace.sleep_after_step(at, now - self.t_step)
            now = time.perf_counter()
        self.step_s.append(now - self.t_step)
        self.t_step = now
        if self.steps % spec.report_every == 0:
            queue.put(self.report(now))
            self._clear_counts()
            self.t_report = now

    def finish(self, queue: Queue) -> None:
        """Hand the model back, settle the embedding pushes and the position, say done."""
        spec = self.spec
        self.hook.finish(self.shared_model, self.model)
        self.tables.flush()  # every push applied: the position below is exact
        if spec.slots is not None:
            spec.slots.advance(spec.worker, self.steps, settled=True)
        if spec.parking is not None:
            spec.parking.finish(spec.worker)
        queue.put(WorkerDone(spec.trainer, spec.worker, self.t_start, time.time()))
        if self.stopping():  # the job ends on a signal: processes vanish without goodbye
            silence_stderr()
        self.tables.detach()  # with remote tables: waits until the whole job shuts down
