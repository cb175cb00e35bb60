"""One trainer from start to summary, the same for a single local trainer and for each
trainer of a cluster: metrics log, progress bar, the Trainer, the final evaluation, and (on
trainer 0) summary.json and the plot.

What differs comes in as arguments: the embedding tables (local shared memory or the RPC
client), the sync runner (none, or one that talks to the other trainers) and how the
trainers' statistics are gathered (a collective, or just this one).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from tqdm.auto import tqdm  # a widget in notebooks, text on a terminal

from shadowsync.checkpoint import shards
from shadowsync.checkpoint.coordinator import Checkpointer
from shadowsync.checkpoint.storage import location
from shadowsync.checkpoint.store import checkpoints_at, load_all, read_manifest
from shadowsync.config import (
    CheckpointConfig,
    ClusterConfig,
    DataConfig,
    ModelConfig,
    OptimConfig,
    OutputConfig,
    RunRecord,
    SyncConfig,
    TestingConfig,
)
from shadowsync.embeddings import EmbeddingClient
from shadowsync.lifecycle import attempts
from shadowsync.lifecycle.stop import STOP, Interrupted, silence_stderr
from shadowsync.metrics import evaluate_predictions
from shadowsync.runners.base import Runner
from shadowsync.runners.switch.overhead import switch_overhead
from shadowsync.state_dicts import Checkpointable
from shadowsync.train.assembly import build_trainer
from shadowsync.train.prefetch import depth_of
from shadowsync.train.progress import Progress, TrainerStats
from shadowsync.train.report import MetricsLog, plot_ne, summarize, write_summary
from shadowsync.train.saved_model import feature_record, load_model, score
from shadowsync.train.state import DenseModelState, RngState, WorkerSlots, examples_in
from shadowsync.train.table_kinds.kind import table_builder
from shadowsync.train.tasks import DataPlan, TaskInputs, task_of
from shadowsync.train.trainer import Trainer
from shadowsync.transport.layout import ClusterLayout

log = logging.getLogger(__name__)


def progress_enabled(output: OutputConfig) -> bool:
    """--progress / --no-progress, else on a terminal or in a notebook only; never under -q."""
    if output.log_level == "warning":
        return False
    if output.progress is not None:
        return output.progress
    return sys.stderr.isatty() or _in_notebook()


def _in_notebook() -> bool:
    """A Jupyter kernel drew this process's output (tqdm.auto then draws a widget). Only the
    process the notebook runs qualifies: a cluster's trainer 0 is a child writing to the
    kernel's own stderr."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return type(shell).__name__ == "ZMQInteractiveShell"


def progress_bar(total: int, desc: str, enabled: bool) -> tqdm:
    return tqdm(total=total, unit="ex", unit_scale=True, disable=not enabled, desc=desc,
                dynamic_ncols=True)


def checkpoint_components(model: torch.nn.Module, runner: Runner | None,
                          tables: EmbeddingClient, *, cluster: ClusterConfig,
                          optim: OptimConfig, resumable: bool
                          ) -> tuple[WorkerSlots, dict[str, Checkpointable]]:
    """What this trainer saves besides its workers' positions (`slots`, saved when the mode
    is `resumable`): its dense model, its sync rules' state, its random state, and the
    tables if they live here."""
    slots = WorkerSlots(list(model.parameters()), cluster.workers, optim.optimizer)
    parts: dict[str, Checkpointable] = {"model": DenseModelState(model), "rng": RngState()}
    if resumable and runner is not None and runner.state_dict():
        parts["sync"] = runner
    local = tables.saved_here()
    if local is not None:  # local tables (embedding servers save their own)
        parts["tables"] = local
    return slots, parts


def make_checkpointer(checkpoint: CheckpointConfig, out: str | None, cluster: ClusterConfig,
                      batch_size: int, sync: SyncConfig, plan: DataPlan, remote: list[str], *,
                      task: str, record: str) -> Checkpointer | None:
    """Trainer 0's checkpointer under --out `out`, `remote` the RPC names of the other
    processes that save a shard; `record`: the run's configuration as each checkpoint keeps
    it. None with `--checkpoint-every never`."""
    if checkpoint.every.never:
        return None

    shards_per = cluster.trainers * cluster.workers
    stop = plan.train_stop

    def examples(trainer: int, positions: list[int]) -> int:
        return sum(examples_in(k, trainer * cluster.workers + w, shards_per, 0, stop,
                               batch_size) for w, k in enumerate(positions))

    return Checkpointer(checkpoints_at(checkpoint, out), checkpoint.every, checkpoint.keep,
                        record, cluster.trainers, remote,
                        [r for r in remote if r.startswith("trainer")], examples,
                        sync.entry.resumable, {"sync": sync.mode, "task": task,
                                               # the model's input shape, known without the data
                                               "num_dense": plan.features.num_dense,
                                               "table_rows": list(plan.features.table_rows),
                                               # the columns a loaded model reads raw rows by
                                               **feature_record(task, plan)},
                        aligned=sync.entry.lockstep,
                        remote_tables=[r for r in remote if r.startswith("emb")])


@dataclass
class Replica:
    """One trainer's parts, built (`build_replica`) and resumed, ready to train, and what its
    summary reads of the options: `record`, the run's options as summary.json records them
    (`TrainConfig.to_dict`), the run directory `out`, and the sections it reports from."""

    record: dict[str, object]
    out: Path
    cluster: ClusterConfig
    data: DataConfig
    model: ModelConfig
    plan: DataPlan
    trainer: Trainer
    runner: Runner | None
    checkpointer: Checkpointer | None
    metrics: MetricsLog
    bar: tqdm
    resumed: dict[str, object]

    @property
    def lead(self) -> bool:
        return self.trainer.index == 0


class ReplicaOptions(TaskInputs, Protocol):
    """What a trainer is built from beside the task's inputs: the optimizer, the cluster, the
    sync, the output and the testing options. A `TrainConfig` is one."""

    optim: OptimConfig
    cluster: ClusterConfig
    sync: SyncConfig
    output: OutputConfig
    testing: TestingConfig


def build_replica(inputs: ReplicaOptions, plan: DataPlan, tables: EmbeddingClient,
                  model: torch.nn.Module, runner: Runner | None, *, recorded: RunRecord,
                  index: int = 0,
                  remote_shards: list[str] | None = None) -> Replica:
    """The trainer over its built parts: trainer 0's checkpointer (`make_checkpointer`;
    `remote_shards`: the RPC names of the job's other processes that save a shard), what it
    saves registered for checkpoints and, with `--resume`, loaded from that checkpoint; its
    metrics log, progress bar and the note of its progress (--max-restarts). What the run
    records of its options comes made (`recorded`: `TrainConfig.recorded`)."""
    optim, cluster, sync, output = inputs.optim, inputs.cluster, inputs.sync, inputs.output
    out = Path(output.dir or ".")
    checkpointer = (make_checkpointer(
        inputs.checkpoint, output.dir, cluster, optim.batch_size, sync, plan,
        remote_shards or [], task=inputs.task, record=recorded.toml) if index == 0 else None)
    slots, parts = checkpoint_components(model, runner, tables, cluster=cluster, optim=optim,
                                         resumable=sync.entry.resumable)
    shard = ClusterLayout.trainer_name(index)
    for name, part in parts.items():
        shards.register(shard, name, part)
    if sync.entry.resumable:
        shards.register_positions(shard, "workers", slots)
        parts["workers"] = slots
    resumed = resume_summary(inputs.checkpoint)  # now: the checkpoint may be pruned by the end
    if inputs.checkpoint.resume:
        shards.load_here(inputs.checkpoint.resume, shard, parts, f"trainer {index}")
        if sync.entry.lockstep and resumed.get("aligned_at") is not None:
            slots.align(resumed["aligned_at"])
    elif inputs.checkpoint.warm_start:
        # What the model learned, not where its workers were (positions, the dense
        # optimizer's state: a new day's data starts at its first row).
        learned = {k: v for k, v in parts.items() if k in ("model", "sync", "tables")}
        if table_builder(inputs.model).resizes and "tables" in learned:  # (else on servers)
            # read as saved: the new budget may resize the pool
            saved = load_all(location(inputs.checkpoint.warm_start) / shard, f"trainer {index}")
            learned.pop("tables").load_state_dict(
                {k.removeprefix("tables/"): v for k, v in saved.items()
                 if k.startswith("tables/")})
        shards.load_here(inputs.checkpoint.warm_start, shard, learned, f"trainer {index}",
                         strict=False)
    lead = index == 0
    metrics = MetricsLog(out / "metrics.jsonl", tensorboard=output.tensorboard and lead)
    desc = "train" if cluster.trainers == 1 else f"trainer 0 (of {cluster.trainers})"
    bar = progress_bar(plan.train_stop // cluster.trainers, desc,
                       lead and progress_enabled(output))
    progress = attempts.Progress(out, index)
    reports = Progress(index, task_of(inputs.task).running_metric(), sync=runner, log=metrics,
                       bar=bar)
    trainer = build_trainer(
        plan, tables, model, data=inputs.data, optim=optim, cluster=cluster, sync=sync,
        output=output, testing=inputs.testing, task=inputs.task, seed=inputs.seed,
        resumed=bool(inputs.checkpoint.resume), index=index, runner=runner, progress=reports,
        slots=slots, checkpointer=checkpointer, on_examples=progress,
        lost_peer=attempts.PeerWatch.of_launch(out))
    progress(trainer.stats.examples)
    if lead:
        progress.started(resumed.get("resumed_examples") or 0)
    if checkpointer is not None:
        checkpointer.resumed_at(resumed.get("resumed_examples") or 0)
        if progress.enabled:  # every trainer's progress is known: count the job's examples
            checkpointer.job_examples = lambda mine: mine + progress.others(cluster.trainers)
    bar.update(trainer.stats.examples)
    return Replica(recorded.options, out, cluster, inputs.data, inputs.model, plan, trainer, runner,
                   checkpointer, metrics, bar, resumed)


Everyone = list[tuple[TrainerStats, dict[str, object]]]  # each trainer's statistics, sync metrics


def run_replica(replica: Replica, *,
                gather: Callable[[tuple[TrainerStats, dict[str, object]]], Everyone] | None = None,
                remote_shards: list[str] | None = None,
                followers: list[str] | None = None) -> dict[str, object] | None:
    """Train this replica; returns the summary on trainer 0 (which writes it), else None.

    `gather(item)` returns every trainer's item, this one's included (default: only this one).
    `remote_shards`: RPC names of the other processes that save a checkpoint shard;
    `followers`: those of the job's Hogwild workers (told to be quiet when a stop ends the job).
    On SIGINT / SIGTERM the workers stop, trainer 0 saves a final checkpoint and
    `Interrupted` is raised.
    """
    stats = train_until_done(replica)
    everyone, saved, final, best = finish_training(replica, stats, gather)
    trainer = replica.trainer
    stopped = trainer.stop_signal
    if stopped and replica.lead and remote_shards:
        # Saved: end every process now rather than through RPC's graceful shutdown (a
        # barrier over the whole job that took seconds); workers follow their trainer.
        shards.end_job(remote_shards, 128 + stopped, quiet=followers or [])
        silence_stderr()
    else:
        trainer.close()
    if not replica.lead:
        replica.metrics.close()
        return None
    if stopped:
        replica.metrics.close()
        raise Interrupted(stopped, str(saved) if saved else None)
    assert final is not None
    return write_run_summary(replica, stats, everyone, saved, final, best)


def train_until_done(replica: Replica) -> TrainerStats:
    """Run the trainer to the end of its data (or a stop), Ctrl-C / SIGTERM asking it to stop."""
    trainer = replica.trainer
    local_signals = STOP.install() if not STOP.installed else False  # a local run
    STOP.subscribe(trainer.request_stop)
    try:
        stats = trainer.run()
    finally:
        STOP.unsubscribe(trainer.request_stop)
        if local_signals:
            STOP.uninstall()
    replica.bar.close()
    log.debug("trainer %d: %d examples in %.1fs", trainer.index, stats.examples, stats.wall_s)
    if trainer.stop_signal and replica.checkpointer is not None:  # workers and sync stopped
        replica.checkpointer.keep_alive()
    return stats


def finish_training(replica: Replica, stats: TrainerStats,
                    gather: Callable[[tuple[TrainerStats, dict[str, object]]], Everyone] | None
                    ) -> tuple[Everyone, Path | None, dict[str, float] | None,
                               dict[str, float] | None]:
    """After the last step: every trainer's statistics, the final checkpoint, and trainer 0's
    final evaluation (of the last model and of the best checkpoint, with --val-share)."""
    runner, trainer = replica.runner, replica.trainer
    # with how far ahead this trainer's workers fetched their rows (--prefetch, as resolved)
    sync_metrics = {**(runner.final_metrics() if runner else {}),
                    "prefetch": depth_of(trainer.tables)}
    everyone = gather((stats, sync_metrics)) if gather else [(stats, sync_metrics)]
    if runner:
        runner.after_training()  # e.g. load the servers' final parameters
    stopped = trainer.stop_signal
    saved = None
    if replica.checkpointer is not None:
        saved = final_save(replica.checkpointer, stopped)
    final = trainer.held_out.final() if replica.lead and not stopped else None
    best = best_eval(replica) if final is not None else None
    return everyone, saved, final, best


def write_run_summary(replica: Replica, stats: TrainerStats, everyone: Everyone,
                      saved: Path | None,
                      final: dict[str, float], best: dict[str, float] | None) -> dict[str, object]:
    """Trainer 0: the run's summary.json, its last metrics row and the NE plot."""
    trainer, runner, out, cluster = replica.trainer, replica.runner, replica.out, replica.cluster
    running = trainer.progress.running
    train_metric = running.value
    all_stats = [s for s, _ in everyone]
    wall = max(s.wall_s for s in all_stats)
    summary = summarize(replica.record, replica.plan, all_stats, final, train_metric, wall)
    summary.update(sync_summary(everyone, all_stats, runner))
    if runner:
        summary.update(runner.summarize([m for _, m in everyone]))
    if "switches" in summary:
        summary["switch_overhead"] = switch_overhead(summary["switches"], summary["train_s"])
    summary["prefetch"] = {"setting": cluster.prefetch,
                           "depth_per_trainer": [m.get("prefetch", 0) for _, m in everyone]}
    summary["out"] = str(out)
    summary["checkpoint"] = str(saved) if saved else None
    # --max-restarts: attempts the job was restarted, examples trained again because of them
    summary["restarts"] = attempts.attempt()
    summary["examples_lost"] = attempts.examples_lost(out, cluster.trainers)
    summary.update(replica.resumed)
    if trainer.table_counters is not None:
        # Dynamic tables: ids looked up, admitted, rejected (read the default row), evicted.
        summary["dynamic_tables"] = trainer.table_counters
    resumed_eps(summary)
    summary.update(selection_summary(replica, final, best))
    metrics, metric = replica.metrics, trainer.held_out.task.metric
    metrics.write({"trainer": 0, "examples": stats.examples, "wall_s": round(wall, 3),
                   "eps": summary["eps"], f"train_{running.name}": train_metric,
                   f"eval_{metric}": final[metric]})
    metrics.close()
    write_summary(out, summary)
    xlabel = ("training examples" if cluster.trainers == 1
              else f"training examples of trainer 0 (of {cluster.trainers})")
    plot_ne(out, [r for r in metrics.rows if r.get("trainer") == 0],
            replica.plan.teacher_eval_ne, xlabel=xlabel)
    return summary


def best_eval(replica: Replica) -> dict[str, float] | None:
    """--val-share: the best checkpoint's metrics on the held-out rows (None: none kept)."""
    validation = replica.trainer.validation
    if validation is None or validation.best_checkpoint is None:
        return None
    name = replica.model.name
    _, trained, _ = load_model(Path(validation.best_checkpoint), name if callable(name) else None)
    p = replica.plan
    return evaluate_predictions(*score(trained, p.eval, p.eval_start, p.eval_stop))


def selection_summary(replica: Replica, final: dict[str, float],
                      best: dict[str, float] | None) -> dict[str, object]:
    """Epochs, the validation's best point, early stopping; with a best checkpoint, the
    summary's eval_* are its (the model eval and load use), last_eval_* the final model's."""
    data = replica.data
    out: dict[str, object] = {"epochs": data.epochs, "val_share": data.val_share}
    validation = replica.trainer.validation
    if validation is None:
        return out
    sel, kept = validation.selection, validation.best_checkpoint
    # the model kept: the best the job trained, or an average of its epoch ends ("averaged")
    out.update({"best": {**(validation.kept_at or sel.best_at),
                         "checkpoint": str(kept) if kept else None},
                "validations": sel.evaluations, "early_stopped": validation.early_stopped,
                "last_eval_ne": final["ne"], "last_eval_auc": final["auc"]})
    if best is not None:
        teacher = replica.plan.teacher_eval_ne
        out.update({"eval_ne": best["ne"], "eval_auc": best["auc"],
                    "eval_logloss": best["logloss"], "calibration": best["calibration"],
                    "ne_vs_teacher": best["ne"] / teacher if teacher else None})
    return out


def final_save(checkpointer: Checkpointer, stopped: int | None) -> Path | None:
    """The run's last checkpoint. After a stop the others wait for it (`keep_alive`), and a
    failure (a process already gone) means no checkpoint, said in the launcher's one line."""
    if not stopped:
        return checkpointer.save(final=True, reason="end")
    checkpointer.keep_alive()
    try:
        return checkpointer.save(final=True, reason="stop")
    except Exception as e:  # noqa: BLE001
        log.debug("no final checkpoint: %s", e)
        return None


def resume_summary(checkpoint: CheckpointConfig) -> dict[str, object]:
    """Where a resumed run came from and what it trained twice."""
    if not checkpoint.resume:
        return {}
    manifest = read_manifest(checkpoint.resume, "--resume")
    out = {"resumed_from": checkpoint.resume, "resumed_examples": manifest["examples"],
           "examples_trained_twice": manifest["examples_trained_twice_on_resume"]}
    if manifest.get("aligned_at") is not None:  # where every worker resumes (lockstep modes)
        out["aligned_at"] = manifest["aligned_at"]
    return out


def resumed_eps(summary: dict[str, object]) -> None:
    """In a resumed run, examples per second count only what this run trained."""
    if summary.get("resumed_examples") is not None and summary.get("wall_s"):
        summary["eps"] = (summary["examples"] - summary["resumed_examples"]) / summary["wall_s"]


def sync_summary(everyone: Everyone, stats: list[TrainerStats],
                 runner: Runner | None) -> dict[str, object]:
    """Synchronization figures over all trainers: rounds a minute, time blocked, settings."""
    per_min = [m.get("syncs_per_min") for _, m in everyone if m.get("syncs_per_min") is not None]
    busy = sum(s.busy_s for s in stats)
    blocked = sum(s.blocked_s for s in stats)
    return {
        "syncs_per_min": sum(per_min) / len(per_min) if per_min else None,
        "syncs_per_min_per_trainer": per_min,
        "syncs": [m.get("syncs") for _, m in everyone],
        "sync_bytes_per_round": next((m["sync_bytes_per_round"] for _, m in everyone
                                      if m.get("sync_bytes_per_round") is not None), None),
        "sync_blocked_fraction": None if runner is not None and not runner.measures_blocking
        else (blocked / busy if busy > 0 else 0.0),
        "sync_settings": runner.settings() if runner else {"runner": "none"},
    }
