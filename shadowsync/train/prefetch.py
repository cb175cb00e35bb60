"""A worker's embedding rows, asked for ahead of the step that trains on them (--prefetch).

At depth 0 a step ends in one blocking round trip: its gradients out, the next batch's rows
in (`update_and_lookup`). At depth D the rows of the next D batches are already on their way
when a step starts, and the step's gradients go out with the request for the batch D + 1
ahead (`update_and_fetch`) without waiting: a round trip then has D steps of compute to hide
behind (TorchRec's `TrainPipelineSparseDist` overlaps the next batch's embedding exchange
with the current batch's compute the same way; its semi-sync pipeline lets rows be a step
stale).

The price is staleness, bounded by the depth. Number a worker's batches j = 0, 1, ... from
where its pipeline (re)started, r (0 at the start; after a drain, the steps taken before it).
Batch j is trained after the gradients of its own steps r .. j-1 were pushed, and each server
applies a client's calls in the order it made them (the server reads a batch's rows after the
push sent in the same call), so its rows hold u_j of them:

    depth 0:  u_j = j                       (nothing missed)
    depth D:  u_j = r            for j <= r + D   (read at the (re)start)
              u_j = j - D        for j >  r + D   (read with the push of step j - D - 1)

and miss s_j = j - u_j = min(j - r, D) <= D of the worker's own updates. Other processes'
updates race with the reads as Hogwild's do at any depth; the bound is on the worker's own.
A checkpoint's positions trail each worker's steps by `LAG` = 4 (`shadowsync.train.state`):
after step k the calls of steps k - D + 1 .. k may be unanswered, so D <= 2 keeps every step
a position counts in the tables.

A drain (`drain`, at a validation's quiescent point) waits until every call is answered, so
every push is applied, and drops the rows read ahead: they miss pushes the tables now hold.
The batches are kept and their rows read again when training goes on, so the steps after the
point train as a run resumed from that point's checkpoint would (its first batch read
afresh): no row read before the park trains after it. At depth 0 the rows in hand were read
with the last push and miss none: nothing is read again, as before pipelining.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Protocol, cast

import torch

from shadowsync.data.bags import Bags
from shadowsync.data.dataset import Batch
from shadowsync.embeddings import EmbeddingClient


class RowFetch(Protocol):
    def rows(self) -> torch.Tensor: ...
    def wait(self) -> None: ...


class Prefetching(Protocol):
    """An `EmbeddingClient` that can ask for rows now and read them later."""

    prefetch_depth: int

    def fetch(self, ids: torch.Tensor | Bags) -> RowFetch: ...
    def update_and_fetch(self, done: RowFetch, grads: torch.Tensor,
                         next_ids: torch.Tensor | Bags | None,
                         lr_scale: float = 1.0) -> RowFetch | None: ...


def depth_of(tables: EmbeddingClient) -> int:
    """Steps ahead `tables` fetches rows: its `prefetch_depth` (a remote client, once
    attached); 0 for tables read in place or a client that blocks on purpose."""
    return int(getattr(tables, "prefetch_depth", 0))


class RowPipeline:
    """The batch a worker trains now (`batch`, its rows by `rows()`), and at depth D the next
    D batches drawn from `stream` with their rows on the way."""

    def __init__(self, tables: EmbeddingClient, depth: int, stream: Iterator[Batch]) -> None:
        self.tables, self.depth, self.stream = tables, depth, stream
        self.batch: Batch | None = next(stream, None)
        self._ahead: deque[tuple[Batch, RowFetch | None]] = deque()
        self._fetch: RowFetch | None = None  # the current batch's rows, depth >= 1
        self._rows: torch.Tensor | None = None
        self._restart()

    def _restart(self) -> None:
        """Ask for the rows of the batch in hand and of the next `depth` batches."""
        if self.batch is None:
            return
        if self.depth == 0:
            self._rows = self.tables.lookup(self.batch[1])
            return
        tables = cast(Prefetching, self.tables)
        self._fetch, self._rows = tables.fetch(self.batch[1]), None
        kept = [b for b, _ in self._ahead]
        kept += [b for b in (next(self.stream, None)
                             for _ in range(self.depth - len(kept))) if b is not None]
        self._ahead = deque((b, tables.fetch(b[1])) for b in kept)

    def rows(self) -> torch.Tensor:
        """The current batch's vectors (waiting for them if they are on their way)."""
        if self._rows is None:
            if self._fetch is None:  # drained: read again
                self._restart()
            if self._fetch is not None:
                self._rows = self._fetch.rows()
        assert self._rows is not None
        return self._rows

    def advance(self, grads: torch.Tensor, more: bool, lr_scale: float) -> None:
        """The step on `batch` is done: push its gradients and make the next batch current
        (none if not `more`: a stop, or the runner's end)."""
        assert self.batch is not None
        ids = self.batch[1]
        nxt = next(self.stream, None) if more else None
        if self.depth == 0:  # one blocking round trip, as before pipelining
            self._rows = self.tables.update_and_lookup(
                ids, grads, nxt[1] if nxt is not None else None, lr_scale=lr_scale)
            self.batch = nxt
            return
        tables = cast(Prefetching, self.tables)
        assert self._fetch is not None, "rows() first: the step trains on them"
        fetched = tables.update_and_fetch(self._fetch, grads, nxt[1] if nxt is not None else None,
                                          lr_scale=lr_scale)
        if not more:  # the batches drawn ahead are not trained
            self.drop()
        elif nxt is not None:
            self._ahead.append((nxt, fetched))
        self.batch, self._fetch = self._ahead.popleft() if self._ahead else (None, None)
        self._rows = None

    def drop(self) -> None:
        """Every fetch answered and forgotten, with the batches drawn ahead."""
        for _, fetch in self._ahead:
            if fetch is not None:
                fetch.wait()
        self._ahead.clear()

    def drain(self) -> None:
        """A quiescent point: every fetch answered, the rows read ahead dropped (the batches
        kept, their rows read again by the next `rows()`); the caller then flushes the pushes.
        Depth 0 reads nothing ahead."""
        if self.depth == 0:
            return
        for fetch in [self._fetch, *(f for _, f in self._ahead)]:
            if fetch is not None:
                fetch.wait()
        self._fetch, self._rows = None, None
        self._ahead = deque((b, None) for b, _ in self._ahead)
