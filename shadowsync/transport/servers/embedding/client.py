"""The client of the embedding servers, `RemoteEmbeddings`: an `EmbeddingClient` that reaches
servers on its host through their shared-memory files and the others over RPC, one request
per server for a batch's distinct rows, blocking (`update_and_lookup`) or, for a worker that
asks for its rows ahead (`--prefetch`, `shadowsync.train.prefetch`), answered later
(`fetch`, `update_and_fetch`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed.rpc as rpc

from shadowsync.data.bags import Bags
from shadowsync.embeddings import EmbeddingTables
from shadowsync.embeddings.dynamic import server_of
from shadowsync.embeddings.dynamic_tables import (
    HOLD,
    READ,
    TRAIN,
    DynamicSpec,
    DynamicTables,
    keys_of,
    merge_counters,
)
from shadowsync.embeddings.unique import unique_with_inverse
from shadowsync.transport import shm
from shadowsync.transport.layout import ClusterLayout
from shadowsync.transport.rpc import RpcEndpoint
from shadowsync.transport.servers.embedding.plan import RowKeys, ShardingPlan
from shadowsync.transport.servers.embedding.server import (
    LOCAL_CALLS,
    REMOTE_CALLS,
    attached,
    counters,
    in_order,
    shared_info,
)

# --prefetch auto's depth where a trainer reaches some table shard over RPC.
AUTO_PREFETCH = 1


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
                 private: dict[int, EmbeddingTables] | None = None,
                 prefetch: str = "0") -> None:
        if transport not in self.TRANSPORTS:
            raise ValueError(f"transport must be one of {self.TRANSPORTS}, got {transport!r}")
        self.prefetch = prefetch  # --prefetch: a depth, or "auto" (`prefetch_depth`)
        self.prefetch_depth = 0  # steps ahead its workers ask for rows: known once attached
        self.plan = plan
        self.layout = layout
        self.endpoint = endpoint
        self.dim = dim
        self.ranks = ranks  # RPC rank by the name a process attaches under
        self.transport = transport
        self.profile: dict[str, float] | None = None  # seconds per phase, when set to a dict
        self._pending: list[torch.futures.Future] = []
        self._last_sent: dict[int, torch.futures.Future] = {}  # per server, sent in order
        self._numbered: dict[int, int] = {}  # per server, calls sent in order so far
        self._keys: RowKeys | None = None
        self._last: _Requests | None = None
        self._shared: dict[int, EmbeddingTables | DynamicTables] = {}
        self._private = private or {}
        self._user = 0  # this client's token: as a holder of rows, for its numbered calls

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_pending=[], _last_sent={}, _numbered={}, _last=None, _shared={},
                     _keys=None)
        return state

    def attach(self, name: str) -> None:
        self.endpoint.join(name, self.ranks[name], self.layout.rpc_world_size)
        self._keys = self.plan.keys()
        self._user = -(self.ranks[name] + 1)  # unique in the job, and no pid (those are > 0)
        self._shared = dict(self._private)
        for s in range(self.plan.servers):
            server = ClusterLayout.embedding_name(s)
            if self.transport == "auto" and s not in self._shared:
                mapped = _map_shared(rpc.rpc_sync(server, shared_info), self.plan.dynamic)
                if mapped is not None:
                    self._shared[s] = mapped
            rpc.rpc_sync(server, attached)
        self.prefetch_depth = prefetch_depth(self.prefetch, self.plan.servers - len(self._shared),
                                             self.plan.dynamic is not None)

    def _release_holds(self) -> None:
        """Dynamic tables: this client holds no rows any more, on any server (one already
        gone, as when a stopped job ends, took them along)."""
        for s in range(self.plan.servers):
            try:
                self._call(s, "release", self._user).wait()
            except Exception:  # noqa: BLE001 - a server that has left holds nothing
                pass

    @property
    def shared_servers(self) -> list[int]:
        """Servers this client reaches through shared memory rather than RPC."""
        return sorted(self._shared)

    def detach(self) -> None:
        self.flush()
        if self.plan.dynamic is not None and self._user:
            self._release_holds()
        self._shared.clear()
        RpcEndpoint.leave()

    def _requests(self, ids: torch.Tensor | Bags, level: int = READ) -> _Requests:
        """Which distinct rows each server is asked for. Ads ids are heavily skewed, so a batch
        repeats many of them (about 3 in 4 here): each distinct row travels once. With
        dynamic tables the servers' maps say the rows first, resolved at `level` (see
        `DynamicTables`: read, held, or a training step's)."""
        last = self._last
        if (last is not None and last.ids is ids
                and (last.level >= level or self.plan.dynamic is None)):
            return last
        assert self._keys is not None, "attach() first"
        if self.plan.dynamic is not None:
            with self._timed("resolve"):
                row_keys = self._resolve(ids, level)
        else:
            row_keys = self._keys.keys(ids)
        with self._timed("route_unique"):
            keys, inverse = unique_with_inverse(row_keys)
            start = self._keys.starts
            bounds = torch.searchsorted(keys, start).tolist()
            per_server = []
            for s in range(self.plan.servers):
                lo, hi = bounds[s], bounds[s + 1]
                if hi > lo:
                    span = None if hi - lo == len(keys) else slice(lo, hi)
                    per_server.append((s, span, keys[lo:hi] - start[s]))
        self._last = _Requests(ids, len(keys), inverse, per_server, level)
        return self._last

    def _resolve(self, ids: torch.Tensor | Bags, level: int) -> torch.Tensor:
        """Dynamic tables: each lookup's row, as a key of the servers' rows end to end. An
        id goes to the server its key names; that server's map gives its row. A held batch
        keeps the one before held too (its gradients are pushed after this resolve); pushes
        older still are waited for first, as their rows are held no more."""
        raw = keys_of(ids)
        servers = self.plan.servers
        args = (ids.shape[0], level, self._user, True)
        if level > READ:
            self.flush()
        if servers == 1:  # its rows are the keys already (the first server's start at 0)
            return self._call(0, "resolve", raw, *args).wait()
        owner = torch.from_numpy(server_of(raw.numpy(), servers))
        out = torch.empty_like(raw)
        assert self._keys is not None
        calls = []
        for s in range(servers):
            at = (owner == s).nonzero().squeeze(1)
            calls.append((at, self._call(s, "resolve", raw.index_select(0, at), *args),
                          int(self._keys.starts[s])))
        for at, fut, start in calls:
            out[at] = fut.wait() + start
        return out

    def counters(self) -> dict[str, int] | None:
        """Dynamic tables: the id maps' counters over every server (None: fixed tables)."""
        if self.plan.dynamic is None:
            return None
        return merge_counters([rpc.rpc_sync(ClusterLayout.embedding_name(s), counters)
                               for s in range(self.plan.servers)])

    def _call(self, s: int, kind: str, *args: Any) -> torch.futures.Future:
        """One request to server `s`: in place when its tables are mapped here, else RPC."""
        local = self._shared.get(s)
        if local is None:
            return rpc.rpc_async(ClusterLayout.embedding_name(s), REMOTE_CALLS[kind], args=args)
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(LOCAL_CALLS[kind](local, *args))
        return fut

    def _call_in_order(self, s: int, kind: str, *args: Any) -> torch.futures.Future:
        """`_call`, run by server `s` after this client's earlier calls made this way: its
        thread pool would run calls that arrive together at once, in any order, and a
        pipeline's staleness bound needs them applied in the order made. Over RPC each call
        is numbered (`server.in_order`), so several can be on their way at once; in place
        they run as they are made."""
        if s in self._shared:
            return self._call(s, kind, *args)
        number = self._numbered.get(s, 0)
        self._numbered[s] = number + 1
        fut = rpc.rpc_async(ClusterLayout.embedding_name(s), in_order,
                            args=(self._user, number, kind, *args))
        self._last_sent[s] = fut
        return fut

    def lookup(self, ids: torch.Tensor | Bags) -> torch.Tensor:
        return self.fetch(ids, in_order=False).rows()

    def fetch(self, ids: torch.Tensor | Bags, in_order: bool = True) -> RowFetch:
        """`lookup`'s rows, asked for now and read by `RowFetch.rows()`, after this client's
        earlier calls to each server (`in_order`)."""
        req = self._requests(ids)
        call = self._call_in_order if in_order else self._call
        return RowFetch(self, req, {s: call(s, "lookup", rows) for s, _, rows in req.per_server})

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
        fetched = self._send(self._requests(ids, HOLD), grads, next_ids, lr_scale, self._call)
        return None if fetched is None else fetched.rows()

    def update_and_fetch(self, done: RowFetch, grads: torch.Tensor,
                         next_ids: torch.Tensor | Bags | None,
                         lr_scale: float = 1.0) -> RowFetch | None:
        """`update_and_lookup` for the batch `done` was fetched for, waiting for nothing: the
        next rows come in the `RowFetch`, and each server takes this client's calls in the
        order made, so they are read after every gradient pushed before them."""
        return self._send(done.requests, grads, next_ids, lr_scale, self._call_in_order)

    def _send(self, done: _Requests, grads: torch.Tensor, next_ids: torch.Tensor | Bags | None,
              lr_scale: float, call: Any) -> RowFetch | None:
        summed = self._summed(done, grads)
        # A slice of `summed` is cloned: RPC would send the whole tensor a view lives in.
        pushes = {s: (rows, summed if span is None else summed[span].clone(), lr_scale)
                  for s, span, rows in done.per_server}
        if next_ids is None:
            self._push_async(pushes, call)
            return None
        nxt = self._requests(next_ids, TRAIN)
        calls = {}
        with self._timed("send"):
            for s, _, rows in nxt.per_server:
                if s in pushes:
                    calls[s] = call(s, "update_and_lookup", *pushes.pop(s), rows)
                else:
                    calls[s] = call(s, "lookup", rows)
            self._push_async(pushes, call)  # servers the next batch does not need
        return RowFetch(self, nxt, calls)

    def _push_async(self, pushes: dict[int, tuple[torch.Tensor, torch.Tensor, float]],
                    call: Any) -> None:
        for s, push in pushes.items():
            self._pending.append(call(s, "apply", *push))
        while len(self._pending) > self.MAX_PENDING_PUSHES * self.plan.servers:
            self._pending.pop(0).wait()

    def saved_here(self) -> None:
        return None  # the servers save their rows

    def flush(self) -> None:
        for fut in [*self._pending, *self._last_sent.values()]:
            fut.wait()
        self._pending.clear()
        self._last_sent.clear()

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


def prefetch_depth(setting: str, servers_over_rpc: int, dynamic: bool) -> int:
    """Steps ahead a worker asks for its rows under --prefetch `setting`: the depth given, or
    for "auto" `AUTO_PREFETCH` where some of the servers are reached over RPC and the tables
    are fixed (dynamic tables resolve a batch's rows in a blocking round trip that holds
    them), else 0: rows read in place cost no round trip to hide."""
    if setting != "auto":
        return int(setting)
    return AUTO_PREFETCH if servers_over_rpc and not dynamic else 0


def _map_shared(info: dict[str, Any] | None, dynamic: DynamicSpec | None
                ) -> EmbeddingTables | DynamicTables | None:
    """A server's tables mapped from its shared-memory files, when it runs on this host."""
    if info is None or info["host"] != shm.host_id():
        return None
    if dynamic is not None:
        try:
            mapped = {name: shm.map_file(info["paths"][name], shape, dtype=dtype)
                      for name, (shape, dtype) in info["shapes"].items()}
        except (OSError, ValueError, RuntimeError):
            return None
        return dynamic.build(info["dim"], info["seed"], info["lock"], tensors=mapped,
                             optimizer=info["optimizer"], lr=info["lr"],
                             initial_accumulator=info["initial_accumulator"],
                             weight_decay=info["weight_decay"])
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
class RowFetch:
    """A batch's rows on their way: `rows()` waits for them (`lookup`'s vectors)."""

    client: RemoteEmbeddings
    requests: _Requests
    calls: dict[int, torch.futures.Future]

    def rows(self) -> torch.Tensor:
        return self.client._gather(self.requests, self.calls, self.requests.ids)

    def wait(self) -> None:
        """Every call answered, the rows unread (a fetch dropped)."""
        for fut in self.calls.values():
            fut.wait()


@dataclass
class _Requests:
    ids: torch.Tensor | Bags  # the batch these were computed for
    distinct: int
    inverse: torch.Tensor  # position of every (example, table) among the distinct rows
    # server, its distinct rows' span among all of them (None: all), its rows
    per_server: list[tuple[int, slice | None, torch.Tensor]]
    level: int = READ  # dynamic tables: how the rows were resolved (read, held, trained)
