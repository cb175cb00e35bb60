"""One embedding server process: its pieces of the tables (`plan`), in /dev/shm files that
clients on its host map, and the RPC functions that look rows up and apply sparse gradients
in place (from many RPC threads at once, without locks: Hogwild on the server). `PROFILE`
counts the seconds spent applying and reading (see `shadowsync bench embedding`): on a server
for RPC clients, in a client for the shards it maps itself."""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed.rpc as rpc

from shadowsync.embeddings import EmbeddingTables, SparseOptimizer
from shadowsync.embeddings.dynamic_tables import DynamicSpec, DynamicTables, holder_bytes
from shadowsync.transport import shm
from shadowsync.transport.servers.embedding.plan import ShardingPlan

# Set in each embedding-server process; the RPC functions below run there.
_LOCAL_TABLES: EmbeddingTables | DynamicTables | None = None


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
          seed: int, share: bool = True, clients: int | None = None
          ) -> EmbeddingTables | DynamicTables:
    """Hold this server's pieces; the RPC agent answers requests until shutdown.

    With `share`, the weights and optimizer state live in files under /dev/shm so that
    clients on the same host update them in place (Hogwild, as the server's own RPC threads
    do) instead of sending them over RPC; the names go once `clients` clients attached (the
    mappings stay), or when `release()` runs or the process exits. `table_optimizer` is how
    the rows learn (`TrainConfig.table_optimizer()`).
    """
    global _LOCAL_TABLES, _SHARED
    torch.set_num_threads(1)
    if plan.dynamic is not None:
        return _serve_dynamic(plan.dynamic, server, dim, table_optimizer, seed, share, clients)
    tables = EmbeddingTables(plan.server_pieces(server), dim, seed=seed * 7919 + server,
                             **plan.server_optimizer(server, table_optimizer))
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


def shared_bytes(plan: ShardingPlan, server: int, dim: int,
                 table_optimizer: dict[str, Any]) -> int:
    """The bytes `serve(plan, server, dim, table_optimizer, share=True)` puts in /dev/shm,
    without making them: float32 rows of `dim` and, under Adagrad, one accumulator a row;
    dynamic tables, their pool and id map (`holder_bytes`)."""
    if plan.dynamic is not None:
        return holder_bytes(plan.dynamic.capacity, dim, plan.dynamic.admit_after)
    adagrad = SparseOptimizer(table_optimizer["optimizer"]) is SparseOptimizer.ADAGRAD
    return sum(plan.server_pieces(server)) * 4 * (dim + int(adagrad))


def _serve_dynamic(spec: DynamicSpec, server: int, dim: int, table_optimizer: dict[str, Any],
                   seed: int, share: bool, clients: int | None) -> DynamicTables:
    """A dynamic server: its pool, optimizer state and id map (in shared files for clients
    on its host, which then map ids and update rows in place under the map's lock file)."""
    global _LOCAL_TABLES, _SHARED
    tables = spec.build(dim, seed * 7919 + server, **table_optimizer)
    if share and shm.available():
        paths = {name: shm.new_path(f"emb{server}-{name.replace('/', '-')}")
                 for name in tables.tensors()}
        shared = {name: shm.to_shared_file(t, paths[name]) for name, t in tables.tensors().items()}
        # Clients open the map's lock file when they map the tables: its name goes with
        # the others once they all have.
        paths["lock"] = shm.new_path(f"emb{server}-lock")
        tables = spec.build(dim, seed * 7919 + server, paths["lock"], tensors=shared,
                            **table_optimizer)
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


def _server_tables() -> Any:
    """This server's `EmbeddingTables` or `DynamicTables`."""
    assert _LOCAL_TABLES is not None, "not an embedding server"
    return _LOCAL_TABLES


def _resolve(keys: torch.Tensor, examples: int, level: int, user: int,
             keep_previous: bool) -> torch.Tensor:
    """Dynamic tables: the rows of raw-id keys this server owns, held for client `user`
    (see `DynamicTables.resolve`)."""
    t0 = time.perf_counter()
    rows = _server_tables().resolve(keys, examples, level, user, keep_previous)
    PROFILE["lookup_s"] += time.perf_counter() - t0
    return rows


def _release(user: int) -> None:
    """Dynamic tables: client `user` holds no rows of this server any more."""
    _server_tables().release(user)


def counters() -> dict[str, int] | None:
    """Dynamic tables: this server's id-map counters (None for fixed tables)."""
    tables = _server_tables()
    return tables.counters() if isinstance(tables, DynamicTables) else None


def _lookup_in(tables: Any, rows: torch.Tensor) -> torch.Tensor:
    t0 = time.perf_counter()
    out = tables.lookup_rows(rows)
    PROFILE["lookup_s"] += time.perf_counter() - t0
    PROFILE["calls"] += 1
    return out


def _apply_in(tables: Any, rows: torch.Tensor, grads: torch.Tensor,
              lr_scale: float) -> None:
    """`rows` are unique: the client summed the gradients of repeated ids."""
    t0 = time.perf_counter()
    tables.apply_rows(rows, grads, unique=True, lr_scale=lr_scale)
    PROFILE["apply_s"] += time.perf_counter() - t0
    PROFILE["calls"] += 1


def _update_and_lookup_in(tables: Any, rows: torch.Tensor, grads: torch.Tensor,
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


def shared_info() -> dict[str, Any] | None:
    """How a client on this host maps this server's tables (None when not shared)."""
    if _SHARED is None:
        return None
    t = _server_tables()
    if isinstance(t, DynamicTables):
        return {"host": shm.host_id(), "paths": dict(_SHARED.paths), "lock": t.lock.path,
                "shapes": {k: (tuple(v.shape), v.dtype) for k, v in t.tensors().items()},
                "dim": t.dim, "seed": t.seed, "optimizer": t.pool.optimizer.value,
                "lr": t.pool.lr, "initial_accumulator": t.initial_accumulator,
                "weight_decay": t.pool.weight_decay}
    return {"host": shm.host_id(), "paths": dict(_SHARED.paths), "rows": t.rows, "dim": t.dim,
            "optimizer": t.optimizer.value, "lr": t.lr, "eps": t.eps,
            "weight_decay": t.weight_decay}


def attached() -> None:
    """A client has attached (and mapped the files if it could)."""
    shared = _SHARED
    if shared is None or shared.clients_left is None:
        return
    with shared.lock:
        shared.clients_left -= 1
        done = shared.clients_left <= 0
    if done:
        release()


class _InOrder:
    """Each client's numbered calls (`in_order`), run in the order of their numbers: the
    RPC thread pool runs calls that arrive together at once, in any order. A call that comes
    early waits, holding no thread, until the call before it has run; the thread that ran
    that one runs it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.next: dict[int, int] = {}  # client -> number of its next call to run
        self.early: dict[tuple[int, int], tuple[str, tuple[Any, ...], torch.futures.Future]] = {}

    def call(self, user: int, number: int, kind: str, args: tuple[Any, ...]
             ) -> torch.futures.Future:
        mine: torch.futures.Future = torch.futures.Future()
        with self.lock:
            if number != self.next.get(user, 0):
                self.early[(user, number)] = (kind, args, mine)
                return mine
        answer = mine
        while True:
            try:
                answer.set_result(REMOTE_CALLS[kind](*args))
            except Exception as e:  # noqa: BLE001 - the client's to see
                answer.set_exception(e)
            number += 1
            with self.lock:
                waiting = self.early.pop((user, number), None)
                if waiting is None:
                    self.next[user] = number
                    return mine
            kind, args, answer = waiting


_IN_ORDER = _InOrder()


@rpc.functions.async_execution
def in_order(user: int, number: int, kind: str, *args: Any) -> torch.futures.Future:
    """Call `kind` (of `REMOTE_CALLS`) once client `user`'s calls numbered below `number`
    have run (its first is 0): a pipelining client's pushes and reads then apply in the
    order it made them, however many are on their way at once."""
    return _IN_ORDER.call(user, number, kind, args)


LOCAL_CALLS: dict[str, Callable[..., Any]] = {
    "lookup": _lookup_in, "apply": _apply_in, "update_and_lookup": _update_and_lookup_in,
    "resolve": lambda tables, *args: tables.resolve(*args),
    "release": lambda tables, user: tables.release(user)}
REMOTE_CALLS: dict[str, Callable[..., Any]] = {
    "lookup": _lookup, "apply": _apply, "update_and_lookup": _update_and_lookup,
    "resolve": _resolve, "release": _release}
