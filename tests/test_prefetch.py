"""--prefetch: a worker's rows asked for steps ahead. With SGD and one id trained every step by
a gradient of ones, the row after n of the worker's updates is w0 - n * lr, so the row each
batch reads tells how many updates it missed: exactly min(j - r, depth) (see
`shadowsync.train.prefetch`), in process and over real RPC."""

from __future__ import annotations

import pytest
import torch

from shadowsync.config.options import config_from_options
from shadowsync.embeddings import EmbeddingTables
from shadowsync.errors import UserError
from shadowsync.train.prefetch import RowPipeline, depth_of
from shadowsync.transport.layout import ClusterLayout
from shadowsync.transport.rpc import RpcEndpoint
from shadowsync.transport.servers.embedding.client import (
    AUTO_PREFETCH,
    RemoteEmbeddings,
    prefetch_depth,
)
from shadowsync.transport.servers.embedding.plan import ShardingPlan
from shadowsync.transport.servers.embedding.server import serve
from tests.helpers import at_job_store, job_store, run_spawned

LR = 0.25
DIM = 8


def missed(j: int, depth: int, restart: int = 0) -> int:
    """The worker's own updates batch j's rows miss (the module's closed form)."""
    return min(j - restart, depth)


def batches(n: int):
    """n one-example batches of table 0's id 3 (a new ids tensor each, as a data stream's)."""
    return iter([(None, torch.tensor([[3]]), None) for _ in range(n)])


class _Fetched:
    def __init__(self, rows: torch.Tensor) -> None:
        self._rows, self.waited = rows, False

    def rows(self) -> torch.Tensor:
        return self._rows

    def wait(self) -> None:
        self.waited = True


class InPlaceFetching:
    """A prefetching client over local tables whose calls are answered as they are made (as
    a server that takes a client's calls in order does)."""

    def __init__(self, depth: int) -> None:
        self.tables = EmbeddingTables([10], DIM, optimizer="sgd", lr=LR, seed=1)
        self.prefetch_depth = depth
        self.fetches: list[_Fetched] = []

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tables.lookup(ids)

    def update_and_lookup(self, ids, grads, next_ids, lr_scale=1.0):
        return self.tables.update_and_lookup(ids, grads, next_ids, lr_scale)

    def fetch(self, ids: torch.Tensor) -> _Fetched:
        self.fetches.append(_Fetched(self.tables.lookup(ids)))
        self.fetches[-1].ids = ids
        return self.fetches[-1]

    def update_and_fetch(self, done, grads, next_ids, lr_scale=1.0):
        self.tables.apply_gradients(done.ids, grads, lr_scale)
        return None if next_ids is None else self.fetch(next_ids)


def train(pipe: RowPipeline, steps: int, drain_after: int | None = None,
          stop_after: int | None = None) -> list[float]:
    """The worker's loop on `pipe`: each batch's row (its first coordinate) as read."""
    read = []
    while pipe.batch is not None and len(read) < steps:
        vectors = pipe.rows()
        read.append(float(vectors[0, 0, 0]))
        more = stop_after is None or len(read) <= stop_after
        pipe.advance(torch.ones_like(vectors), more, lr_scale=1.0)
        if drain_after is not None and len(read) == drain_after + 1:
            pipe.drain()
    return read


@pytest.mark.parametrize("depth", [0, 1, 2])
def test_depth_d_rows_miss_exactly_the_last_d_updates(depth):
    client = InPlaceFetching(depth)
    w0 = float(client.tables.lookup(torch.tensor([[3]]))[0, 0, 0])
    read = train(RowPipeline(client, depth_of(client), batches(9)), 9)
    assert read == pytest.approx([w0 - LR * (j - missed(j, depth)) for j in range(9)])


def test_a_drain_reads_the_rows_again_and_the_pipeline_refills():
    """At a quiescent point every fetch is answered and the rows read ahead are read again:
    the batch after the point misses nothing, the ones after it miss 1, 2, then 2 again."""
    client = InPlaceFetching(2)
    w0 = float(client.tables.lookup(torch.tensor([[3]]))[0, 0, 0])
    read = train(RowPipeline(client, 2, batches(12)), 12, drain_after=4)
    restart = 5  # the steps taken before the point
    expected = [w0 - LR * (j - missed(j, 2, 0 if j < restart else restart)) for j in range(12)]
    assert read == pytest.approx(expected)
    assert [missed(j, 2, restart) for j in range(5, 9)] == [0, 1, 2, 2]


def test_a_stop_trains_no_batch_drawn_ahead_and_answers_every_fetch():
    client = InPlaceFetching(2)
    pipe = RowPipeline(client, 2, batches(12))
    read = train(pipe, 12, stop_after=3)
    assert len(read) == 4 and pipe.batch is None
    assert all(f.waited for f in client.fetches[-2:])  # the two batches drawn ahead
    w0 = read[0]
    # every step's push landed: 4 updates, no more
    assert float(client.tables.lookup(torch.tensor([[3]]))[0, 0, 0]) == pytest.approx(
        w0 - 4 * LR)


def test_depth_zero_is_the_blocking_round_trip():
    """At depth 0 the pipeline makes the calls a worker made before it: lookup, then
    update_and_lookup each step (a client without fetch works)."""

    class Blocking(InPlaceFetching):
        fetch = update_and_fetch = None  # type: ignore[assignment]

    client = Blocking(0)
    read = train(RowPipeline(client, 0, batches(5)), 5)
    assert read == pytest.approx([read[0] - LR * j for j in range(5)])


def test_auto_depth_needs_a_shard_over_rpc_and_fixed_tables():
    assert prefetch_depth("auto", servers_over_rpc=1, dynamic=False) == AUTO_PREFETCH >= 1
    assert prefetch_depth("auto", servers_over_rpc=0, dynamic=False) == 0
    assert prefetch_depth("auto", servers_over_rpc=2, dynamic=True) == 0
    assert prefetch_depth("2", servers_over_rpc=0, dynamic=False) == 2
    assert prefetch_depth("0", servers_over_rpc=2, dynamic=False) == 0


def test_prefetch_option():
    assert config_from_options().cluster.prefetch == "auto"
    assert config_from_options(prefetch=2).cluster.prefetch == "2"
    with pytest.raises(UserError, match="--prefetch"):
        config_from_options(prefetch="3")
    with pytest.raises(UserError, match="--prefetch 1: not with --tables dynamic"):
        config_from_options(prefetch=1, tables="dynamic")


def test_a_server_runs_a_clients_numbered_calls_in_order_and_answers_each_its_own(monkeypatch):
    """Calls that arrive early wait for the ones before them; each caller gets its own call's
    answer, also when the thread that ran the call before it runs it."""
    from shadowsync.transport.servers.embedding import server

    ran: list[int] = []
    monkeypatch.setitem(server.REMOTE_CALLS, "note", lambda n: ran.append(n) or n * 10)
    order = server._InOrder()
    answers = {n: order.call(7, n, "note", (n,)) for n in (2, 1, 3)}
    assert ran == [] and not any(f.done() for f in answers.values())
    answers[0] = order.call(7, 0, "note", (0,))
    answers[5] = order.call(7, 5, "note", (5,))  # 4 has not come: 5 waits
    assert ran == [0, 1, 2, 3]
    assert {n: f.wait() for n, f in answers.items() if n != 5} == {0: 0, 1: 10, 2: 20, 3: 30}
    assert not answers[5].done()
    assert order.call(7, 4, "note", (4,)).wait() == 40 and answers[5].wait() == 50
    assert order.call(8, 0, "note", (9,)).wait() == 90  # another client counts from 0


ROWS = 200_000  # a push long enough to apply that a call racing it reads rows it has not reached
PLAN = ShardingPlan(1, (ROWS,), row_split_limit=10**9)
LAYOUT = ClusterLayout(embedding_servers=1, dense_servers=0, trainers=1, workers=0)


def _server(port: int, results) -> None:
    serve(PLAN, 0, DIM, {"optimizer": "sgd", "lr": LR}, seed=0)
    at_job_store(port).join(LAYOUT.embedding_name(0), 0, 2)
    RpcEndpoint.leave()


def _client(port: int, results) -> None:
    client = RemoteEmbeddings(PLAN, LAYOUT, at_job_store(port), DIM,
                              {"trainer0": 1}, transport="rpc", prefetch="auto")
    client.attach("trainer0")
    out = {"auto": client.prefetch_depth}
    for depth in (0, 1, 2):
        out[depth] = train(RowPipeline(client, depth, batches(10)), 10)
        client.flush()  # a run's last push goes out unanswered (at depth 0 unnumbered too)
    out["drained"] = train(RowPipeline(client, 2, batches(10)), 10, drain_after=3)
    client.flush()
    out["end"] = float(client.lookup(torch.tensor([[3]]))[0, 0, 0])
    out["raced"] = [_read_after_a_long_push(client) for _ in range(2)]
    client.detach()
    results.put(out)


def _read_after_a_long_push(client: RemoteEmbeddings) -> float:
    """How far the last row moved for a read sent right after a push to every row, both
    without waiting (the read is small and the push long: run at once, it reads first)."""
    every, last = torch.arange(ROWS).unsqueeze(1), torch.tensor([[ROWS - 1]])
    before = client.lookup(last)
    client.update_and_fetch(client.fetch(every), torch.ones(ROWS, 1, DIM), None)
    return float((before - client.fetch(last.clone()).rows())[0, 0, 0])


@pytest.mark.timeout(180)
def test_over_rpc_rows_miss_exactly_the_last_d_updates():
    """A server takes a client's calls in the order made (its thread pool would run calls
    that arrive together at once): over real RPC the rows read are the closed form's."""
    with job_store() as port:
        [out] = run_spawned([(_server, (port,)), (_client, (port,))], 1, timeout=160)
    assert out["auto"] == AUTO_PREFETCH
    w0 = out[0][0]
    done = 0
    for depth in (0, 1, 2):
        assert out[depth] == pytest.approx(
            [w0 - LR * (done + j - missed(j, depth)) for j in range(10)]), depth
        done += 10
    expected = [w0 - LR * (done + j - missed(j, 2, 0 if j < 4 else 4)) for j in range(10)]
    assert out["drained"] == pytest.approx(expected)
    assert out["end"] == pytest.approx(w0 - LR * (done + 10))
    assert out["raced"] == pytest.approx([LR] * 2)  # each read after the push made before it
