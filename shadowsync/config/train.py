"""`TrainConfig`: every option of a training run, as one typed section per part of the job.

`cfg.sync.mode`, `cfg.cluster.trainers`, `cfg.optim.lr`: a builder is handed the section it
needs. Where users write options flat (the command line, `shadowsync.train(trainers=2,
sync="s-bmuf")`, a flat TOML file, `dataclasses.replace(cfg, trainers=2)`), each flat name
is its long option's name with underscores and is routed to its section (`FLAT`).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
from dataclasses import dataclass, field
from typing import NamedTuple, NoReturn

from shadowsync.by_value import portable
from shadowsync.config.plain import model_name, plain, toml_value
from shadowsync.config.sections import (
    SECTIONS,
    VALIDATED_AVERAGE_FROM,
    CheckpointConfig,
    ClusterConfig,
    DataConfig,
    ModelConfig,
    OptimConfig,
    OutputConfig,
    SwitchConfig,
    SyncConfig,
    TestingConfig,
    choices_of,
    opt,
)
from shadowsync.errors import UserError
from shadowsync.spec.interval import SyncInterval
from shadowsync.spec.modes import MODES, SYNC_CHOICES, SyncMode, mode_of
from shadowsync.spec.straggler import Straggler
from shadowsync.spec.sync_rules import rule_kind
from shadowsync.spec.table_budget import LRU
from shadowsync.spec.tasks import DEFAULT_TASK, TASK_CHOICES, TASK_HELP, TASK_KINDS

# Options that belong to the whole job rather than to one section.
TOP_LEVEL = ("task", "seed")

# What --val-share sets where the options leave it open (`TrainConfig.adapted`): validations
# an epoch, epochs of them without improvement before stopping. Without --val-share: the
# evaluations a run plots.
VALIDATIONS_PER_EPOCH = 4
PATIENCE_EPOCHS = 3
PLOT_EVALUATIONS = 8
# Examples per worker step where --batch-size is left open; with --val-share, divided among
# the trainers (`validated_batch_size`).
BATCH_SIZE = 256
# Background rounds on data validated on (--val-share): once each worker has taken this many
# steps since the last round began. A round paced by time comes every fewer steps on a busy or
# slow machine; counted in steps, the rounds fall at the same points of training everywhere.
# On MovieLens 100K 20 steps is where the CPU budget's pace lands on an idle machine
# (docs/real-data.md).
VALIDATED_SYNC_STEPS = 20
# The dense learning rate and where its decay ends (a share of the rates), where --lr and
# --lr-decay-floor are left open; with --val-share, half the rate and a lower floor. A job
# validated on makes several passes over the same rows, and at the start of each new pass the
# validation NE rises and falls back within the pass, higher with every pass: the top MLP
# fitting rows it has seen before (Zhang et al., "Towards Understanding the Overfitting
# Phenomenon of Deep Click-Through Rate Prediction Models", CIKM 2022, who find a fast
# optimizer at a large rate a cause). A smaller dense rate slows that fit, and a lower floor
# lets the decay that starts at the first plateau take the rates further down before the run
# stops. On MovieLens 100K (the default job, the variants run one after the other for each
# seed) the floor at 0.1 raised eval AUC on 18 of 24 seeds (+0.0009 on average) and the rate
# at 0.025 on 14 of 18 (+0.0015); on the census and clothing sets both were within their
# seeds' spread (docs/real-data.md).
LR = 0.05
DECAY_FLOOR = 0.3
VALIDATED_LR = 0.025
VALIDATED_DECAY_FLOOR = 0.1
# With --val-share, L2 on the single ids' rows a batch reads (fixed tables): the over-fitting
# at each new pass comes also from rows fitting the few examples of their id. Chosen on the
# tuning split (the default job, seeds 0-7 or 0-3, eval AUC means): on MovieLens 100K every
# row decayed at 1e-3 gave 0.7898 against 0.7876 (7 of 8 seeds higher), 1e-2 0.7881, 3e-2
# 0.7825, the single ids' rows alone 0.7883; on the clothing reviews decaying the words' rows
# too took 0.9426 to 0.9347, the single ids' alone gave 0.9433; census 0.9291 against 0.9289.
# Dynamic tables keep every feature in one pool, so they are left at 0 (docs/real-data.md).
VALIDATED_EMBEDDING_DECAY = 1e-3


def validated_batch_size(trainers: int) -> int:
    """Examples per worker step on data validated on (--val-share): BATCH_SIZE / N for N
    trainers (rounded down), so each trainer's dense model takes as many steps an epoch as
    one trainer's at BATCH_SIZE.

    A small real set is a few hundred steps an epoch, and the run stops after a few epochs:
    with N trainers at BATCH_SIZE each replica takes 1/N of one trainer's steps, and the
    averaged model lands where one trainer at N x BATCH_SIZE would. On the clothing reviews
    one local trainer at batch 512 gave eval AUC 0.933 (3 seeds, median) against 0.936 at
    256 and 128, and the 2-trainer default job 0.9336 at 256 against 0.9353 at 128 (8 seeds,
    medians; 6 of 8 seeds higher); on MovieLens 100K 0.7844 against 0.7856 (5 seeds)
    (docs/real-data.md)."""
    return max(1, BATCH_SIZE // trainers)


def validated_block_momentum(trainers: int) -> float:
    """BMUF's block momentum on data validated on (--val-share): eta = 1 - 1/(2N) for N
    trainers, where the rule's own default (Chen and Huo, ICASSP 2016) is 1 - 1/N.

    A block's update, the mean of the N replicas' steps, moves the global model about 1/N
    of the way one replica would; block momentum eta carries each update on, 1/(1 - eta)
    times in all, so eta = 1 - 1/N makes up exactly that 1/N and 1 - 1/(2N) makes it up
    twice. On the real sets of `bench realdata` (2 trainers), where the run stops early
    after a few epochs, eta = 0.75 raised the default job's eval AUC above eta = 0.5 on the
    clothing reviews and MovieLens 100K and left the census set's where it was; 0.875 was
    no better than 0.75 (docs/real-data.md)."""
    return 1.0 - 1.0 / (2 * trainers)


def averaged_rate_factor(mode: SyncMode, optimizer: str, trainers: int) -> float:
    """What the dense rate left open is multiplied by: sqrt(N) for N Adagrad replicas that a
    rule averages without block momentum (s-ma, s-easgd, fr-ma, fr-easgd), else 1.

    Adagrad divides each step by the root of the squared gradients it has summed. Under DDP
    those are the N trainers' mean gradients, whose noise has 1/N of the variance; a replica
    that is only averaged now and then sums the squares of its own. Where the noise dominates
    the gradient, each replica's steps are then 1/sqrt(N) of DDP's at the same rate, and so is
    their average's progress. BMUF's block momentum (eta = 1 - 1/N) carries each block's
    update on N times in all, which more than makes that up; model and elastic averaging have
    nothing that does. On `bench short`'s 2-trainer job (211 steps a worker) s-ma ended at eval
    NE 0.739-0.744 with a round every 1 to 20 steps where DDP ended at 0.7125, and with the rate
    x sqrt(2) within 0.001-0.004 of DDP (medians of 10); with plain SGD, which has no such sum,
    s-ma and DDP ended level (0.9343 and 0.9345 at --optimizer sgd --lr 1)."""
    unfiltered = mode.rule is not None and rule_kind(mode.rule).raises_adagrad_rate
    return trainers ** 0.5 if optimizer == "adagrad" and unfiltered else 1.0


def open_dense_rate(validating: bool, sync: SyncConfig, optimizer: str, trainers: int) -> float:
    """The dense rate where --lr is left open: LR (VALIDATED_LR with --val-share), times
    `averaged_rate_factor` (not under --sync-groups, whose rules share one rate, nor for a
    --sync that is not a mode, which validation then reports)."""
    rate = VALIDATED_LR if validating else LR
    if sync.groups or sync.mode not in SYNC_CHOICES:
        return rate
    return rate * averaged_rate_factor(sync.entry, optimizer, trainers)


def flag_name(f: dataclasses.Field) -> str:
    """A field's long option with underscores (`sync_every` for `SyncConfig.every`)."""
    return f.metadata.get("flag") or f.name


def _flat_names() -> dict[str, tuple[str | None, str]]:
    """flat option name -> (section, field); section None: a top-level field."""
    names: dict[str, tuple[str | None, str]] = {name: (None, name) for name in TOP_LEVEL}
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            names[flag_name(f)] = (section, f.name)
    return names


# What a checkpoint's record of the options leaves out: a later run sets them anew.
NOT_RECORDED = ("port", "resume")


class RunRecord(NamedTuple):
    """What a run records of its options: `toml`, each checkpoint's configuration (what
    `--config` reads back, without `NOT_RECORDED`), and `options`, summary.json's by flat
    name."""

    toml: str
    options: dict[str, object]


@dataclass(init=False)
class TrainConfig:
    """Every option of a training run: the task and seed, and one section each for data,
    model, optim, cluster, sync, switch, checkpoint, output and testing. Values are checked
    when the object is made: a bad one raises `shadowsync.errors.UserError` naming the
    command-line option. The options, their defaults and their help texts are listed in the
    CLI reference (`shadowsync train --help`).

    Made from sections (`TrainConfig(sync=SyncConfig(mode="s-ma"))`), from flat option
    names (`TrainConfig(trainers=2, sync="s-ma")`, also `TrainConfig.from_flat`), or both;
    flat names win over the sections given. `dataclasses.replace(cfg, trainers=4)` copies
    with flat changes."""

    task: str = opt(DEFAULT_TASK, TASK_HELP, choices=TASK_CHOICES)
    seed: int = opt(0, "random seed (data generation, initialisation, shuffling)", group="data")
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    switch: SwitchConfig = field(default_factory=SwitchConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    testing: TestingConfig = field(default_factory=TestingConfig)
    # dataclasses.replace(cfg, data="x.tsv") hands __init__ every field it leaves alone, but
    # not the section that the flat option of the same name (--data, --model, --sync) lives
    # in: `_base` (read as the sections as they are) hands it over, so only the option changes.
    _base: dict[str, object] | None = field(default=None, repr=False, compare=False)

    def __init__(self, **options: object) -> None:
        base = options.pop("_base", None) or {}
        for name in TOP_LEVEL:
            setattr(self, name, options.pop(name, _FIELDS[name].default))
        for name, cls in SECTIONS.items():
            given = options.pop(name, None)
            if isinstance(given, cls):
                setattr(self, name, dataclasses.replace(given))  # a copy: flat changes below
            else:
                was = base.get(name)
                setattr(self, name, dataclasses.replace(was) if was is not None else cls())
                if given is not None:  # the flat option of the same name (--data, --model)
                    options[name] = given
        for key, value in options.items():
            if key not in FLAT:
                raise TypeError(f"TrainConfig: {unknown_option(key, set(FLAT))}")
            self._set_flat(key, value)
        self.model.normalise()
        self.data.normalise()
        self.cluster.normalise()
        self._reopen_copied_rate(base, options)
        if self.data.val_share == 0:
            # known now: code that reads the synthetic job's config before `adapted` sees it
            for key, value in self._left_open(validating=False).items():
                self._set_flat(key, value)
        self._parse_values()
        self.validate()

    def _reopen_copied_rate(self, base: dict[str, object], options: dict[str, object]) -> None:
        """A copy (`dataclasses.replace`) that keeps the original's dense rate where that rate
        was the original's open default gets its own open default instead: `replace(cfg,
        sync="s-ma")` is then the config `TrainConfig(sync="s-ma")` is."""
        was = base.get("optim")
        if not isinstance(was, OptimConfig) or "lr" in options or self.optim.lr != was.lr:
            return
        sync, cluster, data = base["sync"], base["cluster"], base["data"]
        assert isinstance(sync, SyncConfig) and isinstance(cluster, ClusterConfig)
        if (self.data.val_share == 0 and getattr(data, "val_share", 0) == 0
                and was.lr == open_dense_rate(False, sync, was.optimizer, cluster.trainers)):
            self.optim.lr = None

    @classmethod
    def from_flat(cls, **options: object) -> TrainConfig:
        """A config from flat option names (`trainers=2, sync="s-ma", sync_every=20`)."""
        return cls(**options)

    def __getattr__(self, name: str) -> NoReturn:
        # Only reached for a missing attribute: say where a flat option went.
        if name in FLAT and FLAT[name][0] is not None:
            section, field_name = FLAT[name]
            raise AttributeError(f"TrainConfig has no attribute {name!r}: it is "
                                 f"cfg.{section}.{field_name}")
        raise AttributeError(f"TrainConfig has no attribute {name!r}")

    def _set_flat(self, key: str, value: object) -> None:
        section, name = FLAT[key]
        setattr(self if section is None else getattr(self, section), name, value)

    def _left_open(self, validating: bool) -> dict[str, object]:
        """What `adapted` fills in for the options left open (None) that the synthetic job
        knows from the start (its batch, its pace and its rates), by flat name."""
        lr = open_dense_rate(validating, self.sync, self.optim.optimizer, self.cluster.trainers)
        floor = VALIDATED_DECAY_FLOOR if validating else DECAY_FLOOR
        defaults = {
            "batch_size": (validated_batch_size(self.cluster.trainers) if validating
                           else BATCH_SIZE),
            "sync_interval": (SyncInterval(None, steps=VALIDATED_SYNC_STEPS) if validating
                              else SyncInterval(None, "auto")),
            "lr": lr, "lr_decay_floor": floor,
            "embedding_weight_decay": (VALIDATED_EMBEDDING_DECAY if validating
                                       and not self.model.table_kind.maps_ids else 0.0)}
        given = self.flat()
        return {key: value for key, value in defaults.items() if given[key] is None}

    def flat(self) -> dict[str, object]:
        """Every option by its flat name, in --help order."""
        return {key: getattr(self if section is None else getattr(self, section), name)
                for key, (section, name) in FLAT.items()}

    def _parse_values(self) -> None:
        """Every option written as text becomes its typed value (`shadowsync.spec`), here and
        only here, so a mistake is one line before any process starts. A value already typed
        is kept, except the straggler: which trainers it slows depends on --trainers, so it
        is read again from its text."""
        for name in SECTIONS:
            section = getattr(self, name)
            for f in dataclasses.fields(section):
                spec, value = f.metadata.get("spec"), getattr(section, f.name)
                if spec is None or value is None:
                    continue
                if spec is Straggler:
                    value = Straggler.parse(str(value), self.cluster.trainers)
                elif isinstance(value, list):
                    value = [v if isinstance(v, spec) else spec.parse(str(v)) for v in value]
                elif not isinstance(value, spec):
                    value = spec.parse(str(value))
                setattr(section, f.name, value)

    def adapted(self) -> TrainConfig:
        """A copy with the options left open (None) filled in. With --val-share (data that
        is validated on, so a real data set rather than the generated one): VALIDATIONS_PER_EPOCH
        validations an epoch, stopping after PATIENCE_EPOCHS epochs of them without improvement
        where the --sync can stop early, the learning-rate decay starting at the first
        validation without improvement, and the DLRM's top MLP seeing the embeddings beside
        their dot products (DeepFM's deep part), and BMUF's block momentum at
        `validated_block_momentum`, each worker step's batch at `validated_batch_size`, the
        dense rate at VALIDATED_LR and the decay's floor at VALIDATED_DECAY_FLOOR, the
        single ids' rows of fixed tables decayed by VALIDATED_EMBEDDING_DECAY, and
        background rounds every VALIDATED_SYNC_STEPS worker steps. Without it, the synthetic
        job's settings: 8 evaluations for the plot, no stopping, the decay at the run's end
        down to DECAY_FLOOR, dot products only, the dense rate LR, BATCH_SIZE examples a step,
        rounds paced by the CPU budget. --buckets: VALIDATED_BUCKETS quantile buckets of each
        dense column of real data with --val-share, none without."""
        validating = self.data.val_share > 0
        can_stop = validating and not self.sync.entry.protocols
        points = self.output.eval_points
        if points is None:
            points = VALIDATIONS_PER_EPOCH if validating else PLOT_EVALUATIONS
        early_stop = self.data.early_stop
        if early_stop is None:
            early_stop = PATIENCE_EPOCHS * max(1, points) if can_stop else 0
        average_from = self.data.weight_average_from
        if average_from is None:
            average_from = (VALIDATED_AVERAGE_FROM
                            if validating and self._why_no_average() is None else 0)
        on_plateau = self.optim.lr_decay_on_plateau
        block_momentum = self.sync.block_momentum
        if block_momentum is None and validating:
            block_momentum = validated_block_momentum(self.cluster.trainers)
        return dataclasses.replace(
            self, eval_points=points, early_stop=early_stop, weight_average_from=average_from,
            lr_decay_on_plateau=validating if on_plateau is None else on_plateau,
            interaction=self.model.interaction_for(validating), block_momentum=block_momentum,
            buckets=self.data.quantile_buckets(), **self._left_open(validating))

    def validate(self) -> TrainConfig:
        if self.task not in TASK_CHOICES:
            raise UserError(f"--task: {self.task!r} is not one of {', '.join(TASK_CHOICES)}")
        for name in SECTIONS:
            section = getattr(self, name)
            if hasattr(section, "check"):
                section.check()
        self._check_choices()
        self._check_model()
        if self.output.tensorboard and importlib.util.find_spec("tensorboard") is None:
            raise UserError("--tensorboard needs the tensorboard package: "
                            "pip install 'shadowsync[tensorboard]'")
        self._check_validation()
        self._check_specs()
        self._check_dynamic_tables()
        return self

    def _check_dynamic_tables(self) -> None:
        m = self.model
        if not m.table_kind.maps_ids:
            changed = [flag for flag, v, default in (
                ("--admit-after", m.admit_after, 1), ("--evict", m.evict, LRU),
                ("--table-memory", m.table_memory, None)) if v != default]
            if changed:
                raise UserError(f"{changed[0]} applies to dynamic tables: add --tables dynamic")
        elif self.cluster.embedding_transport == "unshared":
            raise UserError("--tables dynamic: --embedding-transport unshared is not supported "
                            "(each trainer's private copy would map ids apart)")
        elif self.cluster.prefetch not in ("auto", "0"):
            raise UserError(f"--prefetch {self.cluster.prefetch}: not with --tables dynamic (a "
                            "batch's rows are resolved by a blocking round trip that must "
                            "hold them until its gradients land); use --prefetch 0 or auto")

    def _check_choices(self) -> None:
        for section in SECTIONS:
            obj = getattr(self, section)
            for f in dataclasses.fields(obj):
                value = getattr(obj, f.name)
                if value is None and f.default is None:  # an option left out
                    continue
                choices = choices_of(type(obj), f)
                if choices and value not in choices:
                    raise UserError(f"--{flag_name(f).replace('_', '-')}: {value!r} is not "
                                    f"one of {', '.join(choices)}")

    def _check_validation(self) -> None:
        # Workers that push each step to the dense servers stop when the servers say so.
        if self.data.early_stop and self.sync.entry.protocols:
            raise UserError(f"--early-stop: --sync {self.sync.mode} cannot stop its workers "
                            "early; use epochs, or another --sync")
        if self.data.val_share > 0:
            if not TASK_KINDS[self.task].validates:
                validating = [t.name for t in TASK_KINDS.values() if t.validates]
                raise UserError(f"--val-share needs --task {' or '.join(validating)}")
            if self.checkpoint.every.never:
                raise UserError("--val-share keeps the best model as a checkpoint: not with "
                                "--checkpoint-every never")
        if self.data.weight_average_from and (why := self._why_no_average()):
            raise UserError(f"--weight-average-from: {why}; use 0")

    def _why_no_average(self) -> str | None:
        """Why this job cannot average its model (None: it can). The average is of what a
        checkpoint's model is read from: a trainer's dense model and rows that stay one id's
        from epoch to epoch."""
        if self.sync.entry.protocols:
            return (f"--sync {self.sync.mode} trains the dense model on its dense servers, "
                    "which keep no average")
        if self.model.table_kind.maps_ids:
            return ("dynamic tables give a row to another id over time, so their rows are not "
                    "averaged")
        return None

    def _check_specs(self) -> None:
        """The typed options (`_parse_values`) against the mode they run under."""
        mode = self.sync.entry
        straggler = self.testing.straggler
        if straggler is not None and straggler.slows.delays_pushes and not mode.protocols:
            raise UserError(f"--straggler kind={straggler.kind} delays pushes to the dense "
                            "servers: it needs --sync bsp, asp or switch")
        if self.sync.straggler_fallback is not None and (not mode.can_fall_back
                                                         or self.sync.groups):
            able = " or ".join(m.name for m in MODES.values() if m.can_fall_back)
            raise UserError(f"--straggler-fallback needs --sync {able} (every trainer needed "
                            "at each round) and no --sync-groups")
        self._check_groups(mode)
        at = self.switch.at
        if mode.can_switch and at is not None and at.auto and not self.switch.job_name:
            raise UserError("--switch-at auto needs --job-name (the name `shadowsync switch "
                            "search` stored its result under)")

    def _check_groups(self, mode: SyncMode) -> None:
        families = {mode_of(m).family for m in [*(g.mode for g in self.sync.groups), mode.name]
                    if mode_of(m).rule is not None}
        if len(families) > 1:
            raise UserError("--sync-groups: all groups must be background (s-*) or all "
                            "foreground (fr-*) in one run")
        if self.sync.groups and mode.rule is None and mode.synchronizes:
            raise UserError(f"--sync-groups cannot be combined with --sync {mode.name}")

    def _check_model(self) -> None:
        if not callable(self.model.name):
            return
        # Every process builds the model, so the factory travels to them by pickle: by name
        # where they can import it, else by value (a notebook's or a script's __main__, a
        # function defined inside another).
        self.model.name = portable(self.model.name)

    def to_dict(self) -> dict[str, object]:
        """The options as plain data by flat name (JSON and TOML can hold every value)."""
        values = {k: plain(v) for k, v in self.flat().items()}
        values["model"] = model_name(values["model"])
        return values

    def recorded(self) -> RunRecord:
        """What the run records of these options (`RunRecord`)."""
        return RunRecord(self.to_toml(leave_out=NOT_RECORDED), self.to_dict())

    def to_toml(self, leave_out: tuple[str, ...] = ()) -> str:
        """A TOML file, one table per section, that `--config` reads back into the same
        configuration; the options named in `leave_out` (flat names) as if never given."""
        lines = [f"{name} = {toml_value(getattr(self, name))}" for name in ("task", "seed")]
        for section in SECTIONS:
            obj = getattr(self, section)
            values = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)
                      if flag_name(f) not in leave_out}
            if section == "model":
                values["name"] = model_name(values["name"])
            set_values = [f"{k} = {toml_value(v)}" for k, v in values.items() if v is not None]
            if set_values:
                lines += ["", f"[{section}]", *set_values]
        return "\n".join(lines) + "\n"

    @property
    def distributed(self) -> bool:
        """A job of several processes (servers and/or several trainers)."""
        return (self.cluster.trainers > 1 or self.cluster.embedding_servers > 0
                or self.sync.entry.builder is not None or bool(self.sync.groups))


TrainConfig._base = property(  # type: ignore[assignment]
    lambda self: {name: getattr(self, name) for name in SECTIONS})
FLAT: dict[str, tuple[str | None, str]] = _flat_names()
_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}


def unknown_option(key: str, names: set[str]) -> str:
    """"unknown option 'wokers'; did you mean 'workers'?" """
    close = difflib.get_close_matches(key.replace("-", "_"), sorted(names), n=1)
    return f"unknown option '{key}'" + (f"; did you mean '{close[0]}'?" if close else "")
