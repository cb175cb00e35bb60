"""The Python API: `shadowsync.train(...)` runs the same job as `shadowsync train`.

    import shadowsync

    result = shadowsync.train(data="my_arrays/", model="my_models:mlp", trainers=2,
                              sync="s-bmuf", out="runs/mlp")
    print(result.summary["eval_ne"], result.out)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from shadowsync.config import TrainConfig, config_from_options, config_to_toml, default_out_dir
from shadowsync.errors import UserError

CONFIG_FILE = "config.toml"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunResult:
    """What a run left: `summary` (the contents of summary.json), `out` (the run directory,
    with metrics.jsonl, config.toml, ne.png) and `config` (the options as resolved)."""

    summary: dict[str, Any]
    out: Path
    config: TrainConfig

    @property
    def checkpoint(self) -> Path | None:
        """The final checkpoint (`shadowsync eval --checkpoint` and `--resume` read it)."""
        path = self.summary.get("checkpoint")
        return Path(path) if path else None

    def model(self) -> Any:
        """The trained model as a plain `torch.nn.Module` on CPU (`shadowsync.load`)."""
        from shadowsync.inference import load

        factory = self.config.model.name if callable(self.config.model.name) else None
        return load(self.checkpoint or self.out, model=factory)


def train(config: TrainConfig | None = None, /, **options: Any) -> RunResult:
    """Train with `config` (default: every default) overridden by `options`, named like the
    long command-line options with underscores (`embedding_servers=1`). `model` may also be
    a function (num_dense, num_tables, embedding_dim) -> nn.Module, defined anywhere (one from
    a notebook or `__main__` is sent to the job's processes by value). `result.model()` gives
    the trained model. Raises `shadowsync.errors.UserError` for bad options or data."""
    from shadowsync.logs import setup_logging

    if config is None and options.get("resume"):
        config = resume_base(options["resume"])
    cfg = config_from_options(config, **options)
    setup_logging(cfg.output.log_level, "launcher", respect_existing=True)
    cfg, summary = run(cfg)
    return RunResult(summary, Path(summary["out"]), cfg)


MAX_ROLLBACKS = 3


def run(cfg: TrainConfig) -> tuple[TrainConfig, dict[str, Any]]:
    """Check every input, then create the output directory, write config.toml and train:
    in this process for one trainer with local tables, else as a local cluster launched
    like torchrun. Returns the resolved configuration and the summary.

    With --on-divergence rollback, a run that diverges resumes from its last good
    checkpoint (never one holding a NaN: those are refused) at half the learning rate, at
    most MAX_ROLLBACKS times."""
    import time

    started = time.perf_counter()
    rollbacks: list[dict[str, Any]] = []
    if cfg.output.dir is None and not cfg.checkpoint.resume:
        cfg = replace(cfg, out=str(default_out_dir()))
    while True:
        try:
            cfg, summary = run_once(cfg)
            summary["rollbacks"] = rollbacks
            # The whole run as its caller waits for it: data preparation, process start-up,
            # training, the final checkpoint and evaluation (`wall_s`, which `eps` divides
            # by, is the training alone: from the job's processes meeting to the last step).
            summary["total_s"] = round(time.perf_counter() - started, 3)
            from shadowsync.train.report import write_summary

            write_summary(Path(summary["out"]), summary)
            return cfg, summary
        except UserError as e:
            if cfg.checkpoint.on_divergence != "rollback" or "training diverged" not in str(e):
                raise
            from shadowsync.checkpoint.store import published

            out = Path(cfg.output.dir) if cfg.output.dir else None
            good = published(out) if out is not None else []
            if len(rollbacks) >= MAX_ROLLBACKS or not good:
                why = "no good checkpoint to go back to" if not good else \
                    f"still diverging after {MAX_ROLLBACKS} rollbacks"
                raise UserError(f"{e} ({why})") from None
            lr = cfg.optim.lr / 2
            emb_lr = cfg.optim.embedding_lr / 2
            log.warning("%s; rolling back to %s at --lr %g", e, good[-1], lr)
            rollbacks.append({"checkpoint": str(good[-1]), "lr": lr, "error": str(e)})
            cfg = replace(cfg, resume=str(good[-1]), lr=lr, embedding_lr=emb_lr,
                          inject_nan_at=None)


def run_once(cfg: TrainConfig) -> tuple[TrainConfig, dict[str, Any]]:
    """One training run of `run` (no rollback)."""
    from shadowsync import forkserver

    cfg, out = checked_resume(cfg) if cfg.checkpoint.resume else (cfg, free_out_dir(cfg))
    check_writable(out)
    # Every process of the job (or the workers of a local trainer) is forked from it. It
    # imports torch while this process imports torch too, checks the options and prepares
    # the data: on 2 cores, that took the server's start out of the job's critical path.
    forkserver.start()
    try:
        return _checked_run(cfg, out)
    except BaseException:
        forkserver.stop()  # a run that failed or stopped: no server left importing torch
        raise


def _checked_run(cfg: TrainConfig, out: Path) -> tuple[TrainConfig, dict[str, Any]]:
    from shadowsync.cluster.launch import choose_port, launch_local
    from shadowsync.cluster.roles import resolve
    from shadowsync.train.local import train_local
    from shadowsync.train.trainer import plan_data

    cfg = resolve(cfg)  # builds the model once: a bad --model fails here
    if cfg.distributed:
        choose_port(cfg)  # a busy --port fails now; a free one is picked again at the launch
    plan = plan_data(cfg)  # opens (converts, generates) the data once, before any process
    f = plan.features
    log.info("data %s: %d training and %d held-out examples, %d dense features, %d "
             "categorical features", cfg.data.path, plan.train_stop,
             plan.eval_stop - plan.eval_start, f.num_dense, f.num_tables)
    try:  # only now that every input is known good
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--out {out}: cannot create directory: {e.strerror}") from None
    cfg = replace(cfg, out=str(out))
    (Path(cfg.output.dir) / CONFIG_FILE).write_text(config_to_toml(cfg), encoding="utf-8")
    if cfg.distributed:
        summary = launch_local(choose_port(cfg))
    else:
        summary = train_local(cfg, plan)
    return cfg, summary


# Options that shape the model, the tables, the data order or the processes: a checkpoint
# only resumes a run that agrees on all of them.
SHAPE_OPTIONS = ("task", "data", "eval_data", "examples", "seed", "model", "embedding_dim",
                 "id_bias", "table_size", "bottom_mlp", "top_mlp", "optimizer", "batch_size",
                 "workers", "trainers", "embedding_servers", "dense_servers", "row_split_limit",
                 "sync", "sync_groups")


def resume_base(path: str | Path) -> TrainConfig:
    """The configuration a checkpoint was saved with (the base of a resumed run's options)."""
    from shadowsync.checkpoint.store import find_checkpoint, saved_config

    return saved_config(find_checkpoint(path, "--resume"))


def checked_resume(cfg: TrainConfig) -> tuple[TrainConfig, Path]:
    """Find the checkpoint of --resume and check it can continue this configuration."""
    from shadowsync.checkpoint.store import find_checkpoint, read_manifest, run_of
    from shadowsync.cluster.roles import resolve
    from shadowsync.config import config_to_dict
    from shadowsync.train.trainer import resumable

    assert cfg.checkpoint.resume is not None
    step = find_checkpoint(cfg.checkpoint.resume, "--resume")
    manifest = read_manifest(step, "--resume")
    if not manifest.get("resumable") or not resumable(cfg):
        raise UserError(f"--resume {step}: --sync {manifest.get('sync', cfg.sync.mode)} saves only "
                        "its final model; evaluate it with shadowsync eval, or resume runs of "
                        "none, s-* and fr-*")
    saved = config_to_dict(resume_base(step))
    here = config_to_dict(resolve(cfg))  # as the checkpoint's was (dense servers filled in)
    diff = [k for k in SHAPE_OPTIONS if saved.get(k) != here.get(k)]
    if diff:
        k = diff[0]
        raise UserError(f"--resume {step}: checkpoint from another configuration "
                        f"({k.replace('_', '-')} {saved.get(k)!r} there, {here.get(k)!r} here)")
    if manifest.get("final") and manifest.get("reason") == "end":
        raise UserError(f"--resume {step}: that run finished; nothing left to train")
    run = run_of(step)
    out = Path(cfg.output.dir) if cfg.output.dir else run
    if out.resolve() != run.resolve():
        out = free_out_dir(replace(cfg, out=str(out)))
    return replace(cfg, resume=str(step), out=str(out)), out


def check_writable(out: Path) -> None:
    """--out, or the nearest directory above it that exists, must be writable (checked
    before anything is made or converted)."""
    import os

    probe = out
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise UserError(f"--out {out}: {probe} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UserError(f"--out {out}: {probe} is not writable")


def free_out_dir(cfg: TrainConfig) -> Path:
    """--out (default runs/<timestamp>), refused if it already holds a run."""
    out = Path(cfg.output.dir) if cfg.output.dir else default_out_dir()
    for name in ("metrics.jsonl", "summary.json", CONFIG_FILE):
        if (out / name).exists():
            raise UserError(f"--out {out}: already holds a run ({name}); choose another directory")
    return out
