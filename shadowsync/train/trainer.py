"""The training spine of one trainer: shared model, Hogwild workers, progress, evaluation.

Read `Trainer.run` top to bottom: it builds the shared-memory dense model, starts the worker
processes, follows their progress (running NE, EPS, periodic held-out evaluation) until every
worker has finished its shard, and evaluates the final model. Embedding tables and the
synchronization of the dense model with other trainers come in from outside, so the same
spine runs a single local trainer and one trainer of a cluster.
"""

from __future__ import annotations

import json
import logging
import queue as queue_mod
import signal
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from pathlib import Path

import torch
from tqdm.auto import tqdm

from shadowsync.checkpoint.coordinator import Checkpointer
from shadowsync.checkpoint.store import BEST, MANIFEST, checkpoint_root
from shadowsync.config import TrainConfig
from shadowsync.embeddings import EmbeddingClient
from shadowsync.errors import PeerLost
from shadowsync.forkserver import start_worker, worker_context
from shadowsync.lifecycle.exits import TrainingDiverged
from shadowsync.lifecycle.stop import STOP
from shadowsync.runners.base import Runner
from shadowsync.runners.reports import WorkerDone, WorkerFailed
from shadowsync.train.evaluate import evaluate
from shadowsync.train.quiesce import Parking, Quiescence, serve_parking
from shadowsync.train.report import MetricsLog
from shadowsync.train.schedule import LrSchedule
from shadowsync.train.selection import ModelSelection, gate_step, validation_points
from shadowsync.train.state import WorkerSlots, examples_in
from shadowsync.train.tasks import DataPlan, build_dense_model, task_of
from shadowsync.train.worker import DataSlice, WorkerSpec, worker_main
from shadowsync.transport.layout import ClusterLayout

log = logging.getLogger(__name__)

EVAL_SAMPLE = 20_000
# Written under OUT by trainer 0 when --early-stop ends training; every trainer's workers
# stop after their current step when they see it.
EARLY_STOP_FLAG = ".early-stop"
# Written under OUT by trainer 0, with --lr-decay-on-plateau, at the first validation without
# improvement; every trainer's workers start the learning-rate decay when they see it.
DECAY_FLAG = ".lr-decay"
# How often trainer 0 looks whether the job is parked at a validation point (its workers do
# nothing until it validates).
GATE_POLL_S = 0.01
# How often a trainer looks at its processes and peers, notes its progress and (trainer 0)
# decides on a checkpoint, whatever its workers report: a dead peer is seen, and a checkpoint
# is taken, within about this long.
TICK_S = 0.1


def _as_error(failure: WorkerFailed) -> Exception:
    """The error a worker's reported failure ends this trainer with."""
    return (TrainingDiverged if failure.diverged else PeerLost)(failure.message)


@dataclass
class TrainerStats:
    examples: int = 0
    busy_s: float = 0.0
    blocked_s: float = 0.0
    cpu_s: float = 0.0  # the workers' CPU seconds while training
    wall_s: float = 0.0
    train_start: float = float("inf")  # time.time() of the first worker's first step
    train_end: float = 0.0

    @property
    def train_eps(self) -> float:
        """Examples per second while workers were training (no start-up, no evaluation)."""
        span = self.train_end - self.train_start
        return self.examples / span if span > 0 else 0.0


class _EvalAbandoned(Exception):
    pass


class Trainer:
    """One data-parallel replica: a shared dense model trained by Hogwild worker processes."""

    def __init__(self, cfg: TrainConfig, plan: DataPlan, tables: EmbeddingClient, *,
                 index: int = 0,
                 model: torch.nn.Module | None = None, sync: Runner | None = None,
                 log: MetricsLog | None = None, progress: tqdm | None = None,
                 slots: WorkerSlots | None = None, checkpointer: Checkpointer | None = None,
                 on_examples: Callable[[int], None] | None = None,
                 lost_peer: Callable[[], str | None] | None = None) -> None:
        self.cfg = cfg
        self.plan = plan
        self.tables = tables
        self.table_counters: dict[str, int] | None = None  # dynamic tables, read at close
        self.index = index
        on_plateau = cfg.optim.lr_decay_on_plateau and plan.val_start is not None
        self.decay_flag = Path(cfg.output.dir or ".") / DECAY_FLAG if on_plateau else None
        # --val-share: every worker of every trainer parks at each validation point until
        # trainer 0 has validated it (`shadowsync.train.quiesce`)
        self.parking = Parking(cfg.cluster.workers) if plan.val_start is not None else None
        self.task = task_of(cfg.task)
        self.model = model if model is not None else build_dense_model(cfg, plan.features)
        self.model.share_memory()
        self.sync = sync
        self.log = log
        self.progress = progress
        self.running = self.task.running_metric()  # e.g. NE over recent training examples
        self.stats = TrainerStats()
        self._procs: list[BaseProcess] = []
        self.slots = slots or WorkerSlots(list(self.model.parameters()), cfg.cluster.workers,
                                          cfg.optim.optimizer)
        self.checkpointer = checkpointer  # trainer 0's: saves the job while it trains
        self.on_examples = on_examples  # called with the examples trained so far
        self.lost_peer = lost_peer  # () -> name of a process of the job that is gone, or None
        self.context = worker_context()  # how the workers start: forked or spawned
        self.stop_event = self.context.Event() if cfg.sync.entry.stops_alone else None
        self.stop_signal: int | None = None
        self._evaluating = False
        self._slices: list[DataSlice] | None = None  # each worker's rows (`_examples_at`)
        self.stats.examples = self.resumed_examples()
        # --val-share: trainer 0 validates and keeps the best model; --early-stop ends the job
        self.validating = plan.val_start is not None and index == 0
        self.quiescence = (Quiescence(self.parking, ClusterLayout.trainer_name(0),
                                      [ClusterLayout.trainer_name(t)
                                       for t in range(1, cfg.cluster.trainers)])
                           if self.validating and self.parking is not None else None)
        # Trainer 0 evaluates (and validates) for every trainer.
        self.eval_points = cfg.output.eval_points if index == 0 else 0
        self.selection = ModelSelection(self.task.higher_is_better, cfg.data.early_stop or None)
        self.best_checkpoint: Path | None = None
        self.early_stopped = False
        self._last_val_examples: int | None = None
        self._val_at: list[tuple[int, int]] = []  # (gate step, trainer examples) to validate next
        self._t0 = 0.0
        self.early_stop_flag = (Path(cfg.output.dir or ".") / EARLY_STOP_FLAG
                                if cfg.data.early_stop else None)
        if self.validating and cfg.checkpoint.resume:
            self._resume_selection()

    def resumed_examples(self) -> int:
        """Examples this trainer's workers had trained when its checkpoint was saved."""
        return self._examples_at(self.slots.start_steps())

    def trained_now(self) -> int:
        """Examples this trainer's workers have trained, to the step (their shared step
        counts; the reports, which trail by up to `report_every` steps, where they say more:
        a worker whose data wraps around)."""
        return max(self.stats.examples, self._examples_at([int(k) for k in self.slots.steps]))

    def _examples_at(self, steps: list[int]) -> int:
        if self._slices is None:
            self._slices = [spec.data for spec in self.worker_specs()]
        return sum(examples_in(k, d.shard, d.num_shards, d.start, d.stop, self.cfg.optim.batch_size)
                   for k, d in zip(steps, self._slices, strict=True))

    def _note_progress(self) -> None:
        if self.on_examples is not None:
            self.on_examples(self.trained_now())

    def poison_step(self, worker: int) -> int | None:
        """--inject-nan-at N: the step of trainer 0's worker 0 at which the job has trained
        about N examples (every worker reads at the same pace)."""
        n = self.cfg.testing.inject_nan_at
        if n is None or self.index != 0 or worker != 0:
            return None
        cluster = self.cfg.cluster
        return n // (cluster.trainers * cluster.workers * self.cfg.optim.batch_size)

    def request_stop(self, signum: int) -> None:
        """From a signal handler: workers stop after their current step (if the mode can).
        A held-out sample evaluation under way is abandoned (it only feeds the plot)."""
        self.stop_signal = self.stop_signal or signum
        if self.stop_event is not None:
            self.stop_event.set()
        if self._evaluating:
            self._evaluating = False
            raise _EvalAbandoned

    def _validation_points(self) -> list[int]:
        """--val-share: the trainer examples at which trainer 0 validates (every trainer's
        workers wait at each)."""
        if self.plan.val_start is None:
            return []
        per_epoch = self.plan.rows_per_epoch // self.cfg.cluster.trainers
        return validation_points(per_epoch, self.cfg.data.epochs,
                                 self.cfg.output.eval_points or 0)

    def _gates(self) -> tuple[tuple[int, int], ...]:
        """(step, point) of each validation point, as a worker waits at them."""
        workers, batch = self.cfg.cluster.workers, self.cfg.optim.batch_size
        return tuple((gate_step(v, workers, batch), v) for v in self._validation_points())

    def worker_specs(self) -> list[WorkerSpec]:
        cfg, plan = self.cfg, self.plan
        shards = cfg.cluster.trainers * cfg.cluster.workers
        stop = plan.train_stop
        if cfg.sync.entry.lockstep:  # workers step in lockstep with all others
            # Every rank must take the same number of steps, or its last collective waits
            # forever for the ranks that ran out of data: drop the uneven tail.
            stop = (stop // cfg.optim.batch_size // shards) * shards * cfg.optim.batch_size
        return [
            WorkerSpec(
                trainer=self.index, worker=w,
                data=DataSlice(cfg.task, plan.open_path or cfg.data.path, plan.open_examples,
                               cfg.seed, cfg.data.skip_bad_lines, 0, stop,
                               shard=self.index * cfg.cluster.workers + w, num_shards=shards,
                               epoch_rows=plan.epoch_rows),
                batch_size=cfg.optim.batch_size, table_size=list(plan.features.id_modulus),
                optimizer=cfg.optim.optimizer, lr=cfg.optim.lr, schedule=LrSchedule.of(cfg.optim),
                report_every=max(1, min(64, 8192 // cfg.optim.batch_size)), seed=cfg.seed,
                straggler=cfg.testing.straggler,
                start_step=start, slots=self.slots, stop=self.stop_event,
                poison_at_step=self.poison_step(w),
                decay_flag=str(self.decay_flag) if self.decay_flag is not None else None,
                gates=self._gates(), parking=self.parking,
            )
            for w, start in zip(range(cfg.cluster.workers), self.slots.start_steps(), strict=True)
        ]

    def run(self) -> TrainerStats:
        """Train until every worker has finished its shard and the runner's last round."""
        ctx = self.context
        messages = ctx.Queue()
        hook = self.sync.worker_hook(ctx, self.cfg.cluster.workers) if self.sync else None
        ready = ctx.Barrier(self.cfg.cluster.workers)
        specs = self.worker_specs()
        serve_parking(self.parking)  # before the job meets, where trainer 0 may ask
        self._procs = []
        # The count this attempt starts from (where it resumed), noted before any step: a
        # watcher then sees it move even when what is left of the job fits in one report.
        self._note_progress()
        # Workers start with SIGINT blocked (until they can act on it, and then it only quiets
        # them): a Ctrl-C reaches the whole terminal's group, and the trainer alone decides
        # when its workers stop.
        # Blocked in this thread only, so the trainer itself still takes a Ctrl-C that comes
        # while it starts them (ignoring it here lost it, and left the job waiting).
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            with STOP.starting_children() as adopt:
                for spec in specs:
                    p = start_worker(ctx, worker_main, (spec, self.model, self.tables,
                                                        messages, ready, hook))
                    self._procs.append(p)
                    adopt(p.pid)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        if self.early_stop_flag is not None and self.index == 0:
            # Before the job meets (below): no trainer looks for it until then.
            self.early_stop_flag.unlink(missing_ok=True)
        if self.decay_flag is not None and self.index == 0 and not self.cfg.checkpoint.resume:
            self.decay_flag.unlink(missing_ok=True)
        try:
            # Joining RPC waits for every member of the job, the workers just started
            # included; if the job ends meanwhile, the workers go before this process does.
            self.tables.attach(ClusterLayout.trainer_name(self.index))
            STOP.mark_running()  # the job has met: a stop now ends with a final checkpoint
            t0 = time.perf_counter()
            if self.sync:
                self.sync.start()
            self._follow(messages, self._procs, t0)
        except BaseException as e:
            self._release_gates()
            # A lost peer fails the attempt: what the workers would train now is lost anyway.
            self._terminate(at_once=isinstance(e, PeerLost) or not STOP.running)
            # What this attempt trained, to the step, now that no worker trains any more.
            self._note_progress()
            raise
        self._release_gates()  # before the last round, which every trainer's workers reach
        self._note_progress()
        if self.sync:
            self.sync.stop()
        self.stats.wall_s = time.perf_counter() - t0
        if self.validating and self.stop_signal is None:
            # After the last round: the model the run ends with (with several trainers, the
            # final average of their replicas, which no validation during training sees).
            self._validate(time.perf_counter() - t0, final=True)
        return self.stats

    def close(self) -> None:
        """Leave the RPC world (a barrier over the job) and reap the worker processes."""
        self.table_counters = self.tables.counters()  # dynamic tables: read them first
        self.tables.detach()
        for p in self._procs:
            p.join(timeout=30)
        self._terminate()

    def _terminate(self, at_once: bool = False) -> None:
        for p in self._procs:
            if p.is_alive() and at_once:
                p.kill()
                p.join(timeout=5)
            if p.is_alive():
                p.terminate()
                p.join(timeout=2)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)

    def _follow(self, messages: Queue, procs: list[BaseProcess], t0: float) -> None:
        """Consume worker reports until all are done; log metrics and evaluate along the way."""
        cfg, plan = self.cfg, self.plan
        expected = plan.train_stop // cfg.cluster.trainers
        start = self.stats.examples  # > 0 in a resumed run
        next_log = (start // cfg.output.log_every + 1) * cfg.output.log_every
        eval_every = max(1, expected // max(1, self.eval_points))
        next_eval = (start // eval_every + 1) * eval_every
        self._val_at = ([g for g in self._gates() if g[1] > start]
                        if self.validating else [])
        self._t0 = t0
        done: set[int] = set()
        told = False
        next_tick = 0.0
        while len(done) < len(procs):
            if self.stop_signal is not None and not told:
                told = True  # the others wait for the final checkpoint
                if self.checkpointer is not None:
                    self.checkpointer.keep_alive()  # this process's watchdog too
                else:
                    STOP.extend()
                if self.sync is not None:
                    self.sync.on_stop()
                self._release_gates()
            now = time.monotonic()
            if now >= next_tick:  # not on reports: a worker killed outright sends nothing
                next_tick = now + TICK_S
                try:
                    self._tick(procs, done)
                except PeerLost as lost:
                    raise self._reported_failure(messages) or lost from None
            self._validate_if_due()
            try:
                msg = messages.get(timeout=GATE_POLL_S if self._val_at else TICK_S)
            except queue_mod.Empty:
                continue
            if isinstance(msg, WorkerFailed):
                raise _as_error(msg)
            if isinstance(msg, WorkerDone):
                done.add(msg.worker)
                self.stats.train_start = min(self.stats.train_start, msg.train_start)
                self.stats.train_end = max(self.stats.train_end, msg.train_end)
                continue
            n = msg.examples
            s = self.stats
            s.examples += n
            s.busy_s += msg.busy_s
            s.blocked_s += msg.blocked_s
            s.cpu_s += msg.cpu_s
            self.running.add(n, msg.loss_sum, msg.label_sum)
            if self.sync:
                self.sync.observe(msg)
            wall = time.perf_counter() - t0
            if self.progress is not None:
                self.progress.update(n)
                self.progress.set_postfix(eps=f"{s.examples / wall:,.0f}",
                                          refresh=False,
                                          **{self.running.name: f"{self.running.value:.4f}"})
            row = None
            if s.examples >= next_log:
                next_log += cfg.output.log_every
                row = self._metrics_row(wall)
            if s.examples >= next_eval and self.eval_points > 0 and not self.validating:
                next_eval += eval_every
                row = row or self._metrics_row(wall)
                row[f"eval_{self.task.metric}"] = self.sample_eval()
            if row is not None and self.log is not None:
                self.log.write(row)

    def _tick(self, procs: list[BaseProcess], done: set[int]) -> None:
        """Every TICK_S while training: stop on a dead worker or peer, note progress, and
        (trainer 0) checkpoint when due."""
        self._check_workers(procs, done)
        if (self.early_stop_flag is not None and not self.early_stopped and self.index > 0
                and self.early_stop_flag.exists()):
            self.early_stopped = True
            if self.stop_event is not None:
                self.stop_event.set()
        if self.stop_signal is None and STOP.signum is None and self.lost_peer is not None:
            # A process of the job died: what this attempt trains from now on is lost (the
            # job restarts from its last checkpoint), so stop now rather than when the
            # launcher ends this process.
            gone = self.lost_peer()
            if gone is not None:
                raise PeerLost(f"trainer {self.index}: {gone} is gone")
        self._note_progress()
        if self.checkpointer is not None and self.stop_signal is None:
            self.checkpointer.maybe_save(self.trained_now())

    def _validate_if_due(self) -> None:
        """Trainer 0: validate the next validation point once every worker of the job is
        parked at it (or has ended), then let them all go on. Without the wait, a small data
        set's job trained past several points between two looks, and validated few of them;
        and workers training on through a validation and the save of a new best model moved
        the model kept by a quarter to most of an epoch past the one scored (MovieLens 100K,
        the default job), out of its best point (the validation NE rises after it at every
        new epoch)."""
        if not self._val_at or self.early_stopped or self.stop_signal is not None:
            return
        assert self.quiescence is not None
        gate, point = self._val_at[0]
        parked = self.quiescence.parked(gate)
        if parked is None:
            return
        # Points passed all the same (a worker whose shard ended short) are one validation.
        now = self.trained_now()
        passed = [p for _, p in self._val_at if p <= now] or [point]
        del self._val_at[:len(passed)]
        self._validate(time.perf_counter() - self._t0, parked=parked)
        if not self.early_stopped:
            self.quiescence.release(passed[-1])

    def _release_gates(self) -> None:
        """Trainer 0 validates no more (it stops, or its workers are done): no worker of the
        job waits at a validation point."""
        if self.quiescence is not None:
            self.quiescence.release_all()

    def _validate(self, wall: float, final: bool = False,
                  parked: dict[str, list[int | None]] | None = None) -> None:
        """Trainer 0, --val-share: score the validation rows, keep the best model as
        OUT/checkpoint/best, and stop the job after --early-stop evaluations without
        improvement. `final`: after training, unless the last validation was just now.
        `parked`: where every worker of the job is parked meanwhile (none has moved since;
        `Quiescence`), noted in the best model's manifest. No sync round of this trainer
        runs meanwhile either (nor, waiting for it, another's)."""
        cfg, plan = self.cfg, self.plan
        trained = self.trained_now()
        if final and self.sync is None and (self._last_val_examples == trained
                                            or self.early_stopped):
            return  # the model it ends with is the one last validated (give or take a step)
        with self.sync.held() if self.sync is not None else nullcontext():
            trained = self.trained_now()
            self._last_val_examples = trained
            m = evaluate(self.model, self.tables, plan.train, plan.val_start, plan.val_stop,
                         plan.features.id_modulus)
            epoch = trained * cfg.cluster.trainers / plan.rows_per_epoch
            value = m[self.task.metric]
            improved = self.selection.observe(value, epoch=round(epoch, 3),
                                              examples=trained * cfg.cluster.trainers,
                                              val_ne=m["ne"], val_auc=m["auc"])
            if improved and self.checkpointer is not None:
                self.best_checkpoint = self.checkpointer.save_best(
                    {**self.selection.best_at, **({"parked_steps": parked} if parked else {})})
        log.info("epoch %.2f: validation NE %.4f, AUC %.4f%s", epoch, m["ne"], m["auc"],
                 " (best so far)" if improved else
                 f" ({self.selection.since_best} without improvement)")
        row = self._metrics_row(wall)
        row.update({"examples": trained, "epoch": round(epoch, 4), "val_ne": m["ne"],
                    "val_auc": m["auc"], "best": improved})
        if self.log is not None:
            self.log.write(row)
        if not improved and self.decay_flag is not None and not self.decay_flag.exists():
            log.info("learning-rate decay starts (--lr-decay-on-plateau)")
            self.decay_flag.parent.mkdir(parents=True, exist_ok=True)
            self.decay_flag.touch()
        if self.selection.should_stop and not final and not self.early_stopped:
            self.stop_early()

    def _resume_selection(self) -> None:
        """A resumed run goes on from the best model its run kept (a later one must beat it)."""
        best = checkpoint_root(self.cfg) / BEST
        try:
            at = json.loads((best / MANIFEST).read_text())["best"]
            value = float(at[f"val_{self.task.metric}"])
        except (OSError, ValueError, KeyError, TypeError):
            return
        self.selection.best, self.selection.best_at = value, at
        self.best_checkpoint = best

    def stop_early(self) -> None:
        """End training after every worker's current step, the job's normal ending after it
        (final checkpoint, evaluation, summary): trainer 0 tells the others by a file."""
        self.early_stopped = True
        self._release_gates()
        log.info("early stop: %d validations without improvement", self.selection.since_best)
        if self.early_stop_flag is not None:
            self.early_stop_flag.parent.mkdir(parents=True, exist_ok=True)
            self.early_stop_flag.touch()
        if self.stop_event is not None:
            self.stop_event.set()

    @staticmethod
    def _reported_failure(messages: Queue) -> Exception | None:
        """The failure a worker reported before it exited, if one waits behind the reports
        not yet read: a diverged worker exits right after saying so, and an evaluation can
        keep this loop from reading its message before the exit is seen."""
        while True:
            try:
                msg = messages.get(timeout=0.2)
            except queue_mod.Empty:
                return None
            if isinstance(msg, WorkerFailed):
                return _as_error(msg)

    def _check_workers(self, procs: list[BaseProcess], done: set[int]) -> None:
        dead = [i for i, p in enumerate(procs)
                if i not in done and not p.is_alive() and p.exitcode not in (0, None)]
        if dead:
            raise PeerLost(f"trainer {self.index}: worker {dead[0]} exited with code "
                           f"{procs[dead[0]].exitcode}")

    def _metrics_row(self, wall: float) -> dict[str, object]:
        s = self.stats
        row: dict[str, object] = {
            "trainer": self.index, "examples": s.examples, "wall_s": round(wall, 3),
            "eps": s.examples / wall if wall > 0 else 0.0,
            f"train_{self.running.name}": self.running.value,
            "sync_blocked_fraction": s.blocked_s / s.busy_s if s.busy_s > 0 else 0.0,
        }
        if self.sync:
            row.update(self.sync.metrics())
        return row

    def sample_eval(self) -> float:
        """The task's headline metric on a sample of the held-out rows (NaN if a stop
        request cut it short)."""
        p = self.plan
        stop = min(p.eval_stop, p.eval_start + EVAL_SAMPLE)
        if self.stop_signal is not None:
            return float("nan")
        try:
            self._evaluating = True
            return self.task.evaluate(self.model, self.tables, p, p.eval_start,
                                      stop)[self.task.metric]
        except _EvalAbandoned:
            return float("nan")
        finally:
            self._evaluating = False

    def final_eval(self) -> dict[str, float]:
        p = self.plan
        return self.task.evaluate(self.model, self.tables, p, p.eval_start, p.eval_stop)
