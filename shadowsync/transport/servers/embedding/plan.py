"""Where every (table, id) of the embedding tables lives: a server and a row of that server's
fused matrix. Tables are placed whole (greedily balancing rows over the servers), except a
table above `row_split_limit` rows, which is cut row-wise over every server (id % E picks the
server, id // E the row there)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from shadowsync.data.bags import Bags
from shadowsync.embeddings.dynamic_tables import DynamicSpec


@dataclass(frozen=True)
class ShardingPlan:
    """Where every (table, id) lives: a server and a row of that server's fused matrix."""

    servers: int
    table_rows: tuple[int, ...]
    row_split_limit: int
    # Dynamic tables: each server holds one pool of rows for the raw ids it owns (ids go to
    # servers by their key, see `shadowsync.embeddings.dynamic`), not pieces of tables.
    dynamic: DynamicSpec | None = None

    def _placement(self) -> tuple[list[int], list[list[int]], list[list[int]], list[list[int]]]:
        """Per table: owning server (-1 if row-split); per server: piece sizes; per table and
        server: row offset of the table's piece on that server (-1 where none); per server:
        the table of each piece."""
        e = self.servers
        owner = [-1] * len(self.table_rows)
        load = [0] * e
        pieces: list[list[int]] = [[] for _ in range(e)]
        tables: list[list[int]] = [[] for _ in range(e)]
        offset = [[-1] * e for _ in self.table_rows]
        split = [t for t, r in enumerate(self.table_rows) if e > 1 and r > self.row_split_limit]
        for t in split:
            for s in range(e):
                n = (self.table_rows[t] - s + e - 1) // e  # ids with id % e == s
                offset[t][s] = load[s]
                load[s] += n
                pieces[s].append(n)
                tables[s].append(t)
        whole = sorted((t for t in range(len(self.table_rows)) if t not in split),
                       key=lambda t: -self.table_rows[t])
        for t in whole:
            s = min(range(e), key=lambda i: load[i])
            owner[t] = s
            offset[t][s] = load[s]
            load[s] += self.table_rows[t]
            pieces[s].append(self.table_rows[t])
            tables[s].append(t)
        return owner, pieces, offset, tables

    def server_pieces(self, server: int) -> list[int]:
        if self.dynamic is not None:
            return [self.dynamic.capacity + 1]
        return self._placement()[1][server]

    def server_optimizer(self, server: int, table_optimizer: dict[str, Any]) -> dict[str, Any]:
        """`table_optimizer` (`OptimConfig.table_optimizer`) for `server`'s pieces: an initial
        accumulator or weight decay given per table becomes one per piece (dynamic tables:
        one for all)."""
        per_table = {k: v for k, v in table_optimizer.items()
                     if k in ("initial_accumulator", "weight_decay") and isinstance(v, Sequence)}
        if not per_table:
            return table_optimizer
        if self.dynamic is not None:
            raise ValueError(f"dynamic tables take one {', '.join(per_table)} for every row")
        tables = self._placement()[3][server]
        return {**table_optimizer, **{k: [v[t] for t in tables] for k, v in per_table.items()}}

    def keys(self) -> RowKeys:
        """Every (table, id) as one integer key, the servers' rows laid end to end (with
        dynamic tables only `starts` applies: the ids' rows come from the servers' maps)."""
        if self.dynamic is not None:
            rows = self.dynamic.capacity + 1
            empty = torch.empty(0, dtype=torch.long)
            return RowKeys(torch.arange(self.servers + 1) * rows, empty, empty,
                           empty.reshape(0, self.servers))
        owner, pieces, offset, _ = self._placement()
        e = self.servers
        starts = [0, *itertools.accumulate(sum(p) for p in pieces)]
        whole = [starts[owner[t]] + offset[t][owner[t]] if owner[t] >= 0 else 0
                 for t in range(len(self.table_rows))]
        split = [t for t in range(len(self.table_rows)) if owner[t] < 0]
        split_base = [[starts[s] + offset[t][s] for s in range(e)] for t in split]
        return RowKeys(torch.tensor(starts), torch.tensor(whole),
                       torch.tensor(split, dtype=torch.long),
                       torch.tensor(split_base, dtype=torch.long).reshape(len(split), e))

    def table_keys(self, table: int) -> slice | torch.Tensor:
        """The keys (rows of the servers' matrices laid end to end) of `table`'s ids in id
        order: `weights[table_keys(t)]` is table t whole again. A table placed whole is one
        range of keys (a slice, read as a view); a row-split one alternates between servers."""
        keys = self.keys()
        cut = (keys.split == table).nonzero().flatten()
        if len(cut) == 0:
            first = int(keys.whole[table])
            return slice(first, first + self.table_rows[table])
        ids = torch.arange(self.table_rows[table])
        return keys.split_base[int(cut[0])][ids % self.servers] + ids // self.servers


@dataclass(frozen=True)
class RowKeys:
    """Where (table, id) pairs live, as keys: a server's first key plus the row on that
    server. One key space for all servers makes a batch's ids one array to deduplicate, and
    each server's rows one contiguous range of the sorted keys."""

    starts: torch.Tensor  # each server's first key, then the number of keys
    whole: torch.Tensor  # [tables]: key of id 0 of each table placed whole (0 if split)
    split: torch.Tensor  # the row-split tables
    split_base: torch.Tensor  # [split tables, servers]: key of each piece's first row

    def of(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, tables] -> keys [B * tables]."""
        keys = ids + self.whole
        if len(self.split):
            e = self.split_base.shape[1]
            sid = ids[:, self.split]
            piece = torch.arange(len(self.split)) * e + sid % e
            keys[:, self.split] = self.split_base.view(-1)[piece] + sid // e
        return keys.reshape(-1)

    def of_pairs(self, tables: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """(table, id) pairs [L] -> keys [L] (the lookups of a batch with multi-hot features)."""
        keys = self.whole.index_select(0, tables) + ids
        if len(self.split):
            e = self.split_base.shape[1]
            piece_of = torch.full((len(self.whole),), -1, dtype=torch.long)
            piece_of[self.split] = torch.arange(len(self.split))
            piece = piece_of.index_select(0, tables)
            at = (piece >= 0).nonzero().squeeze(1)
            sid = ids.index_select(0, at)
            keys[at] = self.split_base.view(-1)[piece[at] * e + sid % e] + sid // e
        return keys

    def keys(self, ids: torch.Tensor | Bags) -> torch.Tensor:
        """The keys of a batch's lookups: ids [B, tables] flattened, or a `Bags`' pairs."""
        return self.of_pairs(ids.tables, ids.ids) if isinstance(ids, Bags) else self.of(ids)
