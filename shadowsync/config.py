"""Typed run configuration, filled from defaults, then a TOML file, then the command line.

One dataclass lists every option once; the argparse flags and the accepted TOML keys are
derived from it, so an option cannot exist in one place and be missing from the other.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args, get_origin

from shadowsync.errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def _opt(default: Any, help: str, choices: tuple[str, ...] | None = None, **kw: Any) -> Any:
    meta = {"help": help, "choices": choices}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta, **kw)


SYNC_CHOICES = (
    "none", "s-ma", "s-bmuf", "s-easgd", "fr-ma", "fr-bmuf", "fr-easgd", "ddp",
)


@dataclass
class TrainConfig:
    # data
    data: str = _opt("synthetic", "training data: a Criteo TSV file, .gz, directory, or 'synthetic'")
    eval_data: str | None = _opt(None, "held-out data (default: the last 10%% of --data)")
    examples: int | None = _opt(
        None, "training examples, one pass (default: 1.5M synthetic, or all of --data)"
    )
    skip_bad_lines: bool = _opt(False, "skip malformed data lines and count them")
    seed: int = _opt(0, "random seed (data generation, initialisation, shuffling)")
    # model
    embedding_dim: int = _opt(16, "embedding and bottom-MLP output width")
    table_size: int = _opt(100_000, "rows per embedding table (categoricals are hashed into it)")
    bottom_mlp: list[int] = _opt([64], "hidden widths of the bottom MLP")
    top_mlp: list[int] = _opt([128, 64], "hidden widths of the top MLP")
    # optimisation
    optimizer: str = _opt("adagrad", "optimizer (row-wise Adagrad for embeddings)", ("adagrad", "sgd"))
    lr: float = _opt(0.05, "learning rate of the dense parameters")
    embedding_lr: float | None = _opt(None, "learning rate of the embeddings (default: --lr)")
    batch_size: int = _opt(256, "examples per worker step")
    # processes
    workers: int = _opt(2, "Hogwild worker processes per trainer")
    trainers: int = _opt(1, "trainers (data-parallel replicas of the dense model)")
    sync: str = _opt("none", "how trainers synchronize their dense parameters", SYNC_CHOICES)
    # output
    out: str | None = _opt(None, "output directory (default: runs/<timestamp>)")
    log_every: int = _opt(50_000, "examples between lines of metrics.jsonl")
    eval_points: int = _opt(8, "evaluations on a held-out sample during training (for the plot)")
    progress: bool = _opt(True, "show a progress bar")

    def validate(self) -> TrainConfig:
        positive = ["workers", "trainers", "batch_size", "embedding_dim", "table_size", "log_every"]
        for name in positive:
            if getattr(self, name) <= 0:
                raise UserError(f"--{_flag(name)} must be positive, got {getattr(self, name)}")
        if self.examples is not None and self.examples <= 0:
            raise UserError(f"--examples must be positive, got {self.examples}")
        for name in ("lr", "embedding_lr"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise UserError(f"--{_flag(name)} must be a positive number, got {v}")
        for f in dataclasses.fields(self):
            choices = f.metadata.get("choices")
            if choices and getattr(self, f.name) not in choices:
                raise UserError(
                    f"--{_flag(f.name)}: {getattr(self, f.name)!r} is not one of {', '.join(choices)}"
                )
        return self


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _base_type(tp: Any) -> Any:
    args = [a for a in get_args(tp) if a is not type(None)]
    return args[0] if get_origin(tp) is not list and args else tp


def add_config_arguments(parser: argparse.ArgumentParser, cls: type = TrainConfig) -> None:
    """One flag per dataclass field; every default is None so the TOML file can fill the gaps."""
    parser.add_argument("--config", metavar="FILE.toml", help="read options from a TOML file")
    hints = _type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = _base_type(hints[f.name])
        kw: dict[str, Any] = {"default": None, "dest": f.name, "help": f.metadata.get("help")}
        if tp is bool:
            kw["action"] = argparse.BooleanOptionalAction
        elif get_origin(tp) is list:
            kw.update(type=int, nargs="+", metavar="N")
        else:
            kw.update(type=tp, choices=f.metadata.get("choices"))
        parser.add_argument(f"--{_flag(f.name)}", **kw)


def _type_hints(cls: type) -> dict[str, Any]:
    import typing

    return typing.get_type_hints(cls)


def _coerce(name: str, value: Any, tp: Any, source: str) -> Any:
    base = _base_type(tp)
    if value is None:
        return None
    if get_origin(base) is list:
        if not isinstance(value, list) or not all(isinstance(v, int) for v in value):
            raise UserError(f"{source}: option '{name}' must be a list of integers")
        return value
    if base is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, base) or (base is int and isinstance(value, bool)):
        raise UserError(f"{source}: option '{name}' must be {base.__name__}, got {value!r}")
    return value


def load_config(args: argparse.Namespace, cls: type = TrainConfig) -> Any:
    """Defaults < TOML file (`--config`) < command line. Unknown TOML keys are an error."""
    values: dict[str, Any] = {}
    hints = _type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    path = getattr(args, "config", None)
    if path:
        try:
            with open(path, "rb") as fh:
                table = tomllib.load(fh)
        except FileNotFoundError:
            raise UserError(f"{path}: no such file or directory") from None
        except tomllib.TOMLDecodeError as e:
            raise UserError(f"{path}: invalid TOML: {e}") from None
        for key, value in table.items():
            name = key.replace("-", "_")
            if name not in names:
                raise UserError(f"{path}: unknown option '{key}'")
            values[name] = _coerce(key, value, hints[name], path)
    for name in names:
        v = getattr(args, name, None)
        if v is not None:
            values[name] = v
    return cls(**values).validate()


def config_to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def default_out_dir() -> Path:
    import time

    return Path("runs") / time.strftime("%Y%m%d-%H%M%S")
