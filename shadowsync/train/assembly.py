"""How one trainer is put together, each part from the configuration sections it reads: the
worker processes and what they share with the trainer (`worker_pool`), its held-out
evaluations, trainer 0's validations with --val-share (`trainer_validation`), and the
`Trainer` over them (`build_trainer`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from shadowsync.checkpoint.coordinator import Checkpointer
from shadowsync.config import (
    ClusterConfig,
    DataConfig,
    OptimConfig,
    OutputConfig,
    SyncConfig,
    TestingConfig,
)
from shadowsync.embeddings import EmbeddingClient
from shadowsync.forkserver import worker_context
from shadowsync.runners.base import Runner
from shadowsync.train.evaluate import evaluate
from shadowsync.train.held_out import HeldOut
from shadowsync.train.notices import JobNotices
from shadowsync.train.pool import Shared, WorkerPool, worker_specs
from shadowsync.train.progress import Progress
from shadowsync.train.quiesce import Parking, Quiescence
from shadowsync.train.selection import ModelSelection, validation_gates
from shadowsync.train.state import WorkerSlots
from shadowsync.train.tasks import DataPlan, task_of
from shadowsync.train.trainer import Trainer
from shadowsync.train.validation import Validation
from shadowsync.transport.layout import ClusterLayout


def worker_pool(plan: DataPlan, slots: WorkerSlots, data: DataConfig, optim: OptimConfig,
                cluster: ClusterConfig, sync: SyncConfig, output: OutputConfig,
                testing: TestingConfig, *, task: str, seed: int,
                trainer: int) -> tuple[WorkerPool, Shared]:
    """Trainer `trainer`'s worker processes (not started) and what they share with it:
    their `slots`, a stop event where the mode can stop early, the decay's event with
    --lr-decay-on-plateau, and with --val-share where every worker of every trainer parks
    at each validation point until trainer 0 has validated it (`shadowsync.train.quiesce`)."""
    context = worker_context()  # how the workers start: forked or spawned
    validates = plan.val_start is not None
    stop = context.Event() if sync.entry.stops_alone else None
    decay = context.Event() if optim.lr_decay_on_plateau and validates else None
    parking = Parking(cluster.workers) if validates else None
    gates = (validation_gates(plan.rows_per_epoch // cluster.trainers, data.epochs,
                              output.eval_points or 0, cluster.workers, optim.batch_size)
             if validates else ())
    shared = Shared(slots, stop, decay, parking, gates)
    return WorkerPool(context, worker_specs(
        plan, data, optim, cluster, testing, task=task, seed=seed, trainer=trainer,
        lockstep=sync.entry.lockstep, shared=shared)), shared


def trainer_validation(trainer: Trainer, plan: DataPlan, *, trainers: int,
                       early_stop: int | None, out: Path, resumed: bool,
                       average_from: int = 0) -> Validation:
    """Trainer 0's validations on the tail of the training rows, every trainer of
    `trainers` told what they decide; `early_stop`: --early-stop (0 or None: never),
    `average_from`: --weight-average-from (0: no average)."""
    parking = trainer.shared.parking
    assert parking is not None and plan.val_start is not None
    task = trainer.held_out.task
    peers = [ClusterLayout.trainer_name(t) for t in range(1, trainers)]
    validation = Validation(
        lambda: evaluate(trainer.model, trainer.tables, plan.train, plan.val_start,
                         plan.val_stop, plan.features.id_modulus),
        task.metric, ModelSelection(task.higher_is_better, early_stop or None),
        job=Quiescence(parking, ClusterLayout.trainer_name(0), peers),
        notices=JobNotices(trainer.notices, peers, out),
        trained_now=trainer.trained_now, trainers=trainers, epoch_rows=plan.rows_per_epoch,
        sync=trainer.sync, checkpointer=trainer.checkpointer, progress=trainer.progress,
        average_from=average_from)
    if resumed:
        validation.resume()
    return validation


def build_trainer(plan: DataPlan, tables: EmbeddingClient, model: torch.nn.Module, *,
                  data: DataConfig, optim: OptimConfig, cluster: ClusterConfig,
                  sync: SyncConfig, output: OutputConfig, testing: TestingConfig, task: str,
                  seed: int, resumed: bool = False, index: int = 0,
                  runner: Runner | None = None, progress: Progress | None = None,
                  slots: WorkerSlots | None = None, checkpointer: Checkpointer | None = None,
                  on_examples: Callable[[int], None] | None = None,
                  lost_peer: Callable[[], str | None] | None = None) -> Trainer:
    """Trainer `index` of `cluster.trainers` over the shared `model` and `tables`, with its
    sync `runner` (None: none), `progress` (default: statistics and the running metric
    only), its workers' `slots` (default: fresh ones), trainer 0's `checkpointer`, and the
    callbacks it calls with the examples trained so far (`on_examples`) and to learn of a
    process of the job that is gone (`lost_peer`). `resumed`: the run goes on from a
    checkpoint (--resume)."""
    the_task = task_of(task)
    slots = slots or WorkerSlots(list(model.parameters()), cluster.workers, optim.optimizer)
    pool, shared = worker_pool(plan, slots, data, optim, cluster, sync, output, testing,
                               task=task, seed=seed, trainer=index)
    trainer = Trainer(
        model, tables, pool, shared,
        progress or Progress(index, the_task.running_metric(), sync=runner),
        HeldOut(the_task, model, tables, plan), index=index, output=output,
        expected=plan.train_stop // cluster.trainers, resumed=resumed, sync=runner,
        checkpointer=checkpointer, on_examples=on_examples, lost_peer=lost_peer)
    if plan.val_start is not None and index == 0:
        # --val-share: trainer 0 validates and keeps the best model; --early-stop ends the job
        trainer.validation = trainer_validation(
            trainer, plan, trainers=cluster.trainers, early_stop=data.early_stop,
            out=Path(output.dir or "."), resumed=resumed,
            average_from=data.weight_average_from or 0)
    return trainer
