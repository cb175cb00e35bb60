"""Typed run configuration, filled from defaults, then a TOML file, then the command line.

One dataclass lists every option once; the argparse flags and the accepted TOML keys are
derived from it, so an option cannot exist in one place and be missing from the other.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args, get_origin

from shadowsync.errors import UserError
from shadowsync.runners.modes import SYNC_CHOICES, mode_of
from shadowsync.toml_file import read_toml

TASK_CHOICES = ("ctr", "digits")
TESTING = "testing (fault injection and benchmark knobs)"  # shadowsync.train.tasks.TASKS
DLRM = "dlrm"  # the built-in dense model's name for --model (shadowsync.models.build)

def _opt(default: Any, help: str, choices: tuple[str, ...] | None = None,
         parse: Callable[[str], Any] | None = None, group: str | None = None, **kw: Any) -> Any:
    """`parse`: how the command line's one word becomes the value (default: the field's type).
    `group`: the --help topic of this option where it is not its neighbours' (HELP_SECTIONS)."""
    meta = {"help": help, "choices": choices, "parse": parse, "group": group}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta, **kw)


def _sizes(text: str) -> list[int]:
    """'100000' or '1000,50000,...' -> [int, ...] (argparse reports a ValueError as bad input)."""
    return [int(v) for v in text.split(",")]


@dataclass
class TrainConfig:
    """Every option of a training run, each field named as its long command-line option
    with underscores (`--embedding-servers` is `embedding_servers`). Values are checked when
    the object is made: a bad one raises `shadowsync.errors.UserError` naming the option.
    The fields, their defaults and their help texts are listed in the CLI reference
    (`shadowsync train --help`)."""

    # task
    task: str = _opt("ctr", "what to train: ctr (DLRM on CTR rows, NE) or digits (scikit-learn's "
                     "8x8 digits, a small CNN, accuracy)", TASK_CHOICES)
    # data
    data: str = _opt("synthetic",
                     "training data: 'synthetic', a Criteo TSV file, .gz or directory, or a "
                     "directory of labels.npy, dense.npy, cats.npy")
    schema: str | None = _opt(
        None, "a TOML file naming the label, dense, categorical and multi-hot columns of "
        "Parquet or CSV --data / --eval-data (converted once into a cache; table sizes come "
        "from it; see docs/real-data.md)")
    eval_data: str | None = _opt(None, "held-out data (default: the last 10% of --data)")
    examples: int | None = _opt(
        None, "training examples of one pass (default: 1.5M synthetic, or all of --data; "
        "more than the data holds is an error: use --epochs)"
    )
    epochs: int = _opt(1, "passes over the training rows; with more than one, each pass reads "
                       "them in a new order drawn from --seed")
    val_share: float = _opt(
        0.0, "share of the training rows held out at their end for validation: evaluated at "
        "each epoch's end and --eval-points times within, the best model kept as "
        "OUT/checkpoint/best (what eval uses) and reported in the summary (0: off)")
    early_stop: int | None = _opt(
        None, "with --val-share: stop after this many validations without improvement "
        "(default: train every epoch)")
    skip_bad_lines: bool = _opt(False, "skip malformed data lines and count them")
    seed: int = _opt(0, "random seed (data generation, initialisation, shuffling)")
    # model
    model: str | Callable[..., Any] = _opt(
        DLRM, "dense model: dlrm, or MODULE:FUNCTION called with (num_dense, num_tables, "
        "embedding_dim) that returns an nn.Module; forward(dense, emb) -> logits [B]")
    embedding_dim: int = _opt(16, "embedding and bottom-MLP output width")
    table_size: list[int] = _opt(
        [100_000], "rows per embedding table, one size for all or a comma list of one per table "
        "(ids are taken modulo it)", parse=_sizes)
    bottom_mlp: list[int] = _opt([64], "hidden widths of the bottom MLP")
    top_mlp: list[int] = _opt([128, 64], "hidden widths of the top MLP")
    id_bias: bool = _opt(
        True, "dlrm: a learned bias per id, added to the logit (one more column in each "
        "embedding row)")
    # optimisation
    optimizer: str = _opt("adagrad", "optimizer (row-wise Adagrad for embeddings)",
                          ("adagrad", "sgd"))
    lr: float = _opt(0.05, "learning rate of the dense parameters")
    embedding_lr: float = _opt(0.2, "learning rate of the embeddings")
    embedding_initial_accumulator: float = _opt(
        0.05, "where every embedding row's Adagrad accumulator starts (0: at zero, as torch "
        "does): above zero, a rare id's first steps are shrunk instead of a full --embedding-lr")
    embedding_weight_decay: float = _opt(
        0.0, "L2 weight decay on the embedding rows a batch reads (W x row added to their "
        "gradient, inside row-wise Adagrad); 0: off (1e-3 to 3e-2 lowered eval AUC on MovieLens "
        "100K, see docs/real-data.md)")
    warmup_steps: int = _opt(
        300, "worker steps over which the dense learning rate rises linearly to --lr (0: off)")
    lr_decay_share: float = _opt(
        0.3, "last share of each worker's pass over which the dense and embedding learning "
        "rates fall linearly to --lr-decay-floor of their value (0: off)")
    lr_decay_floor: float = _opt(0.3, "where the decay ends, as a share of the learning rates")
    lr_decay_on_plateau: bool = _opt(
        False, "with --val-share: the decay starts at the first validation without "
        "improvement (and runs over --lr-decay-share of the run's steps from there) instead "
        "of at the end of the run")
    batch_size: int = _opt(256, "examples per worker step")
    # processes
    workers: int = _opt(1, "Hogwild worker processes per trainer")
    trainers: int = _opt(2, "trainers (data-parallel replicas of the dense model)")
    embedding_servers: int = _opt(
        1, "embedding parameter servers (0: tables live in the single trainer)")
    dense_servers: int | None = _opt(
        None, "dense parameter servers for the EASGD centre and bsp / asp / switch "
        "(default: 1 if the sync needs it)")
    row_split_limit: int = _opt(1_000_000, "tables with more rows are split row-wise over servers")
    embedding_transport: str = _opt(
        "auto", "how trainers reach the embedding servers: auto (shared memory on the same "
        "host, RPC otherwise), rpc (always), unshared (a private local copy per trainer: the "
        "benchmark ceiling, not shared training)", ("auto", "rpc", "unshared"))
    # synchronization
    sync: str = _opt("s-bmuf", "how trainers synchronize their dense parameters", SYNC_CHOICES)
    sync_groups: list[str] = _opt(
        [], "per-group rules, e.g. bottom=s-easgd top=s-bmuf (the rest follows --sync)")
    sync_interval: str = _opt(
        "auto", "seconds between background rounds, 0 = back to back, auto = CPU budget")
    sync_budget: float = _opt(0.03, "share of the trainer's cores the auto pace may spend")
    sync_every: int = _opt(50, "worker steps between foreground rounds")
    sync_dtype: str = _opt(
        "fp32", "what background and foreground rounds send (bf16: half the bytes; the "
        "parameters stay fp32)", ("fp32", "bf16"))
    sync_transport: str = _opt(
        "auto", "how a round's average travels: auto (through shared memory between trainers "
        "on one host, collectives otherwise), collective (always an AllReduce)",
        ("auto", "collective"))
    write_back: str = _opt(
        "delta", "apply a round as (result - snapshot) or overwrite", ("delta", "overwrite"))
    block_momentum: float | None = _opt(None, "BMUF block momentum eta (default 1 - 1/trainers)")
    block_lr: float = _opt(1.0, "BMUF block learning rate zeta")
    nesterov: bool = _opt(False, "BMUF Nesterov look-ahead")
    elastic_alpha: float = _opt(0.5, "EASGD elastic rate alpha")
    momentum: float = _opt(
        0.9, "momentum of the servers' SGD under bsp / asp / switch (with --optimizer sgd)")
    switch_plan: str = _opt(
        "bsp:0.1,asp", "protocol phases of --sync switch: MODE:SHARE,... (last share: the rest)")
    switch_momentum: str = _opt(
        "keep", "momentum at a switch: keep it, zero it, or zero it and ramp it back",
        ("keep", "zero", "ramp"))
    switch_scale_lr: bool = _opt(
        True, "ASP steps use --lr / (trainers x workers): BSP's global batch at --lr becomes "
        "one worker's batch at --lr / n")
    switch_compensate_momentum: bool = _opt(
        False, "ASP steps run at momentum max(0, m - (1 - 1/n)): asynchrony adds about 1 - 1/n")
    switch_policy: str = _opt(
        "plan", "when to switch: the plan's shares, or online on stragglers (greedy: ASP while "
        "one lasts; elastic: only once it lasted --switch-patience s; isolate: only the "
        "stragglers' pushes ASP, the rest BSP)", ("plan", "greedy", "elastic", "isolate"))
    switch_detector: str = _opt(
        "k=1.5,m=3,window=5", "straggler: window median step time > k x the others' median for m "
        "windows of `window` steps")
    switch_patience: float = _opt(1.0, "seconds a straggler must last before elastic switches")
    switch_at: str | None = _opt(
        None, "BSP share of the plan: a number, or 'auto' for what `shadowsync switch search` "
        "stored under --job-name")
    job_name: str | None = _opt(None, "name a recurring job's search result is stored under")
    straggler_fallback: str | None = _opt(
        None, "with --sync s-ma or s-bmuf: s-easgd rounds while the straggler detector "
        "(--switch-detector's k and m, over worker reports) sees a slow trainer, back when it "
        "clears", ("s-easgd",))
    straggler: str | None = _opt(
        None, "slow trainers down: trainer=ID,slowdown=3,start=S,duration=D (seconds, or "
        "shares of the job's examples: start=25%,duration=50%); kind=delay,ms=30,trainers=N "
        "delays each push of the last N trainers (emulated link delay), kind=jitter,ms=D,"
        "jitter=J every trainer's by D +- J ms; episodes=K repeats the window's slowdown K "
        "times", group=TESTING)
    # network
    addr: str = _opt("127.0.0.1", "address the local cluster binds and meets on")
    port: int | None = _opt(None, "rendezvous port of the local cluster (default: a free one)")
    rpc_port: int | None = _opt(
        None, "RPC store port where the launcher does not share its store (default: its + 1)")
    # output
    out: str | None = _opt(None, "output directory (default: runs/<timestamp>)")
    log_every: int = _opt(50_000, "examples between lines of metrics.jsonl")
    eval_points: int = _opt(8, "evaluations on a held-out sample during training (for the plot)")
    progress: bool | None = _opt(None, "progress bars (default: only on a terminal)")
    log_level: str = _opt("info", "messages to show (-q: warning, -v: debug)",
                          ("warning", "info", "debug"))
    checkpoint_every: str = _opt(
        "300s", "checkpoint the job every N seconds ('600s') or N examples ('500000'); 0: only "
        "at the end and on Ctrl-C / SIGTERM; never: no checkpoint (a throwaway run: nothing "
        "to resume, and a restart after a failure begins from the start)")
    keep_checkpoints: int = _opt(2, "checkpoints kept under OUT/checkpoint (older ones pruned)")
    max_restarts: int = _opt(
        3, "when a process of the job dies, restart the job from its newest checkpoint up to "
        "this many times (through the elastic agent; modes that resume)")
    resume: str | None = _opt(
        None, "continue the run in this directory (or from this checkpoint/step-N) where its "
        "latest checkpoint left off; its config.toml is the base of the options")
    on_divergence: str = _opt(
        "stop", "on a NaN / Inf loss: stop with one line, or roll back to the last good "
        "checkpoint at half the learning rate (at most 3 times)", ("stop", "rollback"))
    inject_nan_at: int | None = _opt(
        None, "poison trainer 0's dense model once the job has trained about N examples "
        "(to test --on-divergence)", group=TESTING)
    tensorboard: bool = _opt(False, "also write TensorBoard scalars under OUT/tensorboard "
                             "(pip install 'shadowsync[tensorboard]')")

    def __post_init__(self) -> None:
        # Accept what a Python caller naturally writes: table_size=50_000 or "1000,2000".
        if isinstance(self.table_size, int) and not isinstance(self.table_size, bool):
            self.table_size = [self.table_size]
        elif isinstance(self.table_size, str):
            try:
                self.table_size = _sizes(self.table_size)
            except ValueError:
                raise UserError(f"--table-size: {self.table_size!r} is not a size or a comma "
                                "list of sizes") from None
        self.validate()

    def validate(self) -> TrainConfig:
        positive = ["workers", "trainers", "batch_size", "embedding_dim", "log_every",
                    "sync_every", "row_split_limit"]
        for name in positive:
            if getattr(self, name) <= 0:
                raise UserError(f"--{_flag(name)} must be positive, got {getattr(self, name)}")
        if not self.table_size or any(v <= 0 for v in self.table_size):
            raise UserError(f"--table-size: sizes must be positive, got {self.table_size}")
        self._check_model()
        if self.tensorboard and importlib.util.find_spec("tensorboard") is None:
            raise UserError("--tensorboard needs the tensorboard package: "
                            "pip install 'shadowsync[tensorboard]'")
        if self.examples is not None and self.examples <= 0:
            raise UserError(f"--examples must be positive, got {self.examples}")
        self._check_epochs()
        for name in ("embedding_servers", "dense_servers", "warmup_steps", "max_restarts"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise UserError(f"--{_flag(name)} must be >= 0, got {v}")
        if self.keep_checkpoints < 1:
            raise UserError(f"--keep-checkpoints must be >= 1, got {self.keep_checkpoints}")
        from shadowsync.checkpoint.interval import parse_every

        parse_every(self.checkpoint_every)
        if not 0 < self.sync_budget <= 1:
            raise UserError(f"--sync-budget must be in (0, 1], got {self.sync_budget}")
        if not 0 <= self.momentum < 1:
            raise UserError(f"--momentum must be in [0, 1), got {self.momentum}")
        if self.straggler is not None:
            from shadowsync.train.straggler import Straggler

            kind = Straggler.parse(self.straggler, self.trainers).kind
            if kind != "compute" and not mode_of(self.sync).protocols:
                raise UserError(f"--straggler kind={kind} delays pushes to the dense servers: it "
                                "needs --sync bsp, asp or switch")
        if self.straggler_fallback is not None:
            if not mode_of(self.sync).can_fall_back or self.sync_groups:
                raise UserError("--straggler-fallback needs --sync s-ma or s-bmuf (every "
                                "trainer needed at each round) and no --sync-groups")
            from shadowsync.runners.switch.detector import DetectorConfig

            DetectorConfig.parse(self.switch_detector)
        if mode_of(self.sync).can_switch:
            from shadowsync.runners.switch.plan import SwitchPlan

            SwitchPlan.parse(self.switch_plan)
            from shadowsync.runners.switch.detector import DetectorConfig

            DetectorConfig.parse(self.switch_detector)
            if self.switch_at is not None:
                from shadowsync.runners.switch.search import resolve_share

                resolve_share(self.switch_at, self.job_name)
        if not 0 < self.elastic_alpha <= 1:
            raise UserError(f"--elastic-alpha must be in (0, 1], got {self.elastic_alpha}")
        self.sync_interval_s()
        for name in ("lr", "embedding_lr"):
            v = getattr(self, name)
            if not v > 0:
                raise UserError(f"--{_flag(name)} must be a positive number, got {v}")
        for name in ("lr_decay_share", "lr_decay_floor"):
            v = getattr(self, name)
            if not 0 <= v <= 1:
                raise UserError(f"--{_flag(name)} must be in [0, 1], got {v}")
        if not 0 <= self.embedding_initial_accumulator < float("inf"):
            raise UserError("--embedding-initial-accumulator must be a number >= 0, got "
                            f"{self.embedding_initial_accumulator}")
        for f in dataclasses.fields(self):
            choices = f.metadata.get("choices")
            value = getattr(self, f.name)
            if value is None and f.default is None:  # an option left out
                continue
            if choices and value not in choices:
                raise UserError(f"--{_flag(f.name)}: {value!r} is not one of {', '.join(choices)}")
        return self

    def _check_epochs(self) -> None:
        if self.epochs < 1:
            raise UserError(f"--epochs must be positive, got {self.epochs}")
        if not 0 <= self.val_share < 1:
            raise UserError(f"--val-share must be in [0, 1), got {self.val_share}")
        if self.early_stop is not None:
            if self.early_stop < 1:
                raise UserError(f"--early-stop must be positive, got {self.early_stop}")
            if self.val_share <= 0:
                raise UserError("--early-stop needs --val-share (the rows it validates on)")
            if not mode_of(self.sync).stops_alone:
                raise UserError(f"--early-stop: --sync {self.sync} cannot stop its workers "
                                "early; use epochs, or another --sync")
        if self.val_share > 0:
            if self.task != "ctr":
                raise UserError("--val-share needs --task ctr")
            if self.checkpoint_every == "never":
                raise UserError("--val-share keeps the best model as a checkpoint: not with "
                                "--checkpoint-every never")
        if not 0 <= self.embedding_weight_decay < float("inf"):
            raise UserError("--embedding-weight-decay must be a number >= 0, got "
                            f"{self.embedding_weight_decay}")

    def _check_model(self) -> None:
        if not callable(self.model):
            return
        # Every process builds the model, so the factory travels to them by pickle: by name
        # where they can import it, else by value (a notebook's or a script's __main__, a
        # function defined inside another).
        from shadowsync.by_value import portable

        self.model = portable(self.model)

    def table_rows(self, num_tables: int) -> list[int]:
        """Rows of each of the data's `num_tables` tables."""
        if len(self.table_size) == 1:
            return self.table_size * num_tables
        if len(self.table_size) != num_tables:
            raise UserError(f"--table-size: {len(self.table_size)} sizes given, but the data "
                            f"has {num_tables} categorical features")
        return list(self.table_size)

    def table_width(self) -> int:
        """Columns of an embedding row: the embedding, and the DLRM's id bias if it has one."""
        return self.embedding_dim + (1 if self.id_bias and self.model == DLRM else 0)

    def table_optimizer(self) -> dict[str, Any]:
        """How every embedding table of the job learns, wherever it lives (a server, a
        trainer, a checkpoint being evaluated, a peer's tables)."""
        return {"optimizer": self.optimizer, "lr": self.embedding_lr,
                "initial_accumulator": self.embedding_initial_accumulator,
                "weight_decay": self.embedding_weight_decay}

    def sync_interval_s(self) -> float | None:
        """The background pace in seconds, or None for auto."""
        if self.sync_interval == "auto":
            return None
        try:
            v = float(self.sync_interval)
        except ValueError:
            v = -1.0
        if not v >= 0:
            raise UserError(f"--sync-interval must be 'auto' or seconds >= 0, "
                            f"got {self.sync_interval!r}")
        return v

    @property
    def distributed(self) -> bool:
        """A job of several processes (servers and/or several trainers)."""
        return (self.trainers > 1 or self.embedding_servers > 0 or mode_of(self.sync).synchronizes
                or bool(self.sync_groups))


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _base_type(tp: Any) -> Any:
    args = [a for a in get_args(tp) if a is not type(None)]
    return args[0] if get_origin(tp) is not list and args else tp


# The first option of each topic in --help, in field order; the options after it, up to the
# next one listed, belong to the same topic (an option's own `group` overrides it). The
# topics are shown in this order.
HELP_SECTIONS = {
    "data": "data",
    "model": "model and optimisation",
    "workers": "cluster",
    "sync": "synchronization",
    "addr": "cluster",
    "out": "output",
    "checkpoint_every": "checkpoints and recovery",
    "tensorboard": "output",
}
HELP_ORDER = ("data", "model and optimisation", "cluster", "synchronization", "output",
              "checkpoints and recovery", TESTING)


def _default_text(f: dataclasses.Field) -> str:
    value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    if value is None or "default" in (f.metadata.get("help") or ""):
        return ""  # the help text says what None means
    if isinstance(value, list):
        value = ",".join(map(str, value)) if f.metadata.get("parse") else " ".join(map(str, value))
    elif isinstance(value, bool):
        value = f"--{'' if value else 'no-'}{_flag(f.name)}"
    return f" (default: {'none' if value == '' else value})"


def add_config_arguments(parser: argparse.ArgumentParser, cls: type = TrainConfig) -> None:
    """One flag per dataclass field, grouped by topic; every default is None so the TOML file
    can fill the gaps (--help shows the real defaults)."""
    parser.add_argument("--config", metavar="FILE.toml", help="read options from a TOML file")
    hints = _type_hints(cls)
    groups = {title: parser.add_argument_group(title) for title in HELP_ORDER}
    section: Any = parser
    for f in dataclasses.fields(cls):
        if f.name in HELP_SECTIONS:
            section = groups[HELP_SECTIONS[f.name]]
        group = groups[f.metadata["group"]] if f.metadata.get("group") else section
        tp = _base_type(hints[f.name])
        text = (f.metadata.get("help") or "") + _default_text(f)
        # argparse %-formats help texts: a literal % (as in start=25%) is written %%.
        kw: dict[str, Any] = {"default": None, "dest": f.name, "help": text.replace("%", "%%")}
        if tp is bool:
            kw["action"] = argparse.BooleanOptionalAction
        elif f.metadata.get("parse"):
            kw.update(type=f.metadata["parse"], metavar="N[,N...]")
        elif get_origin(tp) is list:
            item = get_args(tp)[0]
            kw.update(type=item, nargs="+", metavar="N" if item is int else "VALUE")
        else:
            kw.update(type=tp, choices=f.metadata.get("choices"))
            if not f.metadata.get("choices"):
                kw["metavar"] = {int: "N", float: "X"}.get(tp, "TEXT")
        flags = [f"--{_flag(f.name)}"]
        if f.name == "log_level":
            group.add_argument("-q", "--quiet", dest="log_level", action="store_const",
                               const="warning", help="print only the summary and errors")
            group.add_argument("-v", "--verbose", dest="log_level", action="store_const",
                               const="debug", help="print debugging messages too")
        group.add_argument(*flags, **kw)


def _type_hints(cls: type) -> dict[str, Any]:
    import typing

    return typing.get_type_hints(cls)


def _coerce(name: str, value: Any, tp: Any, source: str) -> Any:
    base = _base_type(tp)
    if value is None:
        return None
    if get_origin(base) is list:
        item = get_args(base)[0]
        if isinstance(value, item) and not isinstance(value, bool):
            value = [value]  # table_size = 100000: one size for every table
        if not isinstance(value, list) or not all(isinstance(v, item) for v in value):
            raise UserError(f"{source}: option '{name}' must be a list of {item.__name__}")
        return value
    if base is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if base is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)  # e.g. sync_interval = 0.5
    if not isinstance(value, base) or (base is int and isinstance(value, bool)):
        raise UserError(f"{source}: option '{name}' must be {base.__name__}, got {value!r}")
    return value


def load_config(args: argparse.Namespace, cls: type = TrainConfig,
                absent: dict[str, Any] | None = None) -> Any:
    """Defaults < `absent` (values for options the TOML file does not set) < TOML file
    (`--config`) < command line. Unknown TOML keys are an error."""
    values: dict[str, Any] = dict(absent or {})
    hints = _type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    path = getattr(args, "config", None)
    if path:
        table = read_toml(path, path)
        for key, value in table.items():
            name = key.replace("-", "_")
            if name not in names:
                raise UserError(f"{path}: {unknown_option(key, names)}")
            values[name] = _coerce(key, value, hints[name], path)
    for name in names:
        v = getattr(args, name, None)
        if v is not None:
            values[name] = v
    return cls(**values)  # validated on construction


def unknown_option(key: str, names: set[str]) -> str:
    """"unknown option 'wokers'; did you mean 'workers'?" """
    close = difflib.get_close_matches(key.replace("-", "_"), sorted(names), n=1)
    return f"unknown option '{key}'" + (f"; did you mean '{close[0]}'?" if close else "")


def config_from_options(config: TrainConfig | None = None, **options: Any) -> TrainConfig:
    """A validated TrainConfig from a base config (default: all defaults) and keyword options
    named like the long command-line options (`trainers=2, sync="s-bmuf"`)."""
    if config is not None and not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    for key in options:
        if key not in names:
            raise UserError(unknown_option(key, names))
    return dataclasses.replace(config or TrainConfig(), **options)


def model_name(model: str | Callable[..., Any]) -> str:
    """How a model option is written in messages, summary.json and config.toml: a factory
    as the MODULE:FUNCTION that finds it again."""
    return f"{model.__module__}:{model.__qualname__}" if callable(model) else model


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """The options as plain data (JSON and TOML can hold every value)."""
    values = dataclasses.asdict(cfg)
    if "model" in values:
        values["model"] = model_name(values["model"])
    return values


def default_out_dir() -> Path:
    import time

    return Path("runs") / time.strftime("%Y%m%d-%H%M%S")


def config_to_toml(cfg: Any) -> str:
    """A TOML file that `--config` reads back into the same configuration."""
    lines = []
    for key, value in config_to_dict(cfg).items():
        if value is None:
            continue
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, str):
            text = '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
        elif isinstance(value, list):
            text = "[" + ", ".join(f'"{v}"' if isinstance(v, str) else str(v)
                                   for v in value) + "]"
        else:
            text = repr(value)
        lines.append(f"{key} = {text}")
    return "\n".join(lines) + "\n"
