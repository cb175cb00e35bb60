"""The id map of dynamic tables: admission counts, eviction order, the budget, a round trip."""

import numpy as np
import pytest
import torch

from shadowsync.embeddings.dynamic import (
    DEFAULT_ROW,
    DynamicRowMap,
    Eviction,
    mix64,
    raw_keys,
    raw_keys_torch,
    server_of,
    table_of,
)
from shadowsync.errors import UserError


def keys_of(ids):
    return raw_keys(np.zeros(len(ids), dtype=np.int64), np.asarray(ids, dtype=np.int64))


def test_keys_are_stable_distinct_and_route_evenly():
    ids = np.arange(100_000, dtype=np.int64)
    k0, k1 = raw_keys(np.zeros_like(ids), ids), raw_keys(np.ones_like(ids), ids)
    assert len(np.unique(np.concatenate([k0, k1]))) == 200_000
    assert mix64(np.array([0], dtype=np.uint64))[0] == 0  # the finaliser fixes zero
    assert raw_keys(np.array([3]), np.array([12345]))[0] == raw_keys(np.array([3]),
                                                                      np.array([12345]))[0]
    share = np.bincount(server_of(k0, 4), minlength=4) / len(k0)
    assert np.abs(share - 0.25).max() < 0.01


def test_every_id_gets_its_own_row_and_keeps_it():
    m = DynamicRowMap(capacity=1000)
    keys = keys_of(np.arange(500) * 7919 + 10**12)
    rows, fresh = m.resolve(keys, examples=500)
    assert sorted(rows) == list(range(1, 501)) and sorted(fresh) == list(range(1, 501))
    again, fresh2 = m.resolve(keys[::-1], examples=500)
    assert (again == rows[::-1]).all() and len(fresh2) == 0
    c = m.counters()
    assert (c["lookups"], c["hits"], c["admitted"], c["live"]) == (1000, 500, 500, 500)


def test_admission_after_n_sightings_counts_repeats_in_a_batch():
    m = DynamicRowMap(capacity=100, admit_after=3, sketch_width=1 << 12)
    a, b = keys_of([1])[0], keys_of([2])[0]
    rows, _ = m.resolve(np.array([a, a, b]))  # a seen twice, b once
    assert (rows == DEFAULT_ROW).all()
    rows, fresh = m.resolve(np.array([a, b]))  # a: 3rd sighting -> admitted; b: 2nd
    assert rows[0] != DEFAULT_ROW and rows[1] == DEFAULT_ROW and list(fresh) == [rows[0]]
    rows, _ = m.resolve(np.array([b]))
    assert rows[0] != DEFAULT_ROW
    c = m.counters()
    assert (c["admitted"], c["rejected"]) == (2, 4)


def test_the_sketch_halves_every_half_width_of_sightings():
    m = DynamicRowMap(capacity=10, admit_after=400, sketch_width=1 << 10)
    a, b = keys_of([1, 2])
    m.resolve(np.full(300, a))
    m.resolve(np.full(212, b))  # 512 sightings: a's count halves to 150, b's to 106
    assert m.resolve(np.full(249, a))[0][0] == DEFAULT_ROW  # 399
    assert m.resolve(np.array([a]))[0][0] != DEFAULT_ROW  # 400: admitted
    assert m._sketch.sum(axis=1).max() < 1 << 10  # never more sightings than counters


def test_evaluation_lookups_neither_count_nor_admit():
    m = DynamicRowMap(capacity=10, admit_after=2, sketch_width=1 << 10)
    k = keys_of([5])
    for _ in range(3):
        rows, _ = m.resolve(k, admit=False)
        assert rows[0] == DEFAULT_ROW
    assert m.counters()["lookups"] == 0
    m.resolve(k)
    assert m.resolve(k)[0][0] != DEFAULT_ROW


def test_lru_evicts_the_least_recently_used_and_reuses_their_rows():
    m = DynamicRowMap(capacity=64)
    ids = np.arange(64)
    rows, _ = m.resolve(keys_of(ids), examples=1)
    for i in range(64):  # touch ids in order 0..63: id 0 is the least recently used
        m.resolve(keys_of([i]), examples=1)
    new_rows, fresh = m.resolve(keys_of([1000]), examples=1)
    assert m.counters()["evicted"] == 1  # a 64th of the pool: one row
    assert new_rows[0] == rows[0] and list(fresh) == [rows[0]]
    assert m.resolve(keys_of([0]), admit=False)[0][0] == DEFAULT_ROW
    kept, _ = m.resolve(keys_of(ids[1:]), admit=False)
    assert (kept == rows[1:]).all()


def test_budget_holds_under_a_growing_id_space_and_the_map_stays_consistent():
    rng = np.random.default_rng(0)
    m = DynamicRowMap(capacity=2000, admit_after=2, sketch_width=1 << 14)
    for day in range(20):
        ids = rng.zipf(1.2, 4096) + day * 10**6  # drifting ids, many one-offs
        rows, _ = m.resolve(keys_of(ids), examples=4096)
        assert m.counters()["live"] <= 2000
        # One id, one row, within a call; and a row is held by the key that maps to it.
        pairs = np.unique(np.stack([keys_of(ids), rows]), axis=1)
        held = pairs[:, pairs[1] != DEFAULT_ROW]
        assert len(np.unique(held[0])) == held.shape[1] == len(np.unique(held[1]))
    keys, rows = m.live_keys()
    assert len(keys) == m.counters()["live"] == len(np.unique(rows))
    assert (m.resolve(keys, admit=False)[0] == rows).all()
    assert m.counters()["evicted"] > 0


def test_a_pool_smaller_than_a_call_admits_what_fits_and_evicts_nothing_in_use():
    m = DynamicRowMap(capacity=10)
    rows, fresh = m.resolve(keys_of(np.arange(25)), examples=25)
    assert (rows != DEFAULT_ROW).sum() == 10 and len(fresh) == 10
    assert m.counters()["evicted"] == 0 and m.counters()["rejected"] == 15


def test_ttl_frees_rows_idle_longer_than_n_examples():
    m = DynamicRowMap(capacity=100, eviction=Eviction.parse("ttl:80"))
    m.resolve(keys_of([1, 2]), examples=10)
    for _ in range(10):
        m.resolve(keys_of([3]), examples=10)  # ids 1 and 2 idle for 100 examples
    assert m.counters()["evicted"] == 2 and m.counters()["live"] == 1
    assert (m.resolve(keys_of([1, 2]), admit=False)[0] == DEFAULT_ROW).all()


def test_eviction_parse():
    assert str(Eviction.parse("lru")) == "lru" and Eviction.parse("ttl:5").ttl == 5
    for bad in ("ttl", "ttl:0", "lfu", "ttl:x"):
        with pytest.raises(UserError, match="--evict"):
            Eviction.parse(bad)


def test_state_dict_round_trip_keeps_rows_and_counters():
    a = DynamicRowMap(capacity=300, admit_after=2, sketch_width=1 << 10)
    ids = np.random.default_rng(1).integers(0, 2**62, 1000)
    a.resolve(keys_of(np.concatenate([ids, ids[:200]])), examples=1200)
    b = DynamicRowMap(capacity=300, admit_after=2, sketch_width=1 << 10)
    assert "slots" not in a.state_dict()  # the hash table is rebuilt from the rows' keys
    b.load_state_dict({k: v.clone() for k, v in a.state_dict().items()})
    assert b.counters() == a.counters()
    probe = keys_of(ids)
    assert (b.resolve(probe, admit=False)[0] == a.resolve(probe, admit=False)[0]).all()
    # Both go on alike: the sketch came along (ids seen once admit on their second sighting).
    assert (b.resolve(probe[200:400])[0] == a.resolve(probe[200:400])[0]).all()
    with pytest.raises(ValueError, match="shape"):
        DynamicRowMap(capacity=10).load_state_dict(a.state_dict())


def test_the_torch_key_function_matches_numpy_bit_for_bit():
    ids = np.concatenate([np.arange(1000), np.random.default_rng(2).integers(0, 2**63 - 1, 5000),
                          [2**63 - 1]]).astype(np.int64)
    for table in (0, 1, 25, 127, 128, 255):
        want = raw_keys(np.full(len(ids), table), ids)
        assert (raw_keys_torch(table, torch.from_numpy(ids)).numpy() == want).all()
        assert (table_of(want) == table).all()


def test_probes_pass_tombstones_and_inserts_reuse_them():
    m = DynamicRowMap(capacity=3)  # 8 slots: keys with equal bits 16-18 share a home slot
    a, b, c, d = ((np.arange(1, 5, dtype=np.int64) << 24) | (5 << 16))
    rows, _ = m.resolve(np.array([a, b, c]), examples=1)  # slots 5, 6, 7 in turn
    m.resolve(np.array([b, c]), examples=1)  # a: the least recently used
    new, fresh = m.resolve(np.array([d]), examples=1)  # a evicted: its slot a tombstone
    assert list(fresh) == [rows[0]] and new[0] == rows[0]
    found, _ = m.resolve(np.array([a, b, c, d]), admit=False)
    assert list(found) == [DEFAULT_ROW, rows[1], rows[2], rows[0]]
    assert m.counters()["live"] == 3 and m._slots[5] == rows[0]  # d took a's slot


def test_the_slots_in_use_grow_with_the_keys_and_every_key_stays_found():
    from shadowsync.embeddings.dynamic import _MIN_SLOTS, _SLOTS_USED

    m = DynamicRowMap(capacity=100_000)  # 262,144 slots, a few thousand in use at first
    assert m._meta[_SLOTS_USED] == _MIN_SLOTS < len(m._slots)
    held = []
    for step in range(40):  # 40 x 1,000 new ids, some of them repeated within a call
        ids = np.arange(step * 1000, (step + 1) * 1000) * 7919 + 3
        keys = keys_of(np.concatenate([ids, ids[:100]]))
        rows, fresh = m.resolve(keys, examples=1100)
        assert len(fresh) == 1000 and (rows[1000:] == rows[:100]).all()
        held.append((keys[:1000], rows[:1000]))
        used = int(m._meta[_SLOTS_USED])
        assert 8 * m.counters()["live"] <= 2 * used <= 2 * len(m._slots)  # a quarter at most
        assert not m._slots[used:].any()  # nothing past the slots in use
    assert m._meta[_SLOTS_USED] > _MIN_SLOTS
    for keys, rows in held:  # found after every growth, and after a round trip
        assert (m.find(keys) == rows).all()
    b = DynamicRowMap(capacity=100_000)
    b.load_state_dict({k: v.clone() for k, v in m.state_dict().items()})
    assert min(8 * b.counters()["live"], len(b._slots)) <= b._meta[_SLOTS_USED]
    assert all((b.find(keys) == rows).all() for keys, rows in held)


def test_only_rows_that_held_another_id_are_handed_back_for_a_reset():
    m = DynamicRowMap(capacity=4)
    clock, _ = m.touch(np.zeros(4, dtype=np.int64), 4)
    rows = np.zeros(4, dtype=np.int64)
    fresh, reused = m.admit(keys_of([1, 2, 3, 4]), rows, clock)
    assert sorted(fresh) == [1, 2, 3, 4] and len(reused) == 0  # first given: the pool's draw
    _, fresh = m.resolve(keys_of([5, 6]), examples=2)  # full: the two oldest rows evicted
    rows = np.zeros(1, dtype=np.int64)
    again, reused = m.admit(keys_of([7]), rows, m.touch(rows, 1)[0])
    assert len(fresh) == 2 and list(reused) == list(again) and again[0] in (1, 2, 3, 4)
    loaded = DynamicRowMap(capacity=8)
    loaded.load_state_dict(DynamicRowMap(capacity=8).state_dict())
    rows = np.zeros(1, dtype=np.int64)
    fresh, reused = loaded.admit(keys_of([9]), rows, 1)
    assert list(reused) == list(fresh) == [1]  # a loaded map cannot tell: every row is reset


def test_a_key_admitted_by_another_holder_after_the_find_is_not_admitted_twice():
    ours = DynamicRowMap(capacity=8)
    theirs = DynamicRowMap(capacity=8, tensors=ours.tensors)  # the same arrays, as in shm
    key = keys_of([42])
    seen = ours.admissions()
    rows = ours.find(key)
    assert rows[0] == DEFAULT_ROW
    their_rows, _ = theirs.resolve(key, examples=1)
    fresh, _ = ours.admit(key, rows, ours.touch(rows, 1)[0], seen)
    assert len(fresh) == 0 and rows[0] == their_rows[0] and ours.counters()["live"] == 1
    # Nobody admitted since the find: the missing key is not looked up again, and admitted.
    other = keys_of([43])
    seen, rows = ours.admissions(), ours.find(other)
    fresh, _ = ours.admit(other, rows, ours.touch(rows, 1)[0], seen)
    assert list(fresh) == list(rows) and ours.counters()["live"] == 2


def test_few_and_many_new_keys_are_counted_alike():
    from shadowsync.embeddings.dynamic import _FEW_KEYS, _distinct

    rng = np.random.default_rng(0)
    for n in (1, _FEW_KEYS, _FEW_KEYS + 1, 200):
        values = rng.integers(0, max(2, n // 3), size=n).astype(np.int64)
        new, inverse, counts = _distinct(values, counted=True)
        assert (new[inverse] == values).all() and len(set(new.tolist())) == len(new)
        assert dict(zip(new.tolist(), counts.tolist())) == {
            v: int((values == v).sum()) for v in set(values.tolist())}


def test_rows_another_process_holds_are_neither_evicted_nor_expired_until_it_lets_go():
    for eviction in (Eviction(), Eviction.parse("ttl:4")):
        m = DynamicRowMap(capacity=4, eviction=eviction)
        old, _ = m.resolve(keys_of([10, 11]), examples=2)
        held = np.zeros(2, dtype=np.int64)
        clock, _ = m.touch(held, 2)
        m.admit(keys_of([1, 2]), held, clock)
        m.hold(user=7, clock=clock)  # another worker's next batch: ids 1 and 2, at clock 4
        new, _ = m.resolve(keys_of([3, 4]), examples=2)  # full: 10 and 11, used before, go
        assert sorted(new) == sorted(old)
        # Every other row is held or used since the pin: a new id waits on the default row.
        assert m.resolve(keys_of([5]), examples=2)[0][0] == DEFAULT_ROW
        assert (m.find(keys_of([1, 2])) == held).all()  # still its ids' rows
        m.release(7)
        got, _ = m.resolve(keys_of([5, 6]), examples=2)  # let go: the oldest go first
        assert sorted(got) == sorted(held) and (m.find(keys_of([1, 2])) == DEFAULT_ROW).all()


def test_a_client_holds_its_batch_before_too_until_its_next_resolve():
    m = DynamicRowMap(capacity=2)
    first = np.zeros(1, dtype=np.int64)
    clock, _ = m.touch(first, 1)
    m.admit(keys_of([1]), first, clock)
    m.hold(user=-1, clock=clock, keep_previous=True)
    second = np.zeros(1, dtype=np.int64)
    clock, _ = m.touch(second, 1)
    m.admit(keys_of([2]), second, clock)
    m.hold(user=-1, clock=clock, keep_previous=True)  # the push of id 1 still to come
    assert m.resolve(keys_of([3]), examples=1)[0][0] == DEFAULT_ROW  # both held: it waits
    third = m.find(keys_of([4]))
    clock, _ = m.touch(third, 1)
    m.hold(user=-1, clock=clock, keep_previous=True)  # id 1's push is done
    assert m.resolve(keys_of([3]), examples=1)[0][0] == first[0]


def test_rows_freed_between_the_find_and_the_lock_are_found_again():
    m = DynamicRowMap(capacity=1)
    key = keys_of([1])
    m.resolve(key, examples=1)
    evicted, rows = m.evictions(), m.find(key)
    m.resolve(keys_of([2]), examples=1)  # another process: id 1's row goes to id 2
    m.refind(key, rows, evicted)
    assert rows[0] == DEFAULT_ROW
