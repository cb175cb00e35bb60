"""Dynamic tables as a trainer's tables: raw ids in, the default row, updates, a reused row
starting afresh, bags, the budget and the options."""

import pickle

import numpy as np
import pytest
import torch

from shadowsync.config import TrainConfig
from shadowsync.data.bags import Bags
from shadowsync.embeddings.dynamic import Eviction
from shadowsync.embeddings.dynamic_tables import (
    READ,
    TRAIN,
    DynamicTables,
    holder_bytes,
    keys_of,
    pool_rows,
)
from shadowsync.errors import UserError
from shadowsync.train.dynamic_tables import dynamic_spec
from shadowsync.train.tasks.base import Features

BIG = 10**15  # raw ids far past any table size


def tables(capacity=8, admit_after=1, optimizer="sgd", **kw):
    return DynamicTables(2, capacity, 3, admit_after, lr=0.5, optimizer=optimizer, **kw)


def test_unadmitted_ids_read_zeros_and_their_gradients_are_dropped():
    t = tables(admit_after=2)
    ids = torch.tensor([[BIG, BIG + 1]])
    first = t.update_and_lookup(ids, torch.zeros(1, 2, 3), ids)  # one sighting: not admitted
    assert (first == 0).all()
    t.apply_gradients(ids, torch.ones(1, 2, 3))  # dropped: the default row stays zeros
    assert (t.pool.weight[0] == 0).all()
    nxt = torch.tensor([[BIG, BIG + 1]])
    second = t.update_and_lookup(ids, torch.zeros(1, 2, 3), nxt)  # second sighting: rows
    assert (second != 0).all() and t.counters()["admitted"] == 2


def test_an_sgd_step_lands_on_the_ids_rows_and_lookup_only_reads():
    t = tables()
    ids = torch.tensor([[BIG, 7], [BIG, 8]])
    before = t.update_and_lookup(ids, torch.zeros(2, 2, 3), ids).clone()
    grads = torch.arange(12, dtype=torch.float32).view(2, 2, 3)
    after = t.update_and_lookup(ids, grads, ids)
    # Feature 0 holds id BIG twice: its row takes both examples' gradients.
    assert torch.allclose(after[0, 0], before[0, 0] - 0.5 * (grads[0, 0] + grads[1, 0]))
    assert torch.allclose(after[1, 1], before[1, 1] - 0.5 * grads[1, 1])
    lookups = t.counters()["lookups"]
    assert (t.lookup(torch.tensor([[12345, 7]]))[0, 0] == 0).all()  # unknown: default row
    assert t.counters()["lookups"] == lookups  # reading counts nothing


def test_the_same_raw_id_in_two_tables_gets_two_rows():
    t = tables()
    rows = t.rows_of(torch.tensor([[5, 5]]), TRAIN)
    assert rows[0] != rows[1] and (rows > 0).all()


def test_a_reused_row_starts_afresh_with_its_adagrad_accumulator_reset():
    t = DynamicTables(1, 64, 2, lr=0.1, initial_accumulator=0.05)
    first = torch.arange(64).view(64, 1)
    t.update_and_lookup(first, torch.zeros(64, 1, 2), first)
    t.update_and_lookup(first, torch.ones(64, 1, 2), first)  # every row's accumulator grows
    assert (t.pool.state[1:] > 0.05).all()
    newcomer = torch.tensor([[1000]])
    t.update_and_lookup(first, torch.zeros(64, 1, 2), newcomer)  # the pool is full: one evicted
    row = int(t.rows_of(newcomer, READ)[0])
    assert t.counters()["evicted"] == 1 and float(t.pool.state[row]) == pytest.approx(0.05)
    assert t.pool.weight[row].abs().max() <= t.init_bound


def test_bags_are_keyed_as_single_ids_are():
    single = torch.tensor([[3, 4], [5, 6]])
    bags = Bags.build(single, [])
    assert (np.sort(keys_of(bags).numpy()) == np.sort(keys_of(single).numpy())).all()
    t = tables(capacity=16)
    multi = Bags.build(single, [(torch.tensor([BIG, BIG, 9]), torch.tensor([0, 2, 3]), None,
                                 "sum")])
    rows = t.rows_of(multi, TRAIN)
    vectors = t._vectors(multi, rows)
    by_id = t.lookup_rows(t.rows_of(Bags.build(torch.tensor([[0, 0]]), [
        (torch.tensor([BIG]), torch.tensor([0, 1]), None, "sum")]), READ))
    assert torch.allclose(vectors[0, 2], 2 * by_id[-1])  # the bag {BIG, BIG} sums one row twice


def test_the_tables_pickle_with_their_map_in_shared_memory():
    t = tables().share_memory_()
    t.rows_of(torch.tensor([[BIG, 2]]), TRAIN)
    copy = pickle.loads(pickle.dumps(t))
    assert (copy.rows_of(torch.tensor([[BIG, 2]]), READ) ==
            t.rows_of(torch.tensor([[BIG, 2]]), READ)).all()


def test_state_dict_round_trip():
    a = tables(capacity=32, admit_after=2, eviction=Eviction.parse("ttl:100"))
    ids = torch.tensor([[BIG, 1], [BIG, 2]])
    for _ in range(3):
        a.update_and_lookup(ids, torch.ones(2, 2, 3), ids)
    b = tables(capacity=32, admit_after=2, eviction=Eviction.parse("ttl:100"))
    b.load_state_dict({k: v.clone() for k, v in a.state_dict().items()})
    assert torch.equal(a.lookup(ids), b.lookup(ids)) and a.counters() == b.counters()
    # A pool of another size (a warm start with a new budget) takes the saved rows in:
    # three live ids fit in four rows, so every id reads what it read before.
    small = tables(capacity=4, admit_after=2, eviction=Eviction.parse("ttl:100"))
    small.load_state_dict(a.state_dict())
    assert torch.equal(a.lookup(ids), small.lookup(ids))


def test_the_budget_in_rows_or_bytes_and_the_bad_ones():
    assert pool_rows([100, 300], 17, 1, None, 2) == 200
    # 1,000 rows of 17 floats, no admission: rows and Adagrad sums (1,001 with the default
    # row), 2,048 int32 slots, row keys (and the tombstones' key), ages, the free stack, one
    # sketch counter a row of the sketch, the scalars (the slots in use and the highest row
    # given the last), and the holds (a token, a pin and a last hold for each of up to 1,024
    # processes).
    assert holder_bytes(1000, 17, 1) == 1001 * 72 + 2048 * 4 + 1002 * 8 + 1001 * 8 + 1000 * 4 \
        + 4 * 4 + 13 * 8 + 1024 * 3 * 8
    for admit in (1, 2):
        held = DynamicTables(1, 1000, 17, admit).tensors().values()
        allocated = sum(t.numel() * t.element_size() for t in held)
        assert holder_bytes(1000, 17, admit) == allocated
        assert pool_rows([1], 17, admit, allocated, 1) == 1000
        assert pool_rows([1], 17, admit, 2 * allocated + 1, 2) == 1000
    cfg = TrainConfig(tables="dynamic", table_size=[10], batch_size=64).validate()
    with pytest.raises(UserError, match="cannot hold one batch"):
        dynamic_spec(cfg.model, 64, Features(1, (10, 10)), 1)
    ok = TrainConfig(tables="dynamic", table_memory="1MiB", batch_size=8).validate()
    assert dynamic_spec(ok.model, 8, Features(1, (10, 10)), 2).capacity == pool_rows(
        [10, 10], 17, 1, 2**20, 2)


def test_evict_and_table_memory_are_parsed_once_into_typed_values():
    """The configuration holds an `Eviction` and a `TableMemory` (bytes, and the text written,
    which a saved configuration writes back); the spec every holder builds from carries the
    same `Eviction`."""
    from shadowsync.config import config_to_dict
    from shadowsync.spec.table_budget import LRU, TableMemory

    cfg = TrainConfig(tables="dynamic", evict="ttl:500", table_memory="1.5MiB",
                      batch_size=8).validate()
    assert cfg.model.evict == Eviction(500) and cfg.model.table_memory.bytes == 1_572_864
    assert (config_to_dict(cfg)["evict"], config_to_dict(cfg)["table_memory"]) == \
        ("ttl:500", "1.5MiB")
    assert dynamic_spec(cfg.model, 8, Features(1, (10,)), 1).eviction == Eviction(500)
    assert TrainConfig().validate().model.evict == LRU
    assert TableMemory.parse("2GB").bytes == 2 * 10**9 and str(TableMemory(1000)) == "1000"


@pytest.mark.parametrize("options, message", [
    ({"admit_after": 3}, "--admit-after applies to dynamic tables"),
    ({"tables": "dynamic", "evict": "lfu"}, "--evict"),
    ({"tables": "dynamic", "table_memory": "lots"}, "--table-memory"),
    ({"tables": "dynamic", "admit_after": 0}, "--admit-after"),
    ({"tables": "dynamic", "embedding_transport": "unshared"}, "unshared"),
])
def test_bad_options_are_one_line_errors(options, message):
    with pytest.raises(UserError, match=message):
        TrainConfig(**options).validate()


def test_batches_for_dynamic_tables_carry_every_raw_id_unfolded_and_writable():
    from shadowsync.data.dataset import batches, open_data

    data = open_data("synthetic", examples=600)
    raw = np.asarray(data.cats[:600], dtype=np.int64)
    got = [ids for _, ids, _ in batches(data, 0, 600, 256, table_size=[0] * data.num_tables)]
    assert (torch.cat(got).numpy() == raw).all()
    got[0][0, 0] = -1  # the batch owns its ids (the data is a read-only map)
    mixed = [0] + [7] * (data.num_tables - 1)
    ids = next(batches(data, 0, 600, 256, table_size=mixed))[1].numpy()
    assert (ids[:, 0] == raw[:256, 0]).all() and (ids[:, 1:] == raw[:256, 1:] % 7).all()
