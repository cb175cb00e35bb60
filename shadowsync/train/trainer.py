"""The training spine of one trainer: shared model, Hogwild workers, progress, evaluation.

Read `Trainer.run` top to bottom: it starts the worker processes on the shared-memory dense
model, follows their progress (running NE, EPS, periodic held-out evaluation) until every
worker has finished its shard, and leaves the final model to evaluate. Embedding tables and
the synchronization of the dense model with other trainers come in from outside, so the same
spine runs a single local trainer and one trainer of a cluster.

Its parts, built from the configuration sections they read by `shadowsync.train.assembly`:
`pool` (the worker processes and what they share with it, `shadowsync.train.pool`),
`progress` (statistics, metrics.jsonl, the bar: `shadowsync.train.progress`), `held_out`
(evaluations on the held-out rows: `shadowsync.train.held_out`) and, on trainer 0 of a
--val-share job, `validation` (validation points, the best model, early stopping:
`shadowsync.train.validation`). The trainer talks to its workers through shared memory and
events (`notices`), never files.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from shadowsync.checkpoint.coordinator import Checkpointer
from shadowsync.config import OutputConfig
from shadowsync.embeddings import EmbeddingClient
from shadowsync.errors import PeerLost
from shadowsync.lifecycle.stop import STOP
from shadowsync.runners.base import Runner
from shadowsync.runners.reports import WorkerDone
from shadowsync.train.held_out import HeldOut
from shadowsync.train.notices import Notices, serve_notices
from shadowsync.train.pool import Shared, WorkerPool
from shadowsync.train.progress import Progress, TrainerStats
from shadowsync.train.quiesce import serve_parking
from shadowsync.train.validation import Validation
from shadowsync.transport.layout import ClusterLayout

log = logging.getLogger(__name__)

# How often trainer 0 looks whether the job is parked at a validation point (its workers do
# nothing until it validates).
GATE_POLL_S = 0.01
# How often a trainer looks at its processes and peers, notes its progress and (trainer 0)
# decides on a checkpoint, whatever its workers report: a dead peer is seen, and a checkpoint
# is taken, within about this long.
TICK_S = 0.1


class Trainer:
    """One data-parallel replica: a shared dense model trained by Hogwild worker processes.

    `pool`: the workers (not started) and `shared`, what they share with it; `output`: when
    to log and evaluate; `expected`: this trainer's examples of a pass; `resumed`: whether
    the run goes on from a checkpoint. With --val-share, trainer 0's `validation` is attached
    once the trainer exists (`shadowsync.train.assembly`)."""

    def __init__(self, model: torch.nn.Module, tables: EmbeddingClient, pool: WorkerPool,
                 shared: Shared, progress: Progress, held_out: HeldOut, *, index: int = 0,
                 output: OutputConfig, expected: int, resumed: bool = False,
                 sync: Runner | None = None, checkpointer: Checkpointer | None = None,
                 on_examples: Callable[[int], None] | None = None,
                 lost_peer: Callable[[], str | None] | None = None) -> None:
        self.model, self.tables, self.index = model, tables, index
        self.model.share_memory()
        self.pool, self.shared, self.slots = pool, shared, shared.slots
        self.stop_event = shared.stop
        self.notices = Notices(shared.stop, shared.decay)
        self.progress, self.stats, self.held_out = progress, progress.stats, held_out
        self.output, self.expected, self.resumed = output, expected, resumed
        self.table_counters: dict[str, int] | None = None  # dynamic tables, read at close
        self.sync = sync
        self.checkpointer = checkpointer  # trainer 0's: saves the job while it trains
        self.on_examples = on_examples  # called with the examples trained so far
        self.lost_peer = lost_peer  # () -> name of a process of the job that is gone, or None
        self.stop_signal: int | None = None
        self.validation: Validation | None = None
        self.stats.examples = self.resumed_examples()

    def resumed_examples(self) -> int:
        """Examples this trainer's workers had trained when its checkpoint was saved."""
        return self.pool.examples_at(self.slots.start_steps())

    def trained_now(self) -> int:
        """Examples this trainer's workers have trained, to the step (their shared step
        counts; the reports, which trail by up to `report_every` steps, where they say more:
        a worker whose data wraps around)."""
        return max(self.stats.examples, self.pool.examples_at([int(k) for k in self.slots.steps]))

    def _note_progress(self) -> None:
        if self.on_examples is not None:
            self.on_examples(self.trained_now())

    def request_stop(self, signum: int) -> None:
        """From a signal handler: workers stop after their current step (if the mode can).
        A held-out sample evaluation under way is abandoned (it only feeds the plot)."""
        self.stop_signal = self.stop_signal or signum
        if self.stop_event is not None:
            self.stop_event.set()
        self.held_out.abandon()

    def run(self) -> TrainerStats:
        """Train until every worker has finished its shard and the runner's last round."""
        hook = self.sync.worker_hook(self.pool.context, len(self.pool)) if self.sync else None
        serve_parking(self.shared.parking)  # before the job meets, where trainer 0 may ask
        serve_notices(self.notices)
        # The count this attempt starts from (where it resumed), noted before any step: a
        # watcher then sees it move even when what is left of the job fits in one report.
        self._note_progress()
        self.pool.start(self.model, self.tables, hook)
        try:
            # Joining RPC waits for every member of the job, the workers just started
            # included; if the job ends meanwhile, the workers go before this process does.
            self.tables.attach(ClusterLayout.trainer_name(self.index))
            STOP.mark_running()  # the job has met: a stop now ends with a final checkpoint
            t0 = time.perf_counter()
            self._begin(t0)
            if self.sync:
                self.sync.start()
            self._follow()
        except BaseException as e:
            self._end_validations()
            # A lost peer fails the attempt: what the workers would train now is lost anyway.
            self.pool.terminate(at_once=isinstance(e, PeerLost) or not STOP.running)
            # What this attempt trained, to the step, now that no worker trains any more.
            self._note_progress()
            raise
        self._end_validations()  # before the last round, which every trainer's workers reach
        self._note_progress()
        if self.sync:
            self.sync.stop()
        self.stats.wall_s = time.perf_counter() - t0
        if self.validation is not None and self.stop_signal is None:
            # After the last round: the model the run ends with (with several trainers, the
            # final average of their replicas, which no validation during training sees).
            self.validation.validate(final=True)
        return self.stats

    def close(self) -> None:
        """Leave the RPC world (a barrier over the job) and reap the worker processes."""
        self.table_counters = self.tables.counters()  # dynamic tables: read them first
        self.tables.detach()
        self.pool.join(timeout=30)

    def _begin(self, t0: float) -> None:
        """Training starts at `t0`: when to log, evaluate (trainer 0) and validate."""
        plot = self.index == 0 and self.validation is None  # held-out samples for the plot
        self.progress.begin(t0, self.output.log_every, self.expected,
                            self.output.eval_points or 0,
                            (f"eval_{self.held_out.task.metric}", self.held_out.sample)
                            if plot else None)
        if self.validation is not None:
            self.validation.begin(self.shared.gates, self.stats.examples, self.resumed)

    def _follow(self) -> None:
        """Consume worker reports until all are done; log metrics and evaluate along the way."""
        done: set[int] = set()
        told = False
        next_tick = 0.0
        while len(done) < len(self.pool):
            if self.stop_signal is not None and not told:
                told = True
                self._stopping()
            now = time.monotonic()
            if now >= next_tick:  # not on reports: a worker killed outright sends nothing
                next_tick = now + TICK_S
                try:
                    self._tick(done)
                except PeerLost as lost:
                    raise self.pool.reported_failure() or lost from None
            validation = self.validation
            if validation is not None and self.stop_signal is None:
                validation.if_due()
            waiting = validation is not None and validation.waiting
            msg = self.pool.next_message(GATE_POLL_S if waiting else TICK_S)
            if isinstance(msg, WorkerDone):
                done.add(msg.worker)
                self.progress.finished(msg)
            elif msg is not None:
                self.progress.take(msg)

    def _stopping(self) -> None:
        """A stop was asked: the job's other processes wait for the final checkpoint, the
        runner hears of it, and no worker waits at a validation point."""
        if self.checkpointer is not None:
            self.checkpointer.keep_alive()  # this process's watchdog too
        else:
            STOP.extend()
        if self.sync is not None:
            self.sync.on_stop()
        self._end_validations()

    def _tick(self, done: set[int]) -> None:
        """Every TICK_S while training: stop on a dead worker or peer, note progress, and
        (trainer 0) checkpoint when due."""
        self.pool.check(done)
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

    def _end_validations(self) -> None:
        if self.validation is not None:
            self.validation.end()
