"""The Python API: `shadowsync.train(...)` runs the same job as `shadowsync train`.

    import shadowsync

    result = shadowsync.train(data="my_arrays/", model="my_models:mlp", trainers=2,
                              sync="s-bmuf", out="runs/mlp")
    print(result.summary["eval_ne"], result.out)
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import shadowsync.forkserver as forkserver
from shadowsync.checkpoint.storage import Location, location
from shadowsync.config import TrainConfig, config_from_options, default_out_dir
from shadowsync.errors import UserError
from shadowsync.inference import load
from shadowsync.lifecycle.exits import TrainingDiverged
from shadowsync.logs import setup_logging
from shadowsync.train.report import write_summary

if TYPE_CHECKING:
    from shadowsync.models.trained import TrainedModel

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunResult:
    """What a run left: `summary` (the contents of summary.json), `out` (the run directory,
    with metrics.jsonl, config.toml, ne.png) and `config` (the options as resolved)."""

    summary: dict[str, object]
    out: Path
    config: TrainConfig

    @property
    def checkpoint(self) -> Location | None:
        """The final checkpoint (`shadowsync eval --checkpoint` and `--resume` read it): a
        `Path`, or a `Url` where --checkpoint-dir named one."""
        path = self.summary.get("checkpoint")
        return location(str(path)) if path else None

    def model(self) -> TrainedModel:
        """The trained model as a plain `torch.nn.Module` on CPU (`shadowsync.load`)."""
        factory = self.config.model.name if callable(self.config.model.name) else None
        return load(self.checkpoint or self.out, model=factory)


def train(config: TrainConfig | None = None, /, **options: object) -> RunResult:
    """Train with `config` (default: every default) overridden by `options`, named like the
    long command-line options with underscores (`embedding_servers=1`). `model` may also be
    a function (num_dense, num_tables, embedding_dim) -> nn.Module, defined anywhere (one from
    a notebook or `__main__` is sent to the job's processes by value). `result.model()` gives
    the trained model. Raises `shadowsync.errors.UserError` for bad options or data."""
    if config is None and (options.get("resume") or options.get("warm_start")):
        from shadowsync.cluster import job  # start-up cost: `import shadowsync` has no torch

        if options.get("resume"):
            config = job.resume_base(options["resume"])
        else:  # a warm start: the run's options, unless given
            options = {**job.warm_start_options(str(options["warm_start"])), **options}
    cfg = config_from_options(config, **options)
    setup_logging(cfg.output.log_level, "launcher", respect_existing=True)
    cfg, summary = run(cfg)
    return RunResult(summary, Path(summary["out"]), cfg)


MAX_ROLLBACKS = 3


def run(cfg: TrainConfig) -> tuple[TrainConfig, dict[str, object]]:
    """Check every input, then create the output directory, write config.toml and train:
    in this process for one trainer with local tables, else as a local cluster launched
    like torchrun. Returns the resolved configuration and the summary.

    With --on-divergence rollback, a run that diverges resumes from its last good
    checkpoint (never one holding a NaN: those are refused) at half the learning rate, at
    most MAX_ROLLBACKS times. Divergence is recognised by its type (`TrainingDiverged`, which
    a job's processes signal by exit status `lifecycle.exits.EXIT_DIVERGED`)."""
    started = time.perf_counter()
    # Every process of the job (or the workers of a local trainer) is forked from it. It
    # imports torch while this process imports torch too, checks the options and prepares
    # the data: on 2 cores, that takes the server's start out of the job's critical path.
    # A rollback's attempt forks from the same server.
    forkserver.start()
    try:
        from shadowsync.cluster import job  # start-up cost: `import shadowsync` has no torch

        rollbacks: list[dict[str, object]] = []
        if cfg.output.dir is None and not cfg.checkpoint.resume:
            cfg = replace(cfg, out=str(default_out_dir()))
        while True:  # the first attempt, then one from the last good checkpoint after each
            try:  # divergence, while --on-divergence rollback allows
                cfg, summary = job.run_once(cfg)
                summary["rollbacks"] = rollbacks
                # The whole run as its caller waits for it: data preparation, process
                # start-up, training, the final checkpoint and evaluation (`wall_s`, which
                # `eps` divides by, is the training alone: from the job's processes meeting
                # to the last step).
                summary["total_s"] = round(time.perf_counter() - started, 3)
                write_summary(Path(summary["out"]), summary)
                return cfg, summary
            except TrainingDiverged as e:  # the typed signal, never the words of a message
                if cfg.checkpoint.on_divergence != "rollback":
                    raise
                good = job.last_good(cfg.checkpoint, cfg.output.dir)
                if len(rollbacks) >= MAX_ROLLBACKS or good is None:
                    why = "no good checkpoint to go back to" if good is None else \
                        f"still diverging after {MAX_ROLLBACKS} rollbacks"
                    raise UserError(f"{e} ({why})") from None
                lr = cfg.adapted().optim.lr / 2
                emb_lr = cfg.optim.embedding_lr / 2
                log.warning("%s; rolling back to %s at --lr %g", e, good, lr)
                rollbacks.append({"checkpoint": str(good), "lr": lr, "error": str(e)})
                cfg = replace(cfg, resume=str(good), lr=lr, embedding_lr=emb_lr,
                              inject_nan_at=None)
    except BaseException:
        forkserver.stop()  # a run that failed or stopped: no server left importing torch
        raise
