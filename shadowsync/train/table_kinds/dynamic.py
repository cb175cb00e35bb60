"""Dynamic tables (`--tables dynamic`, see docs/dynamic-tables.md): raw 64-bit ids mapped to
rows as they come, each holder (the trainer, or each embedding server) one pool of rows with
its id map, within a budget (`dynamic_spec`: --table-size rows per table, or --table-memory);
a warm start lays the saved pools into pools of the new budget."""

from __future__ import annotations

import atexit
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from shadowsync.checkpoint.store import load_shard
from shadowsync.config import ClusterConfig, ModelConfig, OptimConfig
from shadowsync.embeddings.dynamic import FREE, table_of
from shadowsync.embeddings.dynamic_tables import DynamicTables
from shadowsync.train.dynamic_tables import dynamic_spec
from shadowsync.transport import shm
from shadowsync.transport.servers.embedding.plan import ShardingPlan

if TYPE_CHECKING:  # (the tasks' package imports the kinds)
    from shadowsync.train.tasks.base import Features


class Dynamic:
    name = "dynamic"
    raw_ids = True
    resizes = True

    def table_rows(self, given: tuple[int, ...]) -> tuple[int, ...]:
        return given  # each table's budget of rows

    def sharding(self, model: ModelConfig, batch_size: int, features: Features, servers: int,
                 row_split_limit: int) -> ShardingPlan:
        """Each server's share of the id maps, its pool sized by `batch_size` (--batch-size)."""
        return ShardingPlan(servers, features.table_rows, row_split_limit,
                            dynamic_spec(model, batch_size, features, servers))

    def local_tables(self, model: ModelConfig, optim: OptimConfig, seed: int,
                     features: Features) -> DynamicTables:
        # The workers are processes: they take the map's lock through a file on this host.
        lock = shm.new_path("dynamic-lock") if shm.available() else None
        if lock is not None:
            atexit.register(shm.unlink, lock)
        return dynamic_spec(model, optim.batch_size, features, 1).build(
            model.table_width(), seed, lock, **optim.table_optimizer()
        ).share_memory_()

    def saved_tables(self, step: Path, model: ModelConfig, cluster: ClusterConfig,
                     batch_size: int, manifest: dict[str, object], features: Features
                     ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The pools cut back into one table per feature: each feature's rows in the order
        of their keys after a default row of zeros, and those keys after key 0 (see
        `TrainedModel._rows`). Ids the maps did not hold read the default row (`batch_size`:
        the run's --batch-size, which the pools were sized by)."""
        width = model.table_width()
        servers = sorted((s for s in manifest.get("shards", []) if s.startswith("emb")),
                         key=lambda s: int(s[3:]))
        holders = ([(step / name, "state/", f"embedding server {i}")
                    for i, name in enumerate(servers)] if servers
                   else [(step / "trainer0", "tables/", "the embedding tables")])
        spec = dynamic_spec(model, batch_size, features, len(holders))
        keys, rows = [], []
        for where, prefix, what in holders:
            held = {f"{prefix}weight": torch.empty(spec.capacity + 1, width),
                    f"{prefix}map/row_key": torch.empty(spec.capacity + 1, dtype=torch.int64)}
            load_shard(where, held, what, strict=False)
            row_key = held[f"{prefix}map/row_key"].numpy()
            live = np.flatnonzero(row_key != FREE)
            keys.append(row_key[live])
            rows.append(held[f"{prefix}weight"][torch.from_numpy(live)])
        every_key, every_row = np.concatenate(keys), torch.cat(rows)
        order = np.argsort(every_key, kind="stable")
        every_key, every_row = every_key[order], every_row[torch.from_numpy(order)]
        table = table_of(every_key)
        tables, id_keys = [], []
        for t in range(features.num_tables):
            mine = np.flatnonzero(table == t)
            tables.append(torch.cat([torch.zeros(1, width), every_row[torch.from_numpy(mine)]]))
            id_keys.append(torch.from_numpy(np.concatenate([[0], every_key[mine]])))
        return tables, id_keys
