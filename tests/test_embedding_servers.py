"""Embedding servers over real RPC: lookups route to the right shard and repeated ids in a
batch are summed into one update (checked against the closed form of sparse SGD)."""


import pytest
import torch

from shadowsync.embeddings import EmbeddingClient, EmbeddingTables
from shadowsync.transport.layout import ClusterLayout
from shadowsync.transport.rpc import RpcEndpoint
from shadowsync.transport.servers.embedding.client import RemoteEmbeddings
from shadowsync.transport.servers.embedding.plan import ShardingPlan
from shadowsync.transport.servers.embedding.server import serve
from tests.helpers import at_job_store, job_store, run_spawned

ROWS = (50, 400, 30)  # the 400-row table is split row-wise over both servers
PLAN = ShardingPlan(2, ROWS, row_split_limit=100)
LAYOUT = ClusterLayout(embedding_servers=2, dense_servers=0, trainers=1, workers=0)
LR = 0.5


def _server(index: int, port: int, results) -> None:
    serve(PLAN, index, 4, {"optimizer": "sgd", "lr": LR}, seed=0)
    at_job_store(port).join(LAYOUT.embedding_name(index), index, 3)
    RpcEndpoint.leave()


def _client(port: int, results) -> None:
    client = RemoteEmbeddings(PLAN, LAYOUT, at_job_store(port), 4,
                              {"trainer0": 2})
    client.attach("trainer0")
    ids = torch.tensor([[1, 399, 7], [1, 2, 7], [1, 399, 29]])
    before = client.lookup(ids)
    # the combined call applies the update before it reads the next batch's rows
    middle = client.update_and_lookup(ids, torch.ones(3, 3, 4), ids.clone())
    client.apply_gradients(ids, torch.ones(3, 3, 4))  # asynchronous push
    client.flush()
    after = client.lookup(ids.clone())
    client.detach()
    results.put((before.tolist(), middle.tolist(), after.tolist()))  # lists outlive us


@pytest.mark.timeout(60)
def test_lookup_and_summed_sparse_sgd_over_rpc():
    with job_store() as port:
        [lists] = run_spawned([(_server, (0, port)), (_server, (1, port)),
                               (_client, (port,))], 1, timeout=45)
    before, middle, after = map(torch.tensor, lists)
    # the same id in the same table reads the same row; different tables differ
    assert torch.equal(before[0, 0], before[1, 0]) and torch.equal(before[0, 2], before[1, 2])
    assert not torch.equal(before[0, 0], before[1, 1])
    # table 0 id 1 appears 3 times, table 1 id 399 twice, the others once: SGD moves each
    # row by -lr * (summed gradient)
    expected_steps = torch.tensor([[3, 2, 2], [3, 1, 2], [3, 2, 1]], dtype=torch.float32)
    assert torch.allclose((before - middle)[:, :, 0], LR * expected_steps, atol=1e-6)
    assert torch.allclose((middle - after)[:, :, 0], LR * expected_steps, atol=1e-6)


ADAGRAD_PLAN = ShardingPlan(2, (60, 300, 40), row_split_limit=100)


def _adagrad_server(index: int, port: int, results) -> None:
    import os

    serve(ADAGRAD_PLAN, index, 4,
          {"optimizer": "adagrad", "lr": 0.1, "initial_accumulator": 0.05}, seed=3, clients=1)
    from shadowsync.transport.servers.embedding import server

    paths = list(server._SHARED.paths.values()) if server._SHARED else []
    at_job_store(port).join(LAYOUT.embedding_name(index), index, 3)
    RpcEndpoint.leave()
    # every client attached, so the names are gone before the job ends
    results.put(("server", index, [p for p in paths if os.path.exists(p)]))


def _steps_client(port: int, transport: str, results) -> None:
    client = RemoteEmbeddings(ADAGRAD_PLAN, LAYOUT, at_job_store(port), 4,
                              {"trainer0": 2}, transport=transport)
    client.attach("trainer0")
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 40, (16, 3), generator=gen)
    vectors = client.lookup(ids)
    seen = [vectors]
    for step in range(12):
        grads = torch.randn(16, 3, 4, generator=gen)
        nxt = torch.randint(0, 40, (16, 3), generator=gen)
        # a schedule's factor on the tables' rate travels with each update
        vectors = client.update_and_lookup(ids, grads, nxt, lr_scale=1.0 - step / 16)
        seen.append(vectors)
        ids = nxt
    # at a zero rate an update leaves every row where it was
    frozen = client.update_and_lookup(ids, torch.randn(16, 3, 4, generator=gen), ids,
                                      lr_scale=0.0)
    assert torch.equal(frozen, vectors)
    client.apply_gradients(ids, torch.randn(16, 3, 4, generator=gen), lr_scale=0.5)
    client.flush()
    seen.append(client.lookup(torch.arange(40).unsqueeze(1).expand(40, 3).contiguous()))
    results.put(("client", client.shared_servers, [v.tolist() for v in seen]))
    client.detach()


def _run_steps(transport: str):
    with job_store() as port:
        out = run_spawned([(_adagrad_server, (0, port)), (_adagrad_server, (1, port)),
                           (_steps_client, (port, transport))], 3, timeout=45)
    [client] = [r for r in out if r[0] == "client"]
    left = [p for r in out if r[0] == "server" for p in r[2]]
    return client[1], [torch.tensor(v) for v in client[2]], left


@pytest.mark.timeout(120)
def test_shared_memory_path_matches_rpc_bitwise():
    """Servers on this host are reached in place (no RPC); a lone client's lookups and
    row-wise Adagrad updates are then bitwise those of the RPC path."""
    rpc_servers, over_rpc, _ = _run_steps("rpc")
    shm_servers, in_place, left = _run_steps("auto")
    assert rpc_servers == [] and shm_servers == [0, 1]
    assert not left, f"shared-memory names left behind: {left}"
    assert len(over_rpc) == len(in_place) == 14
    for a, b in zip(over_rpc, in_place):
        assert torch.equal(a, b)
    assert not torch.equal(over_rpc[0], over_rpc[-2])  # the updates did move the rows


@pytest.mark.parametrize("servers,rows,limit", [(2, ROWS, 100), (3, (7, 50, 11, 64), 10),
                                                (1, (5, 9), 1)])
def test_table_keys_put_every_table_back_together_in_id_order(servers, rows, limit):
    # Each server's rows hold their key, so reading the keys of a table back through
    # table_keys must give, for id i of table t, the key its lookup routes to: RowKeys.of.
    plan = ShardingPlan(servers, rows, row_split_limit=limit)
    keys = plan.keys()
    every = torch.arange(int(keys.starts[-1]))
    assert len(every) == sum(rows)  # one row per (table, id), none lost or doubled
    seen = torch.cat([every[plan.table_keys(t)] for t in range(len(rows))])
    assert sorted(seen.tolist()) == every.tolist()
    for t, n in enumerate(rows):
        ids = torch.zeros(n, len(rows), dtype=torch.long)
        ids[:, t] = torch.arange(n)
        routed = keys.of(ids).view(n, len(rows))[:, t]
        assert torch.equal(every[plan.table_keys(t)], routed)
    if servers > 1 and max(rows) > limit:  # a split table's ids alternate between servers
        t = max(range(len(rows)), key=lambda i: rows[i])
        server_of = torch.searchsorted(keys.starts, every[plan.table_keys(t)], right=True) - 1
        assert server_of[:servers].tolist() == list(range(servers))


def test_local_tables_and_the_servers_client_are_both_embedding_clients():
    """The seam the trainer and its workers use (`EmbeddingClient`): local tables in shared
    memory and the remote client answer it alike; a half client does not."""

    class LookupOnly:
        def lookup(self, ids):
            return ids

    client = RemoteEmbeddings(PLAN, LAYOUT, RpcEndpoint("127.0.0.1", 0), 4, {"trainer0": 2})
    assert isinstance(client, EmbeddingClient)
    assert isinstance(EmbeddingTables([3, 4], 2), EmbeddingClient)
    assert not isinstance(LookupOnly(), EmbeddingClient)


def test_a_server_trains_its_rows_bitwise_as_local_tables_do():
    """One trainer's tables through an embedding server or in the trainer: the same row-wise
    Adagrad step (summed repeats, one accumulator per row, the schedule's factor), also on
    mean-pooled multi-hot bags, so the two paths differ only in where the rows live."""
    from shadowsync.data.bags import Bags

    rows, dim = [90, 30, 12], 5
    rule = {"optimizer": "adagrad", "lr": 0.2, "initial_accumulator": 0.05}
    local = EmbeddingTables(rows, dim, seed=0, **rule)
    served = EmbeddingTables(rows, dim, seed=1, **rule)
    served.load_state_dict(local.state_dict())
    plan = ShardingPlan(1, tuple(rows), row_split_limit=10**9)
    layout = ClusterLayout(embedding_servers=1, dense_servers=0, trainers=1, workers=0)
    client = RemoteEmbeddings(plan, layout, RpcEndpoint("127.0.0.1", 0), dim, {})
    # what attach() sets up for a server whose tables are mapped into this process
    client._keys, client._shared = plan.keys(), {0: served}
    gen = torch.Generator().manual_seed(0)

    def batch() -> Bags:
        single = torch.stack([torch.randint(0, r, (16,), generator=gen) for r in rows[:2]], 1)
        offsets = torch.cat([torch.zeros(1, dtype=torch.long),
                             torch.randint(1, 4, (16,), generator=gen).cumsum(0)])
        genres = torch.randint(0, rows[2], (int(offsets[-1]),), generator=gen)
        return Bags.build(single, [(genres, offsets, None, "mean")])

    ids = batch()
    for step in range(30):
        grads, nxt = torch.randn(16, 3, dim, generator=gen), batch()
        here = local.update_and_lookup(ids, grads, nxt, lr_scale=min(1.0, (step + 1) / 10))
        there = client.update_and_lookup(ids, grads, nxt, lr_scale=min(1.0, (step + 1) / 10))
        assert torch.equal(here, there)
        ids = nxt
    assert torch.equal(local.weight, served.weight) and torch.equal(local.state, served.state)
    assert not torch.equal(local.state, torch.full_like(local.state, 0.05))  # rows did learn
