"""Dynamic embedding tables: raw ids in, rows of a bounded pool behind them.

`DynamicTables` holds one pool of `capacity + 1` rows (row 0: the default row, zeros, never
updated) shared by every table it keeps, an `EmbeddingTables` of one table updated by the same
SGD / row-wise Adagrad, and a `DynamicRowMap` from (table, raw id) keys to rows. It is an
`EmbeddingClient` (the tables of a trainer without embedding servers, in shared memory for its
Hogwild workers) and the state of a dynamic embedding server.

Admission follows the training step: `update_and_lookup`'s next ids are counted, admitted and
touched; `lookup` alone (evaluation, serving, a worker's first batch) only reads, so held-out
data never takes rows. A row given to a new id starts afresh: weights drawn as a fixed table
of `init_rows` rows draws its rows, Adagrad accumulator back at its initial value.

Every process that maps the pool finds ids in the map without a lock, then stamps, holds and
admits them under one lock per holder (`HostLock`): a training step's rows are held by its
process until it has applied the step's gradients, so no other process evicts them meanwhile
(see `shadowsync.embeddings.dynamic`). The map is small work next to the lookups (about half
a millisecond for 6,600 ids on one core), and the rows themselves are read and updated
without locks, Hogwild, as fixed tables are. A checkpoint copies the map under the lock.

Rows are resolved at three levels: `READ` (evaluation, serving, a worker's first batch: a
find, nothing held), `HOLD` (a batch read that way whose gradients are coming: stamped and
held, nothing counted) and `TRAIN` (a training step's next batch: counted, admitted, held).
"""

from __future__ import annotations

import fcntl
import os
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from shadowsync.data.bags import Bags
from shadowsync.embeddings.dynamic import (
    DEFAULT_ROW,
    LRU,
    DynamicRowMap,
    Eviction,
    map_bytes,
    raw_keys,
)
from shadowsync.embeddings.resize import resized_state
from shadowsync.embeddings.tables import INIT_MIN_ROWS, EmbeddingTables
from shadowsync.embeddings.unique import unique_with_inverse

SKETCH_DEPTH = 4
READ, HOLD, TRAIN = range(3)  # how a batch's rows are resolved (see the module)


def sketch_width(capacity: int, admit_after: int) -> int:
    """Counters per sketch row: a power of two >= the pool (one when nothing is counted)."""
    return 1 if admit_after == 1 else 1 << max(10, (capacity - 1).bit_length())


def holder_bytes(capacity: int, width: int, admit_after: int) -> int:
    """The memory of a holder's pool of `capacity` rows, all of it allocated at the start:
    the rows (float32, the default row too) and their row-wise Adagrad sums, and the map
    (`map_bytes`: hash slots, each row's key, age and free-stack entry, the sketch)."""
    return (capacity + 1) * (4 * width + 4) + map_bytes(
        capacity, sketch_width(capacity, admit_after), SKETCH_DEPTH)


def pool_rows(table_rows: list[int] | tuple[int, ...], width: int, admit_after: int,
              memory: int | None, holders: int) -> int:
    """Rows of each holder's pool: the tables' row budgets shared evenly by `holders` (ids
    are spread over them by their key), or the most rows whose `holder_bytes` fit in each
    holder's share of `memory` (at least one)."""
    if memory is None:
        return max(1, -(-sum(table_rows) // holders))
    share, lo, hi = memory // holders, 1, max(1, memory // holders // (4 * width + 4))
    while lo < hi:  # the bytes grow with the rows: the largest pool that fits
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if holder_bytes(mid, width, admit_after) <= share else (lo, mid - 1)
    return lo


@dataclass(frozen=True)
class DynamicSpec:
    """What every holder of a job's dynamic tables is built from (picklable)."""

    num_tables: int
    capacity: int  # rows of each holder's pool
    admit_after: int = 1
    eviction: Eviction = LRU
    init_rows: int = 100_000  # new rows start as a fixed table of this many rows does

    def build(self, dim: int, seed: int, lock_path: str | None = None,
              tensors: dict[str, torch.Tensor] | None = None,
              **table_optimizer: Any) -> DynamicTables:
        """A holder; over existing `tensors` (another process's, mapped) when given."""
        return DynamicTables(self.num_tables, self.capacity, dim, self.admit_after,
                             self.eviction, self.init_rows, seed, lock_path,
                             tensors=tensors, **table_optimizer)


class HostLock:
    """A lock between the threads and processes of one host: a thread lock inside a
    process, `flock` on a file between them. Pickles as its path."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._thread = threading.Lock()
        self._fd: int | None = None
        self._pid = os.getpid()
        self._open()

    def _open(self) -> None:
        """Open the file now, while its name is sure to be there (its owner may remove the
        name once every process has it open)."""
        if self.path is not None and (self._fd is None or self._pid != os.getpid()):
            self._fd, self._pid = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600), os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"])  # type: ignore[misc]

    def __enter__(self) -> None:
        self._thread.acquire()
        self._open()
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: Any) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._thread.release()


class DynamicTables:
    """`num_tables` dynamic tables in one pool of `capacity` rows (see the module)."""

    def __init__(self, num_tables: int, capacity: int, dim: int, admit_after: int = 1,
                 eviction: Eviction = LRU, init_rows: int = 100_000, seed: int = 0,
                 lock_path: str | None = None,
                 optimizer: str = "adagrad", lr: float = 0.05, initial_accumulator: float = 0.0,
                 weight_decay: float = 0.0,
                 tensors: dict[str, torch.Tensor] | None = None) -> None:
        self.num_tables, self.dim, self.seed = num_tables, dim, seed
        self.init_bound = max(init_rows, INIT_MIN_ROWS) ** -0.5
        self.initial_accumulator = initial_accumulator
        width = sketch_width(capacity, admit_after)
        if tensors is None:
            pool = EmbeddingTables([capacity + 1], dim, optimizer, lr, seed=seed,
                                   initial_accumulator=initial_accumulator,
                                   weight_decay=weight_decay)
            pool.weight.uniform_(-self.init_bound, self.init_bound,
                                 generator=torch.Generator().manual_seed(seed))
            pool.weight[DEFAULT_ROW] = 0
            self.map = DynamicRowMap(capacity, admit_after, eviction, width, SKETCH_DEPTH)
        else:
            pool = EmbeddingTables.from_tensors(
                [capacity + 1], dim, optimizer, lr, 1e-8, tensors["weight"],
                tensors.get("adagrad"), weight_decay)
            self.map = DynamicRowMap(capacity, admit_after, eviction, width, SKETCH_DEPTH,
                                     {k[4:]: v for k, v in tensors.items()
                                      if k.startswith("map/")})
        self.pool = pool
        self.lock = HostLock(lock_path)
        self._gen = torch.Generator().manual_seed(seed * 7919 + os.getpid())
        self._last: tuple[Any, torch.Tensor, int] | None = None

    @property
    def capacity(self) -> int:
        return self.map.capacity

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor of the holder by name: rows, optimizer state and the id map."""
        return {**self.pool.state_dict(), **{f"map/{k}": v for k, v in self.map.tensors.items()}}

    def share_memory_(self) -> DynamicTables:
        for t in self.tensors().values():
            t.share_memory_()
        self.map.bind()
        return self

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Rows, optimizer state and the map's state (its hash table is rebuilt on load). The
        map is a copy taken under the lock, so its rows' keys, free rows and counts agree
        while other processes admit ids; the rows are live, Hogwild, as fixed tables' are (a
        row given to another id after the copy resumes as a fresh row of its old id)."""
        with self.lock:
            mapped = {f"map/{k}": v.clone() for k, v in self.map.state_dict().items()}
        return {**self.pool.state_dict(), **mapped}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if state["weight"].shape != self.pool.weight.shape:  # a warm start, a new budget
            state = resized_state(state, self.state_dict())
        with torch.no_grad():
            for name, t in self.pool.state_dict().items():
                if state[name].shape != t.shape:
                    raise ValueError(f"dynamic tables {name}: saved shape "
                                     f"{tuple(state[name].shape)}, these {tuple(t.shape)}")
                t.copy_(state[name])
        with self.lock:
            self.map.load_state_dict({k[4:]: v for k, v in state.items()
                                      if k.startswith("map/")})

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_last=None, _gen=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._gen = torch.Generator().manual_seed(self.seed * 7919 + os.getpid())

    # -- the map -----------------------------------------------------------------------------
    def resolve(self, keys: torch.Tensor, examples: int, level: int, user: int | None = None,
                keep_previous: bool = False) -> torch.Tensor:
        """Rows of keys (`raw_keys`) at `level` (READ, HOLD, TRAIN: see the module): TRAIN
        admits ids and resets the rows given to them. Above READ the rows are held by
        `user` (this process by default; a server passes its client's token) until its next
        resolve above READ, or the one after with `keep_previous`. The probe runs without
        the lock; the stamps, the hold and admission under it."""
        k = keys.numpy()
        seen, evicted = self.map.admissions(), self.map.evictions()
        rows = self.map.find(k)
        if level == READ:
            return torch.from_numpy(rows)
        train = level == TRAIN
        with self.lock:
            self.map.refind(k, rows, evicted)
            clock, misses = self.map.touch(rows, examples if train else 0, counted=train)
            self.map.hold(self.user if user is None else user, clock, keep_previous)
            if train and self.map.needs_admit(misses, clock):
                _, reused = self.map.admit(k, rows, clock, seen)
                if len(reused):
                    self._reset(torch.from_numpy(reused))
        return torch.from_numpy(rows)

    @property
    def user(self) -> int:
        """This process's token as a holder of rows."""
        return os.getpid()

    def release(self, user: int | None = None) -> None:
        """`user` (this process by default) holds no rows any more."""
        with self.lock:
            self.map.release(self.user if user is None else user)

    def _reset(self, rows: torch.Tensor) -> None:
        init = torch.empty(rows.shape[0], self.dim).uniform_(-self.init_bound, self.init_bound,
                                                         generator=self._gen)
        self.pool.weight.index_copy_(0, rows, init)
        if self.pool.state is not None:
            self.pool.state.index_fill_(0, rows, self.initial_accumulator)

    def counters(self) -> dict[str, int]:
        return self.map.counters()

    # -- rows by number (a server's RPC functions and its shared-memory clients) -------------
    def lookup_rows(self, rows: torch.Tensor) -> torch.Tensor:
        return self.pool.lookup_rows(rows)

    def apply_rows(self, rows: torch.Tensor, grads: torch.Tensor, unique: bool = False,
                   lr_scale: float = 1.0) -> None:
        """As `EmbeddingTables.apply_rows`; the default row's gradients are dropped. Rows
        are summed per distinct row first (as the pool's update would): sorted, the default
        row is then the first, cut off by a slice rather than a mask over every lookup."""
        if not unique:
            rows, inverse = unique_with_inverse(rows)
            grads = torch.zeros(rows.shape[0], self.dim).index_add_(0, inverse, grads)
        if rows.shape[0] and int(rows[0]) == DEFAULT_ROW:  # sorted: a server's rows are too
            rows, grads = rows[1:], grads[1:]
        if bool((rows == DEFAULT_ROW).any()):  # unsorted unique rows (no caller sends those)
            kept = (rows != DEFAULT_ROW).nonzero().squeeze(1)
            rows, grads = rows.index_select(0, kept), grads.index_select(0, kept)
        if rows.shape[0]:
            self.pool.apply_rows(rows, grads, unique=True, lr_scale=lr_scale)

    # -- the EmbeddingClient of a trainer without embedding servers --------------------------
    def flush(self) -> None:
        """Nothing in flight: every gradient is applied in place when pushed."""

    def saved_here(self) -> DynamicTables:
        return self  # the rows and the id map live in the trainer: its shard saves them

    def attach(self, name: str) -> None:
        pass

    def detach(self) -> None:
        self.release()

    def rows_of(self, ids: torch.Tensor | Bags, level: int) -> torch.Tensor:
        """The pool rows of a batch's lookups (ids [B, T] flattened, or a `Bags`' pairs),
        resolved at `level` or above."""
        # A step reads its rows (admitting) and then updates them: one resolve serves both.
        if self._last is not None and self._last[0] is ids and self._last[2] >= level:
            return self._last[1]
        rows = self.resolve(keys_of(ids), ids.shape[0], level)
        self._last = (ids, rows, level)
        return rows

    def lookup(self, ids: torch.Tensor | Bags) -> torch.Tensor:
        """Vectors of a batch, reading only: ids not in the map read the default row."""
        return self._vectors(ids, self.rows_of(ids, READ))

    def _vectors(self, ids: torch.Tensor | Bags, rows: torch.Tensor) -> torch.Tensor:
        if isinstance(ids, Bags):
            return ids.pool(self.pool.weight, rows)
        return self.pool.lookup_rows(rows).view(*ids.shape, self.dim)

    def apply_gradients(self, ids: torch.Tensor | Bags, grads: torch.Tensor,
                        lr_scale: float = 1.0) -> None:
        """Apply a batch's gradients to its rows, held since they were resolved (a batch
        only read, such as a worker's first, is held now: an id whose row went meanwhile
        lands on its row now, or nowhere)."""
        per_row = ids.unpool(grads) if isinstance(ids, Bags) else grads.reshape(-1, self.dim)
        self.apply_rows(self.rows_of(ids, HOLD), per_row, lr_scale=lr_scale)

    def update_and_lookup(self, ids: torch.Tensor | Bags, grads: torch.Tensor,
                          next_ids: torch.Tensor | Bags | None,
                          lr_scale: float = 1.0) -> torch.Tensor | None:
        """A training step: apply `ids`' gradients, then admit and read `next_ids` (whose
        rows this process then holds instead)."""
        self.apply_gradients(ids, grads, lr_scale)
        if next_ids is None:
            return None
        return self._vectors(next_ids, self.rows_of(next_ids, TRAIN))


def keys_of(ids: torch.Tensor | Bags) -> torch.Tensor:
    """The `raw_keys` of a batch's lookups: ids [B, T] flattened, or a `Bags`' pairs."""
    if isinstance(ids, Bags):
        return torch.from_numpy(raw_keys(ids.tables.numpy(), ids.ids.numpy()))
    tables = np.arange(ids.shape[1], dtype=np.int64)  # broadcast over the rows
    return torch.from_numpy(raw_keys(tables, ids.numpy()).reshape(-1))


def merge_counters(per_holder: list[dict[str, int]]) -> dict[str, int]:
    """The counters of several holders' maps as one job's: sums, but the clock (each holder
    counts the examples whose ids reached it) is the largest."""
    out = {k: sum(c[k] for c in per_holder) for k in per_holder[0]}
    out["clock"] = max(c["clock"] for c in per_holder)
    return out
