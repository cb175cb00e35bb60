"""What a `--tables` kind provides (`TableBuilder`): what the data hands its tables (ids
folded modulo each table's rows, or raw), how many rows each table has, the embedding
servers' holders (a `ShardingPlan`, from which each server builds and sizes its share), one
process's holders for a run without servers, and the tables a checkpoint holds, whole, for
an export.

A kind is one module with its builder plus one entry in
`shadowsync.spec.table_kinds.TABLE_KINDS` naming it ("module:Class"); code that makes,
serves, saves or exports tables asks `table_builder(model)`, never the kind's name.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, runtime_checkable
from typing import Protocol as Interface

import torch

from shadowsync.config import ClusterConfig, ModelConfig, OptimConfig
from shadowsync.embeddings import EmbeddingTables
from shadowsync.embeddings.dynamic_tables import DynamicTables
from shadowsync.transport.servers.embedding.plan import ShardingPlan

if TYPE_CHECKING:  # (the tasks' package imports the kinds)
    from shadowsync.train.tasks.base import Features


@runtime_checkable
class TableBuilder(Interface):
    name: ClassVar[str]
    raw_ids: ClassVar[bool]  # the data hands ids unfolded: the holders map them to rows
    # A warm start may give the tables another budget (--table-size, --table-memory): the
    # saved holders are read as saved and laid into the new ones.
    resizes: ClassVar[bool]

    def table_rows(self, given: tuple[int, ...]) -> tuple[int, ...]:
        """Each table's rows, from those --table-size and the data give (with raw ids: each
        table's budget of rows)."""
        ...

    def sharding(self, model: ModelConfig, batch_size: int, features: Features, servers: int,
                 row_split_limit: int) -> ShardingPlan:
        """Where `servers` holders keep the tables (one: a run without embedding servers);
        a budget they cannot meet is refused here (a UserError), before any process."""
        ...

    def local_tables(self, model: ModelConfig, optim: OptimConfig, seed: int,
                     features: Features) -> EmbeddingTables | DynamicTables:
        """The one trainer's tables, in shared memory for its workers (seeded by `seed`)."""
        ...

    def saved_tables(self, step: Path, model: ModelConfig, cluster: ClusterConfig,
                     batch_size: int, manifest: dict[str, object], features: Features
                     ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
        """Checkpoint `step`'s tables, one whole table per feature in feature order, and the
        raw-id keys of each one's rows (None: ids are folded modulo each table's rows)."""
        ...


def table_builder(model: ModelConfig) -> TableBuilder:
    """The builder of the run's --tables kind."""
    builder = model.table_kind.build()
    if not isinstance(builder, TableBuilder):
        raise TypeError(f"--tables {model.tables}: {model.table_kind.builder} is not a "
                        "TableBuilder")
    return builder
