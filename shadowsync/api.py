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


def train(config: TrainConfig | None = None, /, **options: Any) -> RunResult:
    """Train with `config` (default: every default) overridden by `options`, named like the
    long command-line options with underscores (`embedding_servers=1`). `model` may also be
    a function (num_dense, num_tables, embedding_dim) -> nn.Module defined at the top level of
    a module. Raises `shadowsync.errors.UserError` for bad options or data."""
    from shadowsync.logs import setup_logging

    cfg = config_from_options(config, **options)
    setup_logging(cfg.log_level, "launcher", respect_existing=True)
    cfg, summary = run(cfg)
    return RunResult(summary, Path(summary["out"]), cfg)


def run(cfg: TrainConfig) -> tuple[TrainConfig, dict[str, Any]]:
    """Check every input, then create the output directory, write config.toml and train:
    in this process for one trainer with local tables, else as a local cluster launched
    like torchrun. Returns the resolved configuration and the summary."""
    from shadowsync.cluster.launch import choose_port, launch_local
    from shadowsync.cluster.roles import resolve
    from shadowsync.train.local import train_local
    from shadowsync.train.trainer import plan_data

    out = free_out_dir(cfg)
    cfg = resolve(cfg)  # builds the model once: a bad --model fails here
    if cfg.distributed:
        choose_port(cfg)  # a busy --port fails now; a free one is picked again at the launch
    plan = plan_data(cfg)  # opens (converts, generates) the data once, before any process
    f = plan.features
    log.info("data %s: %d training and %d held-out examples, %d dense features, %d "
             "categorical features", cfg.data, plan.train_stop, plan.eval_stop - plan.eval_start,
             f.num_dense, f.num_tables)
    try:  # only now that every input is known good
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--out {out}: cannot create directory: {e.strerror}") from None
    cfg = replace(cfg, out=str(out))
    (Path(cfg.out) / CONFIG_FILE).write_text(config_to_toml(cfg), encoding="utf-8")
    if cfg.distributed:
        summary = launch_local(choose_port(cfg))
    else:
        summary = train_local(cfg, plan)
    return cfg, summary


def free_out_dir(cfg: TrainConfig) -> Path:
    """--out (default runs/<timestamp>), refused if it already holds a run."""
    out = Path(cfg.out) if cfg.out else default_out_dir()
    for name in ("metrics.jsonl", "summary.json", CONFIG_FILE):
        if (out / name).exists():
            raise UserError(f"--out {out}: already holds a run ({name}); choose another directory")
    return out
