"""Dynamic tables shared by processes: several workers on a pool small enough to evict every
step, by LRU and by TTL, each checking and signing every row it uses, so that an id reading or
writing another id's row shows; and a checkpoint taken while another process admits ids,
which resumes with every mapping and no row lost.

Each id has a signature, a random unit vector; a worker's gradient for an id is minus its
signature, so with SGD at rate 1 an id's row is its first draw plus a multiple of its own
signature. Read back, a row whose part across the signature is more than the draw's size
holds another id's gradient, or belongs to another id."""

import os
import random
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from shadowsync.embeddings.dynamic import _FREE_TOP, FREE, Eviction
from shadowsync.embeddings.dynamic_tables import HOLD, TRAIN, DynamicTables, keys_of
from tests.helpers import run_spawned

DIM, IDS, BATCH, WORKERS, STEPS = 16, 240, 12, 3, 60
BIG = 10**15  # raw ids far past any table size
TOLERANCE = 0.1  # a first draw is at most sqrt(DIM) * 1e-3 long


def signatures() -> torch.Tensor:
    sig = torch.randn(IDS, DIM, generator=torch.Generator().manual_seed(7))
    return sig / sig.norm(dim=1, keepdim=True)


def holder(capacity: int, eviction: str, lock: Path | None = None, dim: int = DIM
           ) -> DynamicTables:
    """A pool of `capacity` rows in shared memory, locked by the file `lock` if given."""
    return DynamicTables(1, capacity, dim, eviction=Eviction.parse(eviction), init_rows=10**6,
                         lock_path=str(lock) if lock else None, optimizer="sgd", lr=1.0
                         ).share_memory_()


def foreign(ids: torch.Tensor, vectors: torch.Tensor, sig: torch.Tensor) -> int:
    """How many of a batch's vectors hold more than their own id's signature and a draw."""
    s = sig[ids.reshape(-1) - BIG]
    v = vectors.reshape(-1, DIM)
    along = (v * s).sum(1)
    across = (v - along[:, None] * s).norm(dim=1)
    return int(((across > TOLERANCE) | (along < -TOLERANCE)).sum())


def _work(variants: list[tuple[DynamicTables, bool]], worker: int, barrier, results) -> None:
    """A worker's steps on each holder in turn (all workers on one holder at a time): read
    the batch's vectors, check them, wait a little (the forward and backward), push minus
    the signatures and read the next batch. `remote`: as a client of a server does, the
    next batch resolved before this one's gradients are applied."""
    torch.set_num_threads(1)
    sig, rng = signatures(), random.Random(worker)

    def draw() -> torch.Tensor:
        return torch.tensor(rng.sample(range(IDS), BATCH)).view(BATCH, 1) + BIG

    counts = []
    for tables, remote in variants:
        barrier.wait(timeout=60)
        user, foreign_reads = -(worker + 1), 0
        ids = draw()
        vectors = tables.lookup(ids)
        for step in range(STEPS):
            foreign_reads += foreign(ids, vectors, sig)
            time.sleep(rng.random() * 2e-3)
            grads = -sig[ids.reshape(-1) - BIG].view(BATCH, 1, DIM)
            nxt = draw()
            if not remote:
                ids, vectors = nxt, tables.update_and_lookup(ids, grads, nxt)
                continue
            if step == 0:  # the first batch was only read: held now, before its push
                rows = tables.resolve(keys_of(ids), BATCH, HOLD, user, keep_previous=True)
            next_rows = tables.resolve(keys_of(nxt), BATCH, TRAIN, user, keep_previous=True)
            time.sleep(rng.random() * 1e-3)  # the round trip: the push lands after the resolve
            tables.apply_rows(rows, grads.view(-1, DIM))
            ids, rows, vectors = nxt, next_rows, tables.lookup_rows(next_rows)
        if remote:
            tables.release(user)
        else:
            tables.detach()
        counts.append(foreign_reads)
    results.put(counts)


def foreign_rows(tables: DynamicTables) -> int:
    """Rows of the pool whose contents are not their id's (after every worker is done)."""
    by_key = {int(k): i for i, k in enumerate(keys_of(torch.arange(IDS).view(IDS, 1) + BIG))}
    keys, rows = tables.map.live_keys()
    ids = torch.tensor([by_key[int(k)] for k in keys]) + BIG
    return foreign(ids, tables.pool.weight[torch.from_numpy(rows)], signatures())


@pytest.mark.timeout(240)
def test_no_id_reads_or_writes_another_ids_row_while_workers_evict_every_step(tmp_path):
    """LRU and TTL, each with workers that apply a step's gradients before resolving the
    next batch (a trainer's own tables) and with workers that resolve it first (a server's
    clients); a pool of 4 batches, so that rows are evicted at nearly every step."""
    import torch.multiprocessing as mp

    variants = [(holder(4 * BATCH, eviction, tmp_path / f"lock-{eviction}-{remote}"), remote)
                for eviction in ("lru", "ttl:24") for remote in (False, True)]
    barrier = mp.get_context("spawn").Barrier(WORKERS)
    reads = run_spawned([(_work, (variants, w, barrier)) for w in range(WORKERS)], WORKERS, 240)
    for i, (tables, remote) in enumerate(variants):
        what = f"{tables.map.eviction}, remote={remote}"
        assert tables.counters()["evicted"] > STEPS, what  # the pool turned over all along
        assert [r[i] for r in reads] == [0] * WORKERS, what
        assert foreign_rows(tables) == 0, what
        assert not tables.map._holds[:, 0].any(), what  # every worker gave its rows back


POOL, NEW = 4096, 512  # the checkpoint test's pool, and the ids its worker admits


def _admit_slowly(tables: DynamicTables, ids: torch.Tensor, admitting, results) -> None:
    """Admit `ids` into a full pool, pausing for a second halfway: rows evicted and taken
    off the free stack, not yet given their new keys."""
    torch.set_num_threads(1)
    take = tables.map._take_rows

    def slow_take(n: int) -> np.ndarray:
        rows = take(n)
        admitting.set()
        time.sleep(1.0)
        return rows

    tables.map._take_rows = slow_take
    tables.update_and_lookup(ids[:1], torch.zeros(1, 1, 1), ids)
    tables.detach()
    results.put("done")


def assert_whole(tables: DynamicTables) -> None:
    """Every row is either free (once, on the free stack) or one id's, found by its key."""
    m = tables.map
    keys, rows = m.live_keys()
    free = m._free[:int(m._meta[_FREE_TOP])]
    assert len(np.unique(keys)) == len(keys) == m.counters()["live"]
    assert len(free) + len(rows) == tables.capacity  # no row leaked, none twice
    assert (np.sort(np.concatenate([free, rows])) == np.arange(1, tables.capacity + 1)).all()
    assert (m._row_key[free] == FREE).all() and (m.find(keys) == rows).all()


@pytest.mark.timeout(240)
def test_a_checkpoint_taken_during_admission_resumes_with_every_mapping(tmp_path):
    """Saved by the checkpoint path itself (`save_here`) while another process is halfway
    through admitting ids into a full pool: the save waits for the admission, and loaded,
    holds every mapping the pool had, every other row free, and trains on."""
    import torch.multiprocessing as mp

    from shadowsync.checkpoint import shards

    tables = holder(POOL, "lru", tmp_path / "lock", dim=1)
    for start in range(0, POOL, NEW):  # the pool full, every row used once
        ids = torch.arange(start, start + NEW).view(NEW, 1) + BIG
        tables.update_and_lookup(ids[:1], torch.zeros(1, 1, 1), ids)
    tables.detach()
    newcomers = torch.arange(POOL, POOL + NEW).view(NEW, 1) + BIG
    ctx = mp.get_context("spawn")
    admitting, results = ctx.Event(), ctx.Queue()
    child = ctx.Process(target=_admit_slowly, args=(tables, newcomers, admitting, results))
    shards.register("emb0", "state", tables)  # before: it imports the checkpoint library
    child.start()
    try:
        assert admitting.wait(timeout=60)
        shards.save_here(str(tmp_path / "step"))
        assert results.get(timeout=60) == "done"
        child.join(timeout=20)
        assert child.exitcode == 0
    finally:
        shards.clear()
        if child.is_alive():
            os.kill(child.pid, 9)
    assert tables.counters()["evicted"] >= NEW
    resumed = holder(POOL, "lru", dim=1)
    shards.load_here(tmp_path / "step", "emb0", {"state": resumed}, "a test")
    assert_whole(resumed)
    keys, rows = tables.map.live_keys()
    assert (resumed.map.live_keys()[0] == keys).all()  # every mapping, each on its row
    assert (resumed.map.find(keys_of(newcomers).numpy()) != 0).all()
    assert resumed.counters() == tables.counters()
    # It trains on: new ids take rows, evicting the least recently used, and it stays whole.
    ids = torch.arange(NEW).view(NEW, 1) + 10**16
    resumed.update_and_lookup(ids[:1], torch.zeros(1, 1, 1), ids)
    assert_whole(resumed)
    assert (resumed.map.find(keys_of(ids).numpy()) != 0).all()
