"""The sections of a run's configuration, one dataclass per part of the job it configures.

Each builder takes the section it needs (the data builders a `DataConfig`, the model builder
a `ModelConfig`, the checkpoint store a `CheckpointConfig`...). A field keeps the name of its
long command-line option where that does not repeat the section (`--embedding-servers` is
`cluster.embedding_servers`) and says its option in metadata where it does (`--sync-every` is
`sync.every`, `--data` is `data.path`): the command line and flat TOML keys use the option's
name, `[section]` tables in a TOML file the field's.

An option written in a small language of its own (`--checkpoint-every 600s`, `--switch-plan
bsp:0.1,asp`) is a typed value of `shadowsync.spec` on its section (`checkpoint.every` is a
`CheckpointEvery`), parsed once when the configuration is made (`parse_values`); builders read
the value, never the text.

A section checks the values that only concern it (`check`); checks across sections are
`TrainConfig.validate`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import Field, dataclass, field
from functools import cache, cached_property
from typing import Literal, TypeVar, get_args, get_origin, get_type_hints

from shadowsync.errors import UserError
from shadowsync.spec.detector import DetectorConfig
from shadowsync.spec.groups import GroupRule
from shadowsync.spec.interval import CheckpointEvery, SyncInterval
from shadowsync.spec.modes import SYNC_CHOICES, ModeName, SyncMode, mode_of
from shadowsync.spec.plan import SwitchPlan
from shadowsync.spec.share import BspShare
from shadowsync.spec.straggler import Straggler
from shadowsync.spec.switch_policies import DEFAULT_POLICY, POLICY_CHOICES, POLICY_HELP
from shadowsync.spec.table_budget import Eviction, TableMemory
from shadowsync.spec.table_kinds import (
    DEFAULT_TABLES,
    TABLE_CHOICES,
    TABLE_KINDS,
    TABLES_HELP,
    TableKind,
)

TESTING = "testing (fault injection and benchmark knobs)"  # shadowsync.train.tasks.TASKS
DLRM = "dlrm"  # the built-in dense model's name for --model (shadowsync.models.build)


T = TypeVar("T")
# Quantile buckets of each dense column where --buckets is left open and --val-share is on
# (as `data prepare --buckets` writes by default).
VALIDATED_BUCKETS = 128
# The epoch from whose end on a --val-share job averages its epoch ends where
# --weight-average-from is left open (chosen on MovieLens 100K's tuning split, where the best
# single model comes at the end of epoch 4 to 6: from epoch 3 on beat from epoch 2 on, for the
# 2-trainer job and one local trainer alike, and from epoch 1 on took in a model still far
# from the best).
VALIDATED_AVERAGE_FROM = 3


def opt(default: T, help: str, flag: str | None = None, choices: tuple[str, ...] | None = None,
        parse: Callable[[str], object] | None = None, group: str | None = None,
        spec: type | None = None) -> T:
    """A field of a section. `flag`: its long option's name with underscores where it is not
    the field's (`sync_every` for `sync.every`). `choices`: where the type is not a Literal
    that lists them. `parse`: how the command line's one word becomes the value (default: the
    field's type). `group`: the --help topic where it is not its section's. `spec`: the
    option value type of `shadowsync.spec` the text is parsed into (once, `parse_values`);
    a text default is parsed here."""
    if spec is not None and isinstance(default, str):
        default = spec.parse(default)
    meta = {"help": help, "flag": flag, "choices": choices, "parse": parse, "group": group,
            "spec": spec}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


@cache
def type_hints(cls: type) -> dict[str, object]:
    return get_type_hints(cls)


def choices_of(cls: type, f: Field) -> tuple[str, ...] | None:
    """The values field `f` of dataclass `cls` accepts: its metadata's, or its Literal's."""
    if f.metadata.get("choices"):
        return f.metadata["choices"]
    tp = type_hints(cls)[f.name]
    for option in (tp, *get_args(tp)):
        if get_origin(option) is Literal:
            return get_args(option)
    return None


def parse_sizes(text: str) -> list[int]:
    """'100000' or '1000,50000,...' -> [int, ...] (argparse reports a ValueError as bad input)."""
    return [int(v) for v in text.split(",")]


def _positive(value: float, flag: str) -> None:
    if value <= 0:
        raise UserError(f"--{flag} must be positive, got {value}")


def _in_unit(value: float, flag: str) -> None:
    if not 0 <= value <= 1:
        raise UserError(f"--{flag} must be in [0, 1], got {value}")


def _non_negative_number(value: float, flag: str) -> None:
    if not 0 <= value < float("inf"):
        raise UserError(f"--{flag} must be a number >= 0, got {value}")


@dataclass
class DataConfig:
    """What the job trains on and how many passes it makes."""

    path: str = opt("synthetic",
                    "training data: 'synthetic', a Criteo TSV file, .gz or directory, or a "
                    "directory of labels.npy, dense.npy, cats.npy", flag="data")
    schema: str | None = opt(
        None, "a TOML file naming the label, dense, categorical and multi-hot columns of "
        "Parquet or CSV --data / --eval-data (converted once into a cache; table sizes come "
        "from it; see docs/real-data.md)")
    eval_data: str | None = opt(None, "held-out data (default: the last 10% of --data)")
    examples: int | None = opt(
        None, "training examples of one pass (default: 1.5M synthetic, or all of --data; "
        "more than the data holds is an error: use --epochs)"
    )
    epochs: int = opt(1, "passes over the training rows; with more than one, each pass reads "
                      "them in a new order drawn from --seed")
    val_share: float = opt(
        0.0, "share of the training rows held out at their end for validation: evaluated at "
        "each epoch's end and --eval-points times within, the best model kept as "
        "OUT/checkpoint/best (what eval uses) and reported in the summary (0: off). It also "
        "changes the defaults of --eval-points (4 an epoch), --early-stop (3 epochs' worth), "
        "--lr-decay-on-plateau (on), --interaction (dot+cat), --block-momentum "
        "(1 - 1/(2 x trainers)), --batch-size (256 / trainers), --lr (0.025), --lr-decay-floor "
        "(0.1), --embedding-weight-decay (1e-3, fixed tables), --sync-interval (20steps) and "
        "--weight-average-from (3)")
    early_stop: int | None = opt(
        None, "with --val-share: stop after this many validations without improvement "
        "(default: 3 epochs' worth of --eval-points under --val-share, where the --sync can "
        "stop early; 0: train every epoch)")
    weight_average_from: int | None = opt(
        None, "with --val-share: from the end of this epoch on, each epoch's end model is also "
        "folded into a running average of them (stochastic weight averaging), validated in "
        "its turn and kept as the best model where it validates better (default: "
        f"{VALIDATED_AVERAGE_FROM} with --val-share and fixed tables, but not under --sync bsp / "
        "asp / switch, whose dense servers train the model; 0: no average)")
    skip_bad_lines: bool = opt(False, "skip malformed data lines and count them")
    buckets: int | None = opt(
        None, "array directories, Parquet and CSV: each dense column also becomes a "
        "categorical feature NAME_quantile, the bucket of its value among up to this many "
        "quantile buckets whose edges come from the training rows alone (not the validation "
        "or eval rows) and stay with the run: eval, shadowsync.load and the exported model "
        "cut at them. A column the schema bucketizes already keeps its own (default: "
        f"{VALIDATED_BUCKETS} with --val-share, else 0: none)")
    no_buckets: list[str] = opt(
        [], "dense columns left without quantile buckets (a schema or features.json says "
        "the same with no_buckets = [...])")

    def normalise(self) -> None:
        """Accept what a Python caller naturally writes: no_buckets="age,fnlwgt"."""
        if isinstance(self.no_buckets, str):
            self.no_buckets = [v for v in self.no_buckets.split(",") if v]

    def quantile_buckets(self) -> int:
        """--buckets, or where it is left open VALIDATED_BUCKETS with --val-share, else 0."""
        if self.buckets is not None:
            return self.buckets
        return VALIDATED_BUCKETS if self.val_share > 0 else 0

    def check(self) -> None:
        if self.buckets is not None and (self.buckets < 0 or self.buckets == 1):
            raise UserError(f"--buckets must be 0 (none) or at least 2, got {self.buckets}")
        if self.examples is not None and self.examples <= 0:
            raise UserError(f"--examples must be positive, got {self.examples}")
        if self.epochs < 1:
            raise UserError(f"--epochs must be positive, got {self.epochs}")
        if not 0 <= self.val_share < 1:
            raise UserError(f"--val-share must be in [0, 1), got {self.val_share}")
        if self.early_stop:
            if self.early_stop < 0:
                raise UserError(f"--early-stop must be >= 0, got {self.early_stop}")
            if self.val_share <= 0:
                raise UserError("--early-stop needs --val-share (the rows it validates on)")
        if self.weight_average_from:
            if self.weight_average_from < 0:
                raise UserError("--weight-average-from must be >= 0, got "
                                f"{self.weight_average_from}")
            if self.val_share <= 0:
                raise UserError("--weight-average-from needs --val-share (the rows that "
                                "choose between the average and the model)")


@dataclass
class ModelConfig:
    """The dense model and the embedding tables' shape."""

    name: str | Callable[..., object] = opt(
        DLRM, "dense model: dlrm, or MODULE:FUNCTION called with (num_dense, num_tables, "
        "embedding_dim) that returns an nn.Module; forward(dense, emb) -> logits [B]",
        flag="model")
    embedding_dim: int = opt(16, "embedding and bottom-MLP output width")
    table_size: list[int] = opt(
        [100_000], "rows per embedding table, one size for all or a comma list of one per table "
        "(ids are taken modulo it)", parse=parse_sizes)
    tables: str = opt(DEFAULT_TABLES, TABLES_HELP, choices=TABLE_CHOICES)
    admit_after: int = opt(1, "dynamic tables: sightings before an id gets a row (until then "
                           "it reads zeros and its gradient is dropped)")
    evict: Eviction = opt("lru", "dynamic tables: when full, free the least recently used rows "
                          "(lru), and with ttl:N also rows unused for N examples", spec=Eviction)
    table_memory: TableMemory | None = opt(
        None, "dynamic tables: the job's table budget in bytes (e.g. 2GiB, 500MB), rows, "
        "optimizer state and id maps together, in place of --table-size rows per table",
        spec=TableMemory)
    bottom_mlp: list[int] = opt([64], "hidden widths of the bottom MLP")
    top_mlp: list[int] = opt([128, 64], "hidden widths of the top MLP")
    id_bias: bool = opt(
        True, "dlrm: a learned bias per id, added to the logit (one more column in each "
        "embedding row)")
    interaction: Literal["dot", "dot+cat"] | None = opt(
        None, "dlrm: what the top MLP sees besides the bottom MLP's output: the pairwise dot "
        "products of the feature vectors (dot), or those and every embedding vector "
        "(dot+cat, the deep part of DeepFM and Wide & Deep: better on small real data, "
        "a larger top MLP on many tables) (default: dot+cat with --val-share, else dot)")

    def normalise(self) -> None:
        """Accept what a Python caller naturally writes: table_size=50_000 or "1000,2000"."""
        if isinstance(self.table_size, int) and not isinstance(self.table_size, bool):
            self.table_size = [self.table_size]
        elif isinstance(self.table_size, str):
            try:
                self.table_size = parse_sizes(self.table_size)
            except ValueError:
                raise UserError(f"--table-size: {self.table_size!r} is not a size or a comma "
                                "list of sizes") from None

    def check(self) -> None:
        _positive(self.embedding_dim, "embedding-dim")
        if not self.table_size or any(v <= 0 for v in self.table_size):
            raise UserError(f"--table-size: sizes must be positive, got {self.table_size}")
        if self.admit_after < 1:
            raise UserError(f"--admit-after must be >= 1, got {self.admit_after}")

    @property
    def table_kind(self) -> TableKind:
        """--tables' entry (the choice is checked when the configuration is made)."""
        return TABLE_KINDS[self.tables]

    def interaction_for(self, validating: bool) -> str:
        """--interaction as given, else what the data calls for: dot+cat on data validated on
        (--val-share), dot on the synthetic job's."""
        return self.interaction or ("dot+cat" if validating else "dot")

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
        return self.embedding_dim + (1 if self.id_bias and self.name == DLRM else 0)


@dataclass
class OptimConfig:
    """How the dense parameters and the embeddings learn."""

    optimizer: Literal["adagrad", "sgd"] = opt(
        "adagrad", "optimizer (row-wise Adagrad for embeddings)")
    lr: float | None = opt(
        None, "learning rate of the dense parameters (default: 0.05; 0.025 with --val-share; "
        "either x sqrt(trainers) under s-ma, s-easgd, fr-ma and fr-easgd with adagrad)")
    embedding_lr: float = opt(0.2, "learning rate of the embeddings")
    embedding_initial_accumulator: float = opt(
        0.05, "where the Adagrad accumulator of a single-id feature's embedding rows starts "
        "(0: at zero, as torch does): above zero, a rare id's first steps are shrunk instead "
        "of a full --embedding-lr")
    multi_hot_initial_accumulator: float = opt(
        0.0, "where the Adagrad accumulator of a multi-hot feature's embedding rows starts "
        "(dynamic tables: every row starts at --embedding-initial-accumulator)")
    embedding_weight_decay: float | None = opt(
        None, "L2 weight decay on the single-id features' embedding rows a batch reads (W x "
        "row added to their gradient, inside row-wise Adagrad; dynamic tables: every row) "
        "(default: 0, off; 1e-3 with --val-share on fixed tables)")
    multi_hot_weight_decay: float = opt(
        0.0, "the same for a multi-hot feature's rows, whose gradients are shared out over "
        "their bag: a decay sized for single ids all but zeroes them (fixed tables; dynamic "
        "tables take --embedding-weight-decay)")
    warmup_steps: int = opt(
        300, "worker steps over which the dense learning rate rises linearly to --lr (0: off)")
    lr_decay_share: float = opt(
        0.3, "last share of each worker's pass over which the dense and embedding learning "
        "rates fall linearly to --lr-decay-floor of their value (0: off)")
    lr_decay_floor: float | None = opt(
        None, "where the decay ends, as a share of the learning rates (default: 0.3; 0.1 "
        "with --val-share)")
    lr_decay_on_plateau: bool | None = opt(
        None, "with --val-share: the decay starts at the first validation without "
        "improvement (and runs over --lr-decay-share of the run's steps from there) instead "
        "of at the end of the run (default: on with --val-share)")
    batch_size: int | None = opt(
        None, "examples per worker step (default: 256; with --val-share, 256 / --trainers "
        "rounded down, so that each trainer takes as many steps an epoch as one trainer would)")
    momentum: float = opt(
        0.9, "momentum of the servers' SGD under bsp / asp / switch (with --optimizer sgd)",
        group="synchronization")

    def check(self) -> None:
        if self.batch_size is not None:  # None: TrainConfig fills it (--val-share adapts it)
            _positive(self.batch_size, "batch-size")
        if self.warmup_steps < 0:
            raise UserError(f"--warmup-steps must be >= 0, got {self.warmup_steps}")
        if not 0 <= self.momentum < 1:
            raise UserError(f"--momentum must be in [0, 1), got {self.momentum}")
        for flag, v in (("lr", self.lr), ("embedding-lr", self.embedding_lr)):
            if v is not None and not v > 0:  # None: TrainConfig fills it (--val-share)
                raise UserError(f"--{flag} must be a positive number, got {v}")
        _in_unit(self.lr_decay_share, "lr-decay-share")
        if self.lr_decay_floor is not None:  # None: TrainConfig fills it (--val-share)
            _in_unit(self.lr_decay_floor, "lr-decay-floor")
        _non_negative_number(self.embedding_initial_accumulator,
                             "embedding-initial-accumulator")
        _non_negative_number(self.multi_hot_initial_accumulator,
                             "multi-hot-initial-accumulator")
        if self.embedding_weight_decay is not None:  # None: TrainConfig fills it
            _non_negative_number(self.embedding_weight_decay, "embedding-weight-decay")
        _non_negative_number(self.multi_hot_weight_decay, "multi-hot-weight-decay")

    def table_optimizer(self, multi_hot: Sequence[bool] = ()) -> dict[str, object]:
        """How every embedding table of the job learns, wherever it lives (a server, a
        trainer, a checkpoint being evaluated, a peer's tables). `multi_hot`: which tables
        are multi-hot features' (the data's `Features.multi_hot`); with any, the initial
        accumulator (`table_initial_accumulators`) and the weight decay are one value per
        table."""
        start: float | list[float] = self.embedding_initial_accumulator
        decay: float | list[float] = self.embedding_weight_decay or 0.0
        if any(multi_hot):
            start = self.table_initial_accumulators(multi_hot)
            decay = [self.multi_hot_weight_decay if bag else decay for bag in multi_hot]
        return {"optimizer": self.optimizer, "lr": self.embedding_lr,
                "initial_accumulator": start, "weight_decay": decay}

    def table_initial_accumulators(self, multi_hot: Sequence[bool]) -> list[float]:
        """Where each table's row-wise Adagrad accumulator starts: a0 =
        --embedding-initial-accumulator for a single-id feature's table,
        --multi-hot-initial-accumulator for a multi-hot feature's.

        A row's step is lr * g / sqrt(a0 + sum of its g^2): plain SGD at rate lr / sqrt(a0)
        until its squared gradients add up to a0. A single id's squared gradient per step is
        1e-8 to 1e-5 on the sets of `bench realdata`, so a0 = 0.05 keeps a rare id's few steps
        small, which held MovieLens 100K's eval AUC up (0.005 and 0 lowered it). A multi-hot
        id's gradient is also divided among the bag it is pooled with (a mean over 44 review
        words: squared gradients of 1e-10 to 1e-8), so from 0.05 its row all but never moves.
        From zero, Adagrad sizes its steps by its own gradients: on the clothing reviews
        (words) the default job's eval AUC rose from about 0.935 to 0.942 (6 seeds); on
        MovieLens (genres, 2 an example) it did not move."""
        return [self.multi_hot_initial_accumulator if bag else self.embedding_initial_accumulator
                for bag in multi_hot]


@dataclass
class ClusterConfig:
    """The job's processes and where they meet."""

    workers: int = opt(1, "Hogwild worker processes per trainer")
    trainers: int = opt(2, "trainers (data-parallel replicas of the dense model)")
    embedding_servers: int = opt(
        1, "embedding parameter servers (0: tables live in the single trainer)")
    dense_servers: int | None = opt(
        None, "dense parameter servers for the EASGD centre and bsp / asp / switch "
        "(default: 1 if the sync needs it)")
    row_split_limit: int = opt(1_000_000, "tables with more rows are split row-wise over servers")
    embedding_transport: Literal["auto", "rpc", "unshared"] = opt(
        "auto", "how trainers reach the embedding servers: auto (shared memory on the same "
        "host, RPC otherwise), rpc (always), unshared (a private local copy per trainer: the "
        "benchmark ceiling, not shared training)")
    prefetch: Literal["auto", "0", "1", "2"] = opt(
        "auto", "embedding rows a worker asks for this many steps ahead, to arrive while it "
        "computes (its gradients are sent without waiting); rows then miss the updates of at "
        "most that many of its own steps. auto: 1 where a trainer reaches a table shard over "
        "RPC, 0 (one blocking round trip a step) where it reads every shard through shared "
        "memory or the tables are dynamic")
    embedding_placement: Literal["first", "per-host"] = opt(
        "first", "where embedding servers run: first (ranks 0..E-1, so on the first host(s)) or "
        "per-host (every host runs the same roles, E/H embedding servers beside its T/H "
        "trainers, which reach their host's rows through shared memory and the rest over RPC)")
    addr: str = opt("127.0.0.1", "address the local cluster binds and meets on")
    port: int | None = opt(None, "rendezvous port of the local cluster (default: a free one)")
    rpc_port: int | None = opt(
        None, "RPC store port where the launcher does not share its store (default: its + 1)")

    def normalise(self) -> None:
        """prefetch=1 from a Python caller means --prefetch 1."""
        if isinstance(self.prefetch, int) and not isinstance(self.prefetch, bool):
            self.prefetch = str(self.prefetch)

    def check(self) -> None:
        for flag, v in (("workers", self.workers), ("trainers", self.trainers),
                        ("row-split-limit", self.row_split_limit)):
            _positive(v, flag)
        for flag, n in (("embedding-servers", self.embedding_servers),
                        ("dense-servers", self.dense_servers)):
            if n is not None and n < 0:
                raise UserError(f"--{flag} must be >= 0, got {n}")


@dataclass
class SyncConfig:
    """How trainers synchronize their dense parameters (ShadowSync's and the baselines')."""

    mode: ModeName = opt("s-bmuf", "how trainers synchronize their dense parameters",
                         flag="sync", choices=SYNC_CHOICES, spec=ModeName)
    groups: list[GroupRule] = opt(
        [], "per-group rules, e.g. bottom=s-easgd top=s-bmuf (the rest follows --sync)",
        flag="sync_groups", spec=GroupRule)
    interval: SyncInterval | None = opt(
        None, "when background rounds run: seconds between them (0: back to back), Nsteps "
        "(once each worker has taken N steps since the last one began), or auto (as often as "
        "--sync-budget allows, and a round at least every 1/40 of a worker's pass; the default, "
        "20steps with --val-share)",
        flag="sync_interval", spec=SyncInterval)
    budget: float = opt(0.01, "share of the trainer's cores the auto pace may spend",
                        flag="sync_budget")
    every: int = opt(50, "worker steps between foreground rounds", flag="sync_every")
    dtype: Literal["fp32", "bf16"] = opt(
        "fp32", "what background and foreground rounds send (bf16: half the bytes; the "
        "parameters stay fp32)", flag="sync_dtype")
    transport: Literal["auto", "collective"] = opt(
        "auto", "how a round's average travels: auto (through shared memory between trainers "
        "on one host, collectives otherwise), collective (always an AllReduce)",
        flag="sync_transport")
    write_back: Literal["delta", "overwrite"] = opt(
        "delta", "apply a round as (result - snapshot) or overwrite")
    block_momentum: float | None = opt(
        None, "BMUF block momentum eta (default 1 - 1/trainers; with --val-share "
        "1 - 1/(2 x trainers))")
    block_lr: float = opt(1.0, "BMUF block learning rate zeta")
    nesterov: bool = opt(False, "BMUF Nesterov look-ahead")
    elastic_alpha: float = opt(0.5, "EASGD elastic rate alpha")
    warmup_rounds: int = opt(
        20, "first rounds of a job over which BMUF's block momentum grows to its full value "
        "and EASGD averages the replicas, its centre at their average, before it pulls (0: "
        "the rules in full from the first round)", flag="sync_warmup_rounds")
    straggler_fallback: Literal["s-easgd"] | None = opt(
        None, "with --sync s-ma or s-bmuf: s-easgd rounds while the straggler detector "
        "(--switch-detector's k and m, over worker reports) sees a slow trainer, back when it "
        "clears")

    @cached_property
    def entry(self) -> SyncMode:
        """The mode's entry in the registry (`shadowsync.spec.modes`): what it needs and
        allows (dense servers, lockstep, resuming, switching...). Looked up once per section
        (the section travels to every process with it)."""
        return mode_of(self.mode)

    def __setattr__(self, name: str, value: object) -> None:
        if name == "mode":  # a new --sync: its entry is looked up again
            self.__dict__.pop("entry", None)
        super().__setattr__(name, value)

    def check(self) -> None:
        _positive(self.every, "sync-every")
        if not 0 < self.budget <= 1:
            raise UserError(f"--sync-budget must be in (0, 1], got {self.budget}")
        if not 0 < self.elastic_alpha <= 1:
            raise UserError(f"--elastic-alpha must be in (0, 1], got {self.elastic_alpha}")
        if self.warmup_rounds < 0:
            raise UserError(f"--sync-warmup-rounds must be 0 or more, got {self.warmup_rounds}")


@dataclass
class SwitchConfig:
    """Sync-Switch: when and how `--sync switch` moves between BSP and ASP."""

    plan: SwitchPlan = opt(
        "bsp:0.1,asp", "protocol phases of --sync switch: MODE:SHARE,... (last share: the rest)",
        flag="switch_plan", spec=SwitchPlan)
    momentum: Literal["keep", "zero", "ramp"] = opt(
        "keep", "momentum at a switch: keep it, zero it, or zero it and ramp it back",
        flag="switch_momentum")
    scale_lr: bool = opt(
        True, "ASP steps use --lr / (trainers x workers): BSP's global batch at --lr becomes "
        "one worker's batch at --lr / n", flag="switch_scale_lr")
    compensate_momentum: bool = opt(
        False, "ASP steps run at momentum max(0, m - (1 - 1/n)): asynchrony adds about 1 - 1/n",
        flag="switch_compensate_momentum")
    policy: str = opt(DEFAULT_POLICY, POLICY_HELP, flag="switch_policy", choices=POLICY_CHOICES)
    detector: DetectorConfig = opt(
        "k=1.5,m=3,window=5", "straggler: window median step time > k x the others' median for m "
        "windows of `window` steps", flag="switch_detector", spec=DetectorConfig)
    patience: float | None = opt(
        None, "seconds a straggler must last before elastic switches (default: derived from "
        "the step time, a switch's cost and the detector's false-alarm rate)",
        flag="switch_patience")
    at: BspShare | None = opt(
        None, "BSP share of the plan: a number, or 'auto' for what `shadowsync switch search` "
        "stored under --job-name", flag="switch_at", spec=BspShare)
    job_name: str | None = opt(None, "name a recurring job's search result is stored under")

    def protocol_plan(self) -> SwitchPlan:
        """The plan with --switch-at's share (`auto` resolved by the job's entry)."""
        if self.at is None:
            return self.plan
        if self.at.share is None:
            raise UserError("--switch-at auto: the stored search result was not read before "
                            "the job started")
        return self.plan.with_bsp_share(self.at.share)


@dataclass
class CheckpointConfig:
    """When the job saves itself, how many saves it keeps, and what it does on a failure."""

    every: CheckpointEvery = opt(
        "300s", "checkpoint the job every N seconds ('600s') or N examples ('500000'); 0: only "
        "at the end and on Ctrl-C / SIGTERM; never: no checkpoint (a throwaway run: nothing "
        "to resume, and a restart after a failure begins from the start)",
        flag="checkpoint_every", spec=CheckpointEvery)
    keep: int = opt(2, "checkpoints kept under OUT/checkpoint (older ones pruned)",
                    flag="keep_checkpoints")
    dir: str | None = opt(
        None, "where checkpoints are kept: a directory or an fsspec URL (file://, s3://, gs://: "
        "pip install 'shadowsync[cloud]'); on many hosts it must be one storage for all "
        "(default: OUT/checkpoint)", flag="checkpoint_dir")
    max_restarts: int = opt(
        3, "when a process of the job dies, restart the job from its newest checkpoint up to "
        "this many times (through the elastic agent; modes that resume)")
    resume: str | None = opt(
        None, "continue the run in this directory (or from this checkpoint/step-N) where its "
        "latest checkpoint left off; its config.toml is the base of the options")
    warm_start: str | None = opt(
        None, "start from this finished run's (or checkpoint/step-N's) model, embedding tables "
        "and id maps, training on --data from its first row: a recurring job's next day "
        "(the model's shape options must match; the dense optimizer starts afresh)")
    on_divergence: Literal["stop", "rollback"] = opt(
        "stop", "on a NaN / Inf loss: stop with one line, or roll back to the last good "
        "checkpoint at half the learning rate (at most 3 times)")

    def check(self) -> None:
        if self.max_restarts < 0:
            raise UserError(f"--max-restarts must be >= 0, got {self.max_restarts}")
        if self.keep < 1:
            raise UserError(f"--keep-checkpoints must be >= 1, got {self.keep}")


@dataclass
class OutputConfig:
    """Where the run writes and what it shows."""

    dir: str | None = opt(None, "output directory (default: runs/<timestamp>)", flag="out")
    log_every: int = opt(50_000, "examples between lines of metrics.jsonl")
    eval_points: int | None = opt(
        None, "evaluations on a held-out sample during training (for the plot); with "
        "--val-share, validations in each epoch (default: 8; with --val-share, 4)")
    progress: bool | None = opt(None, "progress bars (default: only on a terminal)")
    log_level: Literal["warning", "info", "debug"] = opt(
        "info", "messages to show (-q: warning, -v: debug)")
    tensorboard: bool = opt(False, "also write TensorBoard scalars under OUT/tensorboard "
                            "(pip install 'shadowsync[tensorboard]')")

    def check(self) -> None:
        _positive(self.log_every, "log-every")
        if self.dir and "://" in self.dir:
            raise UserError(f"--out {self.dir}: the run's files (metrics, plots) are written to "
                            "a local directory; keep checkpoints at a URL with --checkpoint-dir")


@dataclass
class TestingConfig:
    """Fault injection for tests and benchmarks."""

    straggler: Straggler | None = opt(
        None, "slow trainers down: trainer=ID,slowdown=3,start=S,duration=D (seconds, or "
        "shares of the job's examples: start=25%,duration=50%); kind=delay,ms=30,trainers=N "
        "delays each push of the last N trainers (emulated link delay), kind=jitter,ms=D,"
        "jitter=J every trainer's by D +- J ms; episodes=K repeats the window's slowdown K "
        "times", spec=Straggler)
    inject_nan_at: int | None = opt(
        None, "poison trainer 0's dense model once the job has trained about N examples "
        "(to test --on-divergence)")


# The sections of a TrainConfig, in the order of the options in `shadowsync train --help`.
SECTIONS: dict[str, type] = {
    "data": DataConfig, "model": ModelConfig, "optim": OptimConfig, "cluster": ClusterConfig,
    "sync": SyncConfig, "switch": SwitchConfig, "checkpoint": CheckpointConfig,
    "output": OutputConfig, "testing": TestingConfig,
}

# The --help topic of each section's options.
HELP_TOPICS = {"data": "data", "model": "model and optimisation",
               "optim": "model and optimisation", "cluster": "cluster",
               "sync": "synchronization", "switch": "synchronization",
               "checkpoint": "checkpoints and recovery", "output": "output", "testing": TESTING}
HELP_ORDER = ("data", "model and optimisation", "cluster", "synchronization", "output",
              "checkpoints and recovery", TESTING)
