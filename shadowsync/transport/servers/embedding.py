"""Embedding parameter servers: model-parallel tables shared by every trainer.

Tables are placed whole on servers (table-wise sharding, greedily balancing rows), except a
table above `row_split_limit` rows, which is cut row-wise over every server (id % E picks the
server, id // E the row there). There is one copy of each row in the job: trainers look rows
up and push sparse gradients, and the server applies SGD or row-wise Adagrad in place, from
many RPC threads at once without locks (Hogwild on the server). Embeddings are never averaged.
"""

from __future__ import annotations

import atexit
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed.rpc as rpc

from shadowsync.embeddings import EmbeddingTables
from shadowsync.embeddings.pooling import Bags
from shadowsync.embeddings.unique import unique_with_inverse
from shadowsync.transport import shm
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

    def keys(self) -> RowKeys:
        """Every (table, id) as one integer key, the servers' rows laid end to end."""
        owner, pieces, offset = self._placement()
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


@dataclass
class _SharedFiles:
    """The shared-memory files holding this server's tables, for clients on its host."""

    paths: dict[str, str]  # "weight", and "state" under Adagrad -> file
    clients_left: int | None  # unlinked once this many clients have attached
    lock: threading.Lock = field(default_factory=threading.Lock)


_SHARED: _SharedFiles | None = None
# Seconds spent applying updates and reading rows in this process (a profile, see bench
# embedding): on a server for RPC clients, in a client for the shards it maps itself.
PROFILE = {"apply_s": 0.0, "lookup_s": 0.0, "calls": 0}


def serve(plan: ShardingPlan, server: int, dim: int, table_optimizer: dict[str, Any],
          seed: int, share: bool = True, clients: int | None = None) -> EmbeddingTables:
    """Hold this server's pieces; the RPC agent answers requests until shutdown.

    With `share`, the weights and optimizer state live in files under /dev/shm so that
    clients on the same host update them in place (Hogwild, as the server's own RPC threads
    do) instead of sending them over RPC; the names go once `clients` clients attached (the
    mappings stay), or when `release()` runs or the process exits. `table_optimizer` is how
    the rows learn (`TrainConfig.table_optimizer()`).
    """
    global _LOCAL_TABLES, _SHARED
    torch.set_num_threads(1)
    tables = EmbeddingTables(plan.server_pieces(server), dim, seed=seed * 7919 + server,
                             **table_optimizer)
    if share and shm.available():
        paths = {"weight": shm.new_path(f"emb{server}-weight")}
        tables.weight = shm.to_shared_file(tables.weight, paths["weight"])
        if tables.state is not None:
            paths["state"] = shm.new_path(f"emb{server}-state")
            tables.state = shm.to_shared_file(tables.state, paths["state"])
        _SHARED = _SharedFiles(paths, clients)
        atexit.register(release)
    _LOCAL_TABLES = tables
    return tables


def release() -> None:
    """Remove this server's shared-memory names (idempotent)."""
    shared = _SHARED
    if shared is not None:
        with shared.lock:
            for path in shared.paths.values():
                shm.unlink(path)


def _server_tables() -> EmbeddingTables:
    assert _LOCAL_TABLES is not None, "not an embedding server"
    return _LOCAL_TABLES


def _lookup_in(tables: EmbeddingTables, rows: torch.Tensor) -> torch.Tensor:
    t0 = time.perf_counter()
    out = tables.lookup_rows(rows)
    PROFILE["lookup_s"] += time.perf_counter() - t0
    PROFILE["calls"] += 1
    return out


def _apply_in(tables: EmbeddingTables, rows: torch.Tensor, grads: torch.Tensor,
              lr_scale: float) -> None:
    """`rows` are unique: the client summed the gradients of repeated ids."""
    t0 = time.perf_counter()
    tables.apply_rows(rows, grads, unique=True, lr_scale=lr_scale)
    PROFILE["apply_s"] += time.perf_counter() - t0
    PROFILE["calls"] += 1


def _update_and_lookup_in(tables: EmbeddingTables, rows: torch.Tensor, grads: torch.Tensor,
                          lr_scale: float, lookup_rows: torch.Tensor) -> torch.Tensor:
    _apply_in(tables, rows, grads, lr_scale)
    return _lookup_in(tables, lookup_rows)


def _lookup(rows: torch.Tensor) -> torch.Tensor:
    return _lookup_in(_server_tables(), rows)


def _apply(rows: torch.Tensor, grads: torch.Tensor, lr_scale: float) -> None:
    _apply_in(_server_tables(), rows, grads, lr_scale)


def _update_and_lookup(rows: torch.Tensor, grads: torch.Tensor, lr_scale: float,
                       lookup_rows: torch.Tensor) -> torch.Tensor:
    return _update_and_lookup_in(_server_tables(), rows, grads, lr_scale, lookup_rows)


def _echo(rows: torch.Tensor, grads: torch.Tensor, lookup_rows: torch.Tensor) -> torch.Tensor:
    """No work, the reply of a lookup's size: what moving the bytes alone costs (profiling)."""
    return torch.empty(len(lookup_rows), grads.shape[1] if grads.dim() == 2 else 1)


def _profile(reset: bool = True) -> dict[str, float]:
    out = dict(PROFILE)
    if reset:
        PROFILE.update(apply_s=0.0, lookup_s=0.0, calls=0)
    return out


def _shared_info() -> dict[str, Any] | None:
    """How a client on this host maps this server's tables (None when not shared)."""
    if _SHARED is None:
        return None
    t = _server_tables()
    return {"host": shm.host_id(), "paths": dict(_SHARED.paths), "rows": t.rows, "dim": t.dim,
            "optimizer": t.optimizer.value, "lr": t.lr, "eps": t.eps,
            "weight_decay": t.weight_decay}


def _attached() -> None:
    """A client has attached (and mapped the files if it could)."""
    shared = _SHARED
    if shared is None or shared.clients_left is None:
        return
    with shared.lock:
        shared.clients_left -= 1
        done = shared.clients_left <= 0
    if done:
        release()


_LOCAL_CALLS: dict[str, Callable[..., Any]] = {
    "lookup": _lookup_in, "apply": _apply_in, "update_and_lookup": _update_and_lookup_in}
_REMOTE_CALLS: dict[str, Callable[..., Any]] = {
    "lookup": _lookup, "apply": _apply, "update_and_lookup": _update_and_lookup}


class RemoteEmbeddings:
    """The client a trainer and its workers use in place of local `EmbeddingTables`.

    Picklable before `attach`: it is built by the trainer and sent to each worker process,
    which then joins the RPC world under its own name. With `transport="auto"`, shards whose
    server runs on this host (and shares its tables) are read and updated in place through
    shared memory, the others over RPC; `"rpc"` sends every request over RPC. Both run the
    same update on the same rows, so a lone client gets bitwise the same results either way.
    `private` (per server: tables in this trainer's shared memory) replaces the servers' tables
    by a private copy, which makes the unshared ceiling the shared path is measured against.
    """

    MAX_PENDING_PUSHES = 4  # bound the gradients in flight so a slow server applies back-pressure
    TRANSPORTS = ("auto", "rpc")

    def __init__(self, plan: ShardingPlan, layout: ClusterLayout, endpoint: RpcEndpoint,
                 dim: int, ranks: dict[str, int], transport: str = "auto",
                 private: dict[int, EmbeddingTables] | None = None) -> None:
        if transport not in self.TRANSPORTS:
            raise ValueError(f"transport must be one of {self.TRANSPORTS}, got {transport!r}")
        self.plan = plan
        self.layout = layout
        self.endpoint = endpoint
        self.dim = dim
        self.ranks = ranks  # RPC rank by the name a process attaches under
        self.transport = transport
        self.profile: dict[str, float] | None = None  # seconds per phase, when set to a dict
        self._pending: list[torch.futures.Future] = []
        self._keys: RowKeys | None = None
        self._last: _Requests | None = None
        self._shared: dict[int, EmbeddingTables] = {}
        self._private = private or {}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_pending=[], _last=None, _shared={}, _keys=None)
        return state

    def attach(self, name: str) -> None:
        self.endpoint.join(name, self.ranks[name], self.layout.rpc_world_size)
        self._keys = self.plan.keys()
        self._shared = dict(self._private)
        for s in range(self.plan.servers):
            server = ClusterLayout.embedding_name(s)
            if self.transport == "auto" and s not in self._shared:
                mapped = _map_shared(rpc.rpc_sync(server, _shared_info))
                if mapped is not None:
                    self._shared[s] = mapped
            rpc.rpc_sync(server, _attached)

    @property
    def shared_servers(self) -> list[int]:
        """Servers this client reaches through shared memory rather than RPC."""
        return sorted(self._shared)

    def detach(self) -> None:
        self.flush()
        self._shared.clear()
        RpcEndpoint.leave()

    def _requests(self, ids: torch.Tensor | Bags) -> _Requests:
        """Which distinct rows each server is asked for. Ads ids are heavily skewed, so a batch
        repeats many of them (about 3 in 4 here): each distinct row travels once."""
        if self._last is not None and self._last.ids is ids:
            return self._last
        assert self._keys is not None, "attach() first"
        with self._timed("route_unique"):
            keys, inverse = unique_with_inverse(self._keys.keys(ids))
            start = self._keys.starts
            bounds = torch.searchsorted(keys, start).tolist()
            per_server = []
            for s in range(self.plan.servers):
                lo, hi = bounds[s], bounds[s + 1]
                if hi > lo:
                    span = None if hi - lo == len(keys) else slice(lo, hi)
                    per_server.append((s, span, keys[lo:hi] - start[s]))
        self._last = _Requests(ids, len(keys), inverse, per_server)
        return self._last

    def _call(self, s: int, kind: str, *args: Any) -> torch.futures.Future:
        """One request to server `s`: in place when its tables are mapped here, else RPC."""
        local = self._shared.get(s)
        if local is None:
            return rpc.rpc_async(ClusterLayout.embedding_name(s), _REMOTE_CALLS[kind], args=args)
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(_LOCAL_CALLS[kind](local, *args))
        return fut

    def lookup(self, ids: torch.Tensor | Bags) -> torch.Tensor:
        req = self._requests(ids)
        calls = {s: self._call(s, "lookup", rows) for s, _, rows in req.per_server}
        return self._gather(req, calls, ids)

    def _gather(self, req: _Requests, calls: dict[int, torch.futures.Future],
                ids: torch.Tensor | Bags) -> torch.Tensor:
        with self._timed("wait"):
            replies = {s: fut.wait() for s, fut in calls.items()}
        with self._timed("gather"):
            if len(req.per_server) == 1 and req.per_server[0][1] is None:
                distinct = replies[req.per_server[0][0]]
            else:
                distinct = torch.empty(req.distinct, self.dim)
                for s, span, _ in req.per_server:
                    distinct[span] = replies[s]
            if isinstance(ids, Bags):
                return ids.pool(distinct, req.inverse)
            return distinct.index_select(0, req.inverse).view(*ids.shape, self.dim)

    def _summed(self, req: _Requests, grads: torch.Tensor) -> torch.Tensor:
        with self._timed("sum_grads"):
            grads = grads.detach()
            per_row = (req.ids.unpool(grads) if isinstance(req.ids, Bags)
                       else grads.reshape(-1, self.dim))
            return torch.zeros(req.distinct, self.dim).index_add_(0, req.inverse, per_row)

    def apply_gradients(self, ids: torch.Tensor | Bags, grads: torch.Tensor,
                        lr_scale: float = 1.0) -> None:
        """Push asynchronously; waits only when too many pushes are still in flight."""
        self.update_and_lookup(ids, grads, None, lr_scale)

    def update_and_lookup(self, ids: torch.Tensor | Bags, grads: torch.Tensor,
                          next_ids: torch.Tensor | Bags | None,
                          lr_scale: float = 1.0) -> torch.Tensor | None:
        """Push one step's gradients (applied at `lr_scale` times the tables' learning rate)
        and fetch the next step's rows in one call per server, halving the round trips of a
        training step. The server applies the update before reading, so the next step sees
        it."""
        done = self._requests(ids)
        summed = self._summed(done, grads)
        # A slice of `summed` is cloned: RPC would send the whole tensor a view lives in.
        pushes = {s: (rows, summed if span is None else summed[span].clone(), lr_scale)
                  for s, span, rows in done.per_server}
        if next_ids is None:
            self._push_async(pushes)
            return None
        nxt = self._requests(next_ids)
        calls = {}
        with self._timed("send"):
            for s, _, rows in nxt.per_server:
                if s in pushes:
                    calls[s] = self._call(s, "update_and_lookup", *pushes.pop(s), rows)
                else:
                    calls[s] = self._call(s, "lookup", rows)
            self._push_async(pushes)  # servers the next batch does not need
        return self._gather(nxt, calls, next_ids)

    def _push_async(self, pushes: dict[int, tuple[torch.Tensor, torch.Tensor, float]]) -> None:
        for s, push in pushes.items():
            self._pending.append(self._call(s, "apply", *push))
        while len(self._pending) > self.MAX_PENDING_PUSHES * self.plan.servers:
            self._pending.pop(0).wait()

    def flush(self) -> None:
        for fut in self._pending:
            fut.wait()
        self._pending.clear()

    def _timed(self, phase: str) -> Any:
        return _PhaseTimer(self.profile, phase)


class _PhaseTimer:
    """Adds the seconds of a `with` block to profile[phase] (nothing when profile is None)."""

    __slots__ = ("profile", "phase", "t0")

    def __init__(self, profile: dict[str, float] | None, phase: str) -> None:
        self.profile, self.phase, self.t0 = profile, phase, 0.0

    def __enter__(self) -> None:
        if self.profile is not None:
            self.t0 = time.perf_counter()

    def __exit__(self, *exc: Any) -> None:
        if self.profile is not None:
            self.profile[self.phase] = (self.profile.get(self.phase, 0.0)
                                        + time.perf_counter() - self.t0)


def _map_shared(info: dict[str, Any] | None) -> EmbeddingTables | None:
    """A server's tables mapped from its shared-memory files, when it runs on this host."""
    if info is None or info["host"] != shm.host_id():
        return None
    rows, dim = info["rows"], info["dim"]
    try:
        weight = shm.map_file(info["paths"]["weight"], (sum(rows), dim))
        state = (shm.map_file(info["paths"]["state"], (sum(rows),))
                 if "state" in info["paths"] else None)
    except (OSError, ValueError, RuntimeError):  # names already gone: RPC it is
        return None
    return EmbeddingTables.from_tensors(rows, dim, info["optimizer"], info["lr"], info["eps"],
                                        weight, state, info.get("weight_decay", 0.0))


@dataclass
class _Requests:
    ids: torch.Tensor | Bags  # the batch these were computed for
    distinct: int
    inverse: torch.Tensor  # position of every (example, table) among the distinct rows
    # server, its distinct rows' span among all of them (None: all), its rows
    per_server: list[tuple[int, slice | None, torch.Tensor]]
