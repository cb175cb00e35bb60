"""Embedding parameter servers: model-parallel tables shared by every trainer.

Tables are placed whole on servers (table-wise sharding, greedily balancing rows), except a
table above `row_split_limit` rows, which is cut row-wise over every server (id % E picks the
server, id // E the row there). There is one copy of each row in the job: trainers look rows
up and push sparse gradients, and the server applies SGD or row-wise Adagrad in place, from
many RPC threads at once without locks (Hogwild on the server). Embeddings are never averaged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed.rpc as rpc

from shadowsync.embeddings import EmbeddingTables
from shadowsync.transport.layout import ClusterLayout
from shadowsync.transport.rpc import RpcEndpoint

# Set in each embedding-server process; the RPC functions below run there.
_LOCAL_TABLES: EmbeddingTables | None = None


@dataclass(frozen=True)
class ShardingPlan:
    """Where every (table, id) lives: a server and a row of that server's fused matrix."""

    servers: int
    table_rows: tuple[int, ...]
    row_split_limit: int

    def _placement(self) -> tuple[list[int], list[list[int]], list[list[int]]]:
        """Per table: owning server (-1 if row-split); per server: piece sizes; per table and
        server: row offset of the table's piece on that server (-1 where none)."""
        e = self.servers
        owner = [-1] * len(self.table_rows)
        load = [0] * e
        pieces: list[list[int]] = [[] for _ in range(e)]
        offset = [[-1] * e for _ in self.table_rows]
        split = [t for t, r in enumerate(self.table_rows) if e > 1 and r > self.row_split_limit]
        for t in split:
            for s in range(e):
                n = (self.table_rows[t] - s + e - 1) // e  # ids with id % e == s
                offset[t][s] = load[s]
                load[s] += n
                pieces[s].append(n)
        whole = sorted((t for t in range(len(self.table_rows)) if t not in split),
                       key=lambda t: -self.table_rows[t])
        for t in whole:
            s = min(range(e), key=lambda i: load[i])
            owner[t] = s
            offset[t][s] = load[s]
            load[s] += self.table_rows[t]
            pieces[s].append(self.table_rows[t])
        return owner, pieces, offset

    def server_pieces(self, server: int) -> list[int]:
        return self._placement()[1][server]

    def routing(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        owner, _, offset = self._placement()
        return (torch.tensor(owner), torch.tensor(offset, dtype=torch.long),
                torch.tensor([o < 0 for o in owner]))


def serve(plan: ShardingPlan, server: int, dim: int, optimizer: str, lr: float,
          seed: int) -> EmbeddingTables:
    """Hold this server's pieces; the RPC agent answers requests until shutdown."""
    global _LOCAL_TABLES
    torch.set_num_threads(1)
    _LOCAL_TABLES = EmbeddingTables(plan.server_pieces(server), dim, optimizer=optimizer, lr=lr,
                                    seed=seed * 7919 + server)
    return _LOCAL_TABLES


def _lookup(rows: torch.Tensor) -> torch.Tensor:
    assert _LOCAL_TABLES is not None, "not an embedding server"
    return _LOCAL_TABLES.lookup_rows(rows)


def _apply(rows: torch.Tensor, grads: torch.Tensor) -> None:
    """`rows` are unique: the client summed the gradients of repeated ids."""
    assert _LOCAL_TABLES is not None, "not an embedding server"
    _LOCAL_TABLES.apply_rows(rows, grads, unique=True)


def _update_and_lookup(rows: torch.Tensor, grads: torch.Tensor,
                       lookup_rows: torch.Tensor) -> torch.Tensor:
    _apply(rows, grads)
    return _lookup(lookup_rows)


class RemoteEmbeddings:
    """The client a trainer and its workers use in place of local `EmbeddingTables`.

    Picklable before `attach`: it is built by the trainer and sent to each worker process,
    which then joins the RPC world under its own name.
    """

    MAX_PENDING_PUSHES = 4  # bound the gradients in flight so a slow server applies back-pressure

    def __init__(self, plan: ShardingPlan, layout: ClusterLayout, endpoint: RpcEndpoint,
                 dim: int, ranks: dict[str, int]) -> None:
        self.plan = plan
        self.layout = layout
        self.endpoint = endpoint
        self.dim = dim
        self.ranks = ranks  # RPC rank by the name a process attaches under
        self._pending: list[torch.futures.Future] = []
        self._routing: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._last: _Requests | None = None

    def attach(self, name: str) -> None:
        self.endpoint.join(name, self.ranks[name], self.layout.rpc_world_size)
        self._routing = self.plan.routing()

    def detach(self) -> None:
        self.flush()
        RpcEndpoint.leave()

    def _route(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """ids [B, T] -> (server [B*T], row on that server [B*T])."""
        assert self._routing is not None, "attach() first"
        owner, offset, split = self._routing
        e = self.plan.servers
        server = torch.where(split, ids % e, owner.expand_as(ids))
        row_in_table = torch.where(split, ids // e, ids)
        base = offset.gather(1, server.t()).t() if e > 1 else offset[:, 0].expand_as(ids)
        return server.reshape(-1), (base + row_in_table).reshape(-1)

    def _requests(self, ids: torch.Tensor) -> _Requests:
        """Which distinct rows each server is asked for. Ads ids are heavily skewed, so a batch
        repeats many of them (about 3 in 4 here): each distinct row travels once."""
        if self._last is not None and self._last.ids is ids:
            return self._last
        server, rows = self._route(ids)
        keys, inverse = torch.unique(server * (1 << 40) + rows, return_inverse=True)
        key_server = keys >> 40
        per_server = []
        for s in range(self.plan.servers):
            pos = (key_server == s).nonzero().squeeze(1) if self.plan.servers > 1 else None
            sel = keys if pos is None else keys[pos]
            if len(sel):
                per_server.append((s, pos, sel & ((1 << 40) - 1)))
        self._last = _Requests(ids, len(keys), inverse, per_server)
        return self._last

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        req = self._requests(ids)
        calls = {s: rpc.rpc_async(ClusterLayout.embedding_name(s), _lookup, args=(rows,))
                 for s, _, rows in req.per_server}
        return self._gather(req, calls, ids)

    def _gather(self, req: _Requests, calls: dict[int, torch.futures.Future],
                ids: torch.Tensor) -> torch.Tensor:
        if len(req.per_server) == 1 and req.per_server[0][1] is None:
            distinct = calls[req.per_server[0][0]].wait()
        else:
            distinct = torch.empty(req.distinct, self.dim)
            for s, pos, _ in req.per_server:
                distinct.index_copy_(0, pos, calls[s].wait())
        return distinct.index_select(0, req.inverse).view(*ids.shape, self.dim)

    def _summed(self, req: _Requests, grads: torch.Tensor) -> torch.Tensor:
        return torch.zeros(req.distinct, self.dim).index_add_(
            0, req.inverse, grads.reshape(-1, self.dim).detach())

    def apply_gradients(self, ids: torch.Tensor, grads: torch.Tensor) -> None:
        """Push asynchronously; waits only when too many pushes are still in flight."""
        self.update_and_lookup(ids, grads, None)

    def update_and_lookup(self, ids: torch.Tensor, grads: torch.Tensor,
                          next_ids: torch.Tensor | None) -> torch.Tensor | None:
        """Push one step's gradients and fetch the next step's rows in one call per server,
        halving the round trips of a training step. The server applies the update before
        reading, so the next step sees it."""
        done = self._requests(ids)
        summed = self._summed(done, grads)
        pushes = {s: (rows, summed if pos is None else summed.index_select(0, pos))
                  for s, pos, rows in done.per_server}
        if next_ids is None:
            self._push_async(pushes)
            return None
        nxt = self._requests(next_ids)
        calls = {}
        for s, _, rows in nxt.per_server:
            name = ClusterLayout.embedding_name(s)
            if s in pushes:
                calls[s] = rpc.rpc_async(name, _update_and_lookup, args=(*pushes.pop(s), rows))
            else:
                calls[s] = rpc.rpc_async(name, _lookup, args=(rows,))
        self._push_async(pushes)  # servers the next batch does not need
        return self._gather(nxt, calls, next_ids)

    def _push_async(self, pushes: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
        for s, (rows, part) in pushes.items():
            self._pending.append(rpc.rpc_async(ClusterLayout.embedding_name(s), _apply,
                                               args=(rows, part)))
        while len(self._pending) > self.MAX_PENDING_PUSHES * self.plan.servers:
            self._pending.pop(0).wait()

    def flush(self) -> None:
        for fut in self._pending:
            fut.wait()
        self._pending.clear()


@dataclass
class _Requests:
    ids: torch.Tensor  # the batch these were computed for
    distinct: int
    inverse: torch.Tensor  # position of every (example, table) among the distinct rows
    per_server: list[tuple[int, torch.Tensor | None, torch.Tensor]]  # server, positions, rows
