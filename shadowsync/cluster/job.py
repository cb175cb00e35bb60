"""One run on this machine, put together in order: check the options and the output
directory, resolve the options against the model, open the data once, write config.toml, then
train in this process (one trainer with local tables: `train.local`) or launch the job's
processes like torchrun (`cluster.launch`, each process then running `cluster.roles`).

`shadowsync.train(...)`, `shadowsync train` and the benchmarks all come through `run_once`
(by way of `api.run`, which adds the rollback on divergence).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from shadowsync.checkpoint.storage import Location
from shadowsync.checkpoint.store import (
    CHECKPOINT_DIR,
    checkpoints_at,
    find_checkpoint,
    published,
    read_manifest,
    saved_config,
)
from shadowsync.cluster.launch import choose_port, launch_local
from shadowsync.cluster.parts import resolve
from shadowsync.cluster.shm_room import check_here
from shadowsync.config import CheckpointConfig, SyncConfig, TrainConfig, default_out_dir
from shadowsync.data.dataset import dense_features, feature_counts, sparse_features
from shadowsync.data.infer import AUTO, auto_schema
from shadowsync.errors import UserError
from shadowsync.metrics import worse_than_constant
from shadowsync.train.local import train_local
from shadowsync.train.table_kinds.kind import table_builder
from shadowsync.train.tasks import TaskInputs, plan_data
from shadowsync.train.tasks.ctr import rows_path

CONFIG_FILE = "config.toml"
SCHEMA_FILE = "schema.toml"  # the run's --schema, as it trained on it

log = logging.getLogger(__name__)


def run_once(cfg: TrainConfig) -> tuple[TrainConfig, dict[str, object]]:
    """One training run of `api.run` (no rollback; its processes fork from the server
    `api.run` started): check --resume, --warm-start and --out, resolve, open the data, make
    the output directory, write config.toml, then train or launch. Returns the checked
    configuration and the summary."""
    def resolved() -> dict[str, object]:  # as a checkpoint's was (dense servers filled in)
        return resolve(cfg).to_dict()

    if cfg.checkpoint.resume:
        changes, out = checked_resume(cfg.checkpoint, cfg.sync, cfg.output.dir, resolved)
        cfg = replace(cfg, **changes)
    else:
        out = free_out_dir(cfg.output.dir)
    if cfg.checkpoint.warm_start and not cfg.checkpoint.resume:
        cfg = replace(cfg, warm_start=checked_warm_start(cfg, cfg.sync, resolved))
    # a --checkpoint-dir URL no file system serves: said now
    checkpoints_at(cfg.checkpoint, cfg.output.dir)
    check_writable(out)
    cfg = resolve(cfg)  # builds the model once: a bad --model fails here
    if cfg.data.schema == AUTO:  # read off --data's columns once, for --eval-data too
        cfg = replace(cfg, schema=auto_schema(cfg.data.path))
    if cfg.distributed:
        choose_port(cfg.cluster)  # a busy --port fails now; a free one is picked at the launch
    check_here(cfg, cfg.distributed)  # /dev/shm holds what it will share (else a SIGBUS later)
    plan = plan_data(cfg)  # opens (converts, generates) the data once, before any process
    f = plan.features
    log.info("data %s: %d training and %d held-out examples, %d dense features, %d "
             "categorical features", cfg.data.path, plan.train_stop,
             plan.eval_stop - plan.eval_start, f.num_dense, f.num_tables)
    try:  # only now that every input is known good
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--out {out}: cannot create directory: {e.strerror}") from None
    cfg = replace(cfg, out=str(out), schema=kept_schema(cfg.data.schema, out))
    (Path(cfg.output.dir) / CONFIG_FILE).write_text(cfg.to_toml(), encoding="utf-8")
    if cfg.distributed:
        summary = launch_local(replace(cfg, port=choose_port(cfg.cluster)))
    else:
        summary = train_local(cfg, plan, cfg.recorded())
    warning = worse_than_constant(summary.get("eval_ne"), "eval")
    if warning:
        log.warning("%s", warning)
    return cfg, summary


# Options that shape the model, the tables, the data order or the processes: a checkpoint
# only resumes a run that agrees on all of them.
SHAPE_OPTIONS = ("task", "data", "eval_data", "examples", "seed", "model", "embedding_dim",
                 "id_bias", "interaction", "table_size", "tables", "table_memory",
                 "admit_after", "bottom_mlp", "top_mlp", "optimizer",
                 "batch_size", "workers", "trainers", "embedding_servers", "dense_servers",
                 "row_split_limit", "sync", "sync_groups")
# What a warm start (the next day's data) may change; the rest must agree. With dynamic tables
# the budget may change too (the saved pool is laid into the new one as it loads).
NEXT_DAY_OPTIONS = ("data", "eval_data", "examples")
NEW_BUDGET_OPTIONS = ("table_size", "table_memory")
# What a warm start takes from the run it starts from, where this run does not say.
WARM_START_KEEPS = tuple(k for k in (*SHAPE_OPTIONS, "evict", "schema")
                         if k not in NEXT_DAY_OPTIONS)


def warm_start_options(path: str) -> dict[str, object]:
    """The options a warm start from `path` takes unless given: the run's model, table and
    job options (its budget and eviction rule included; either may be given anew) and its
    schema (the copy in its OUT)."""
    step = find_checkpoint(path, "--warm-start")
    saved = saved_config(step).to_dict()
    kept = step.parent.parent / SCHEMA_FILE  # the run's copy, wherever the run is now
    if saved.get("schema") and isinstance(kept, Path) and kept.is_file():
        saved["schema"] = str(kept)
    return {k: saved[k] for k in WARM_START_KEEPS if saved.get(k) is not None}


def resume_base(path: str | Path) -> TrainConfig:
    """The configuration a checkpoint was saved with (the base of a resumed run's options)."""
    return saved_config(find_checkpoint(path, "--resume"))


def checked_resume(checkpoint: CheckpointConfig, sync: SyncConfig, out_dir: str | None,
                   resolved: Callable[[], dict[str, object]]) -> tuple[dict[str, object], Path]:
    """Find the checkpoint of --resume and check it can continue this configuration
    (`resolved()`: its options resolved, by flat name, asked once the checkpoint is found).
    Returns the options the resumed run changes (flat names) and its run directory."""
    assert checkpoint.resume is not None
    step = find_checkpoint(checkpoint.resume, "--resume")
    manifest = read_manifest(step, "--resume")
    if not manifest.get("resumable") or not sync.entry.resumable:
        raise UserError(f"--resume {step}: --sync {manifest.get('sync', sync.mode)} saves only "
                        "its final model; evaluate it with shadowsync eval, or resume runs of "
                        "none, s-* and fr-*")
    base = resume_base(step)
    saved = base.to_dict()
    here = resolved()
    diff = [k for k in SHAPE_OPTIONS if saved.get(k) != here.get(k)]
    if diff:
        k = diff[0]
        raise UserError(f"--resume {step}: checkpoint from another configuration "
                        f"({k.replace('_', '-')} {saved.get(k)!r} there, {here.get(k)!r} here)")
    if manifest.get("final") and manifest.get("reason") == "end":
        raise UserError(f"--resume {step}: that run finished; nothing left to train")
    # The run goes on in its own directory and checkpoint root, unless options name others
    # (options left as the checkpoint's config.toml has them name the same).
    root = step.parent
    run = root.parent if isinstance(root, Path) and root.name == CHECKPOINT_DIR else None
    out = Path(out_dir) if out_dir else run
    same_out = out is not None and (out_dir == base.output.dir or (
        run is not None and out.resolve() == run.resolve()))
    same_root = checkpoint.dir == base.checkpoint.dir
    changes: dict[str, object] = {}
    if not same_out:
        out = free_out_dir(str(out) if out else None)
        if same_root:  # a new run directory keeps its own checkpoints
            changes["checkpoint_dir"] = None
    elif same_root and run is None:
        changes["checkpoint_dir"] = str(root)
    return {**changes, "resume": str(step), "out": str(out)}, out


def checked_warm_start(inputs: TaskInputs, sync: SyncConfig,
                       resolved: Callable[[], dict[str, object]]) -> str:
    """--warm-start: the checkpoint, found, and shaped as this run (the data may differ;
    `resolved()`: the run's options resolved, by flat name). Returns the checkpoint's step."""
    assert inputs.checkpoint.warm_start is not None
    step = find_checkpoint(inputs.checkpoint.warm_start, "--warm-start")
    if not read_manifest(step, "--warm-start").get("resumable") or not sync.entry.resumable:
        raise UserError(f"--warm-start {step}: --sync {sync.mode} runs do not warm start; "
                        "use none, s-* or fr-*")
    saved = resume_base(step).to_dict()
    here = resolved()
    free = NEXT_DAY_OPTIONS + (NEW_BUDGET_OPTIONS if table_builder(inputs.model).resizes else ())
    diff = [k for k in SHAPE_OPTIONS if k not in free and saved.get(k) != here.get(k)]
    if diff:
        k = diff[0]
        raise UserError(f"--warm-start {step}: a model of another shape "
                        f"({k.replace('_', '-')} {saved.get(k)!r} there, {here.get(k)!r} here)")
    check_same_features(step, inputs)
    return str(step)


def check_same_features(step: Path, cfg: TaskInputs) -> None:
    """--data has the columns the warm start's run trained on (from its manifest, else from
    its shape), in the same order: else one line naming the columns that differ."""
    manifest = read_manifest(step, "--warm-start")
    path = rows_path(cfg)  # with the quantile buckets the run adds (`data.buckets`)
    num_dense, num_tables = feature_counts(path)
    here = [*dense_features(path, num_dense),
            *(str(f["name"]) for f in sparse_features(path, num_tables))]
    if "dense_features" in manifest and "sparse_features" in manifest:
        there = [*manifest["dense_features"], *(str(f["name"]) for f in
                                                 manifest["sparse_features"])]
    elif (num_dense, num_tables) == (manifest.get("num_dense", num_dense),
                                     len(manifest.get("table_rows", [None] * num_tables))):
        return
    else:
        there = [f"{manifest.get('num_dense')} dense and {len(manifest['table_rows'])} "
                 "categorical"]
        here = [f"{num_dense} dense and {num_tables} categorical"]
    if here == there:
        return
    only_here = [n for n in here if n not in there]
    only_there = [n for n in there if n not in here]
    what = "; ".join(part for part in (
        f"here only: {', '.join(only_here)}" if only_here else "",
        f"there only: {', '.join(only_there)}" if only_there else "") if part) or (
        f"the same columns in another order ({', '.join(here)} here)")
    raise UserError(f"--warm-start {step}: --data {cfg.data.path} has other features than the "
                    f"run it starts from ({what})")


def kept_schema(schema: str | None, out: Path) -> str | None:
    """The run's --schema copied into OUT (the run then names its copy: an inferred schema
    lives in a cache, and a file may change before the next day's run reads it)."""
    if schema is None:
        return None
    kept = (out / SCHEMA_FILE).resolve()  # found again from any directory
    if Path(schema).resolve() != kept:
        shutil.copyfile(schema, kept)
    return str(kept)


def check_writable(out: Path) -> None:
    """--out, or the nearest directory above it that exists, must be writable (checked
    before anything is made or converted)."""
    probe = out
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise UserError(f"--out {out}: {probe} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UserError(f"--out {out}: {probe} is not writable")


def free_out_dir(out_dir: str | None) -> Path:
    """--out (default runs/<timestamp>), refused if it already holds a run."""
    out = Path(out_dir) if out_dir else default_out_dir()
    for name in ("metrics.jsonl", "summary.json", CONFIG_FILE):
        if (out / name).exists():
            raise UserError(f"--out {out}: already holds a run ({name}); choose another directory")
    return out


def last_good(checkpoint: CheckpointConfig, out_dir: str | None) -> Location | None:
    """The newest published checkpoint of a run (`out_dir`: its --out; never one holding a
    NaN: those are refused when saved), or None."""
    good = published(checkpoints_at(checkpoint, out_dir)) if out_dir or checkpoint.dir else []
    return good[-1] if good else None
