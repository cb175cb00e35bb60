"""Fixed tables (`--tables fixed`): ids modulo --table-size, each table that many rows, placed
whole on a server or cut row-wise over every server (`ShardingPlan`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from shadowsync.checkpoint.store import load_shard
from shadowsync.config import ClusterConfig, ModelConfig, OptimConfig
from shadowsync.embeddings import EmbeddingTables
from shadowsync.errors import UserError
from shadowsync.transport.servers.embedding.plan import ShardingPlan

if TYPE_CHECKING:  # (the tasks' package imports the kinds)
    from shadowsync.train.tasks.base import Features


class Fixed:
    name = "fixed"
    raw_ids = False
    resizes = False

    def table_rows(self, given: tuple[int, ...]) -> tuple[int, ...]:
        return given

    def sharding(self, model: ModelConfig, batch_size: int, features: Features, servers: int,
                 row_split_limit: int) -> ShardingPlan:
        return ShardingPlan(servers, features.table_rows, row_split_limit)

    def local_tables(self, model: ModelConfig, optim: OptimConfig, seed: int,
                     features: Features) -> EmbeddingTables:
        return EmbeddingTables(list(features.table_rows), model.table_width(), seed=seed,
                               **optim.table_optimizer(features.multi_hot)).share_memory_()

    def saved_tables(self, step: Path, model: ModelConfig, cluster: ClusterConfig,
                     batch_size: int, manifest: dict[str, object], features: Features
                     ) -> tuple[list[torch.Tensor], None]:
        """Every table whole, [rows, width] each: the trainer's fused tables cut apart, or
        the servers' pieces laid back in id order."""
        width, table_rows = model.table_width(), features.table_rows
        servers = sorted((s for s in manifest.get("shards", []) if s.startswith("emb")),
                         key=lambda s: int(s[3:]))
        if not servers:
            fused = {"tables/weight": torch.empty(sum(table_rows), width)}
            load_shard(step / "trainer0", fused, "the embedding tables", strict=False)
            return [t.clone() for t in fused["tables/weight"].split(list(table_rows))], None
        if cluster.embedding_transport == "unshared":
            raise UserError(f"checkpoint {step}: --embedding-transport unshared kept a private "
                            "copy of the tables in each trainer, and those were not saved")
        plan = ShardingPlan(len(servers), table_rows, cluster.row_split_limit)
        held = []
        for i, name in enumerate(servers):
            piece = {"state/weight": torch.empty(sum(plan.server_pieces(i)), width)}
            load_shard(step / name, piece, f"embedding server {i}", strict=False)
            held.append(piece["state/weight"])
        every = held[0] if len(held) == 1 else torch.cat(held)
        del held
        return [every[plan.table_keys(t)].clone() for t in range(len(table_rows))], None
