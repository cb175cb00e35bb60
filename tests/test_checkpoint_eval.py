"""`shadowsync eval` reads embedding rows back from the servers' shards where the servers'
clients put them: every (table, id) a row of its own, row-split tables by id % servers."""

from __future__ import annotations

import torch

from shadowsync.checkpoint.evaluate import ShardedTables
from shadowsync.embeddings import EmbeddingTables
from shadowsync.transport.servers.embedding import ShardingPlan


def test_every_table_and_id_reads_its_own_row_on_the_right_server():
    rows = (7, 40, 3, 25)
    plan = ShardingPlan(servers=2, table_rows=rows, row_split_limit=30)  # table 1 split
    servers = [EmbeddingTables(plan.server_pieces(s), 2) for s in range(2)]
    for s, tables in enumerate(servers):  # row r of server s holds (s, r)
        n = tables.weight.shape[0]
        tables.weight.data = torch.stack([torch.full((n,), float(s)),
                                          torch.arange(n, dtype=torch.float32)], 1)
    lookup = ShardedTables(plan, servers)
    ids = torch.tensor([[i % r for r in rows] for i in range(40)])
    got = lookup.lookup(ids)
    assert got.shape == (40, 4, 2)
    seen = {(int(s), int(r)) for s, r in got[:, :, :].reshape(-1, 2).tolist()}
    pairs = {(t, int(ids[i, t])) for i in range(40) for t in range(4)}
    assert len(seen) == len(pairs) == sum(rows)  # a bijection: no two ids share a row
    split = got[:, 1, 0]
    assert torch.equal(split, (ids[:, 1] % 2).float())  # the split table: server id % 2
    for t in (0, 2, 3):  # a whole table lives on one server, its ids on consecutive rows
        assert got[:, t, 0].unique().numel() == 1
        first = got[ids[:, t] == 0, t, 1][0]
        assert torch.equal(got[:, t, 1], first + ids[:, t].float())
