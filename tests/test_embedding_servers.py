"""Embedding servers over real RPC: lookups route to the right shard and repeated ids in a
batch are summed into one update (checked against the closed form of sparse SGD)."""


import pytest
import torch

from shadowsync.transport.layout import ClusterLayout
from shadowsync.transport.rpc import RpcEndpoint
from shadowsync.transport.servers.embedding import RemoteEmbeddings, ShardingPlan, serve
from tests.helpers import run_spawned

ROWS = (50, 400, 30)  # the 400-row table is split row-wise over both servers
PLAN = ShardingPlan(2, ROWS, row_split_limit=100)
LAYOUT = ClusterLayout(embedding_servers=2, dense_servers=0, trainers=1, workers=0)
LR = 0.5


def _server(index: int, port: int, results) -> None:
    serve(PLAN, index, 4, "sgd", LR, seed=0)
    RpcEndpoint("127.0.0.1", port).join(LAYOUT.embedding_name(index), index, 3)
    RpcEndpoint.leave()


def _client(port: int, results) -> None:
    client = RemoteEmbeddings(PLAN, LAYOUT, RpcEndpoint("127.0.0.1", port), 4,
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
    from shadowsync.cluster.launch import free_port

    port = free_port("127.0.0.1")
    [lists] = run_spawned([(_server, (0, port)), (_server, (1, port)), (_client, (port,))],
                          1, timeout=45)
    before, middle, after = map(torch.tensor, lists)
    # the same id in the same table reads the same row; different tables differ
    assert torch.equal(before[0, 0], before[1, 0]) and torch.equal(before[0, 2], before[1, 2])
    assert not torch.equal(before[0, 0], before[1, 1])
    # table 0 id 1 appears 3 times, table 1 id 399 twice, the others once: SGD moves each
    # row by -lr * (summed gradient)
    expected_steps = torch.tensor([[3, 2, 2], [3, 1, 2], [3, 2, 1]], dtype=torch.float32)
    assert torch.allclose((before - middle)[:, :, 0], LR * expected_steps, atol=1e-6)
    assert torch.allclose((middle - after)[:, :, 0], LR * expected_steps, atol=1e-6)
