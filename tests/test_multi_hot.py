"""Multi-hot and weighted sparse features: pooling and the sparse update against closed forms,
the arrays format's checks, and real runs (local tables, an embedding server, eval)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from shadowsync.data.bags import Bags
from shadowsync.data.dataset import batch_of, batches, feature_counts, open_data
from shadowsync.data.jagged import Jagged
from shadowsync.embeddings import EmbeddingTables
from shadowsync.errors import UserError
from shadowsync.transport.servers.embedding.plan import ShardingPlan
from tests.helpers import at_job_store, run_cli, summary

ITEMS = 200  # ids of the multi-hot feature
ONE_PROCESS = ["--trainers", "1", "--embedding-servers", "0", "--sync", "none", "--no-progress",
               "--workers", "1", "--checkpoint-every", "never"]
LOCAL = [*ONE_PROCESS, "--table-size", f"30,{ITEMS},10"]  # arrays that declare no sizes


def write_multi_hot_dir(path, rows: int = 40_000, seed: int = 0, first_id_only: bool = False):
    """Arrays whose click depends on every id of a multi-hot feature ``items`` (1 to 6 ids a
    row): label ~ Bernoulli(sigmoid(sum of the row's per-id effects + a weak dense term)).
    A weighted, mean-pooled ``tags`` feature and one single-id column carry no signal.
    ``first_id_only`` keeps the same rows, labels and features but each row's first item."""
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((rows, 2)).astype(np.float32)
    cats = rng.integers(0, 30, (rows, 1)).astype(np.int64)
    lengths = rng.integers(1, 7, rows)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    values = rng.integers(0, ITEMS, offsets[-1]).astype(np.int64)
    effect = rng.standard_normal(ITEMS) * 0.8
    logit = np.add.reduceat(effect[values], offsets[:-1]) + 0.3 * dense[:, 0] - 0.5
    labels = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    tag_lengths = rng.integers(0, 3, rows)
    tag_offsets = np.concatenate([[0], np.cumsum(tag_lengths)]).astype(np.int64)
    tags = rng.integers(0, 10, tag_offsets[-1]).astype(np.int64)
    tag_weights = rng.random(len(tags)).astype(np.float32)
    if first_id_only:
        values = values[offsets[:-1]]
        offsets = np.arange(rows + 1, dtype=np.int64)
    path.mkdir(parents=True, exist_ok=True)
    arrays = {"labels": labels, "dense": dense, "cats": cats,
              "items.values": values, "items.offsets": offsets,
              "tags.values": tags, "tags.offsets": tag_offsets, "tags.weights": tag_weights}
    for name, arr in arrays.items():
        np.save(path / f"{name}.npy", arr)
    (path / "features.json").write_text(json.dumps({
        "dense": ["d0", "d1"], "categorical": [{"name": "c0", "table_size": 30}],
        "multi_hot": [{"name": "items", "table_size": ITEMS, "pooling": "sum", "weighted": False},
                      {"name": "tags", "table_size": 10, "pooling": "mean", "weighted": True}]}))
    return path


# --- pooling and the sparse update, closed forms -------------------------------------------

def _bags() -> Bags:
    """Two examples; one single-id feature (table 0); table 1 sum-pooled and weighted
    (bags [1, 1, 4] and []); table 2 mean-pooled (bags [0, 2] and [2])."""
    single = torch.tensor([[3], [5]])
    return Bags.build(single, [
        (torch.tensor([1, 1, 4]), torch.tensor([0, 3, 3]), torch.tensor([0.5, 2.0, -1.0]), "sum"),
        (torch.tensor([0, 2, 2]), torch.tensor([0, 2, 3]), None, "mean")])


def test_pooling_matches_the_sums_written_out():
    tables = EmbeddingTables([6, 6, 6], 4, optimizer="sgd", lr=0.1, seed=3)
    w = tables.weight.clone()
    out = tables.lookup(_bags())
    expected = torch.stack([
        torch.stack([w[3], 0.5 * w[6 + 1] + 2.0 * w[6 + 1] - w[6 + 4], (w[12] + w[14]) / 2]),
        torch.stack([w[5], torch.zeros(4), w[14]])])
    assert out.shape == (2, 3, 4)
    assert torch.allclose(out, expected, atol=1e-6)


def test_single_ids_as_bags_of_one_look_up_the_same_rows():
    tables = EmbeddingTables([7, 9], 3, seed=1)
    ids = torch.tensor([[1, 2], [6, 8], [0, 0]])
    assert torch.equal(tables.lookup(Bags.build(ids, [])), tables.lookup(ids))


def test_sgd_update_of_a_bag_gives_each_row_its_weighted_share():
    tables = EmbeddingTables([6, 6, 6], 4, optimizer="sgd", lr=0.1, seed=3)
    w = tables.weight.clone()
    g = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(0))
    tables.apply_gradients(_bags(), g)
    expected = w.clone()
    expected[3] -= 0.1 * g[0, 0]
    expected[5] -= 0.1 * g[1, 0]
    expected[7] -= 0.1 * (0.5 + 2.0) * g[0, 1]  # id 1 twice in one bag: both shares
    expected[10] -= 0.1 * -1.0 * g[0, 1]
    expected[12] -= 0.1 * g[0, 2] / 2
    expected[14] -= 0.1 * (g[0, 2] / 2 + g[1, 2])  # in both examples' bags: the sum
    assert torch.allclose(tables.weight, expected, atol=1e-6)


def test_rowwise_adagrad_sums_a_rows_shares_before_its_one_step():
    tables = EmbeddingTables([6, 6, 6], 4, optimizer="adagrad", lr=0.1, seed=3,
                             initial_accumulator=0.5)
    w = tables.weight.clone()
    g = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(1))
    tables.apply_gradients(_bags(), g)
    row_grads = {3: g[0, 0], 5: g[1, 0], 7: 2.5 * g[0, 1], 10: -g[0, 1],
                 12: g[0, 2] / 2, 14: g[0, 2] / 2 + g[1, 2]}
    expected_w, expected_acc = w.clone(), torch.full((18,), 0.5)
    for row, grad in row_grads.items():
        expected_acc[row] += grad.pow(2).mean()
        expected_w[row] -= 0.1 * grad / (expected_acc[row].sqrt() + tables.eps)
    assert torch.allclose(tables.state, expected_acc, atol=1e-6)
    assert torch.allclose(tables.weight, expected_w, atol=1e-6)


def test_a_multi_hot_features_rows_start_their_accumulator_at_its_own_value(tmp_path):
    """--embedding-initial-accumulator for single-id features' tables, and
    --multi-hot-initial-accumulator for multi-hot ones', in a trainer's tables and on servers
    (a table split row-wise included); data without multi-hot features keeps one value."""
    from shadowsync.config import TrainConfig
    from shadowsync.train.local import local_tables
    from shadowsync.train.tasks import features_of

    data = write_multi_hot_dir(tmp_path / "d", rows=50)
    cfg = TrainConfig(data=str(data), table_size=[30, ITEMS, 10],
                      embedding_initial_accumulator=0.05, multi_hot_initial_accumulator=0.01)
    features = features_of(cfg)
    assert features.multi_hot == (False, True, True)
    start = {0: 0.05, 1: 0.01, 2: 0.01}
    expected = torch.tensor([start[t] for t, n in enumerate(features.table_rows)
                             for _ in range(n)])
    assert torch.equal(local_tables(cfg.model, cfg.optim, cfg.seed, features).state, expected)
    plan = ShardingPlan(2, features.table_rows, row_split_limit=100)  # items: split
    optimizer = cfg.optim.table_optimizer(features.multi_hot)
    state = torch.cat([EmbeddingTables(plan.server_pieces(s), 4,
                                       **plan.server_optimizer(s, optimizer)).state
                       for s in range(2)])
    for t, n in enumerate(features.table_rows):
        assert torch.equal(state[plan.table_keys(t)], torch.full((n,), start[t])), t
    synthetic = TrainConfig()
    assert features_of(synthetic).multi_hot == (False,) * 26
    assert synthetic.optim.table_optimizer(features_of(synthetic).multi_hot)[
        "initial_accumulator"] == synthetic.optim.embedding_initial_accumulator


def test_unpool_is_the_transpose_of_pool():
    bags = _bags()
    rows = torch.randn(len(bags.ids), 5, generator=torch.Generator().manual_seed(2))
    grads = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(3))
    # <pool(r), g> = <r, unpool(g)> for every r, g: unpool is pool's adjoint (its gradient).
    assert torch.allclose((bags.pool(rows) * grads).sum(), (rows * bags.unpool(grads)).sum(),
                          atol=1e-5)


@pytest.mark.parametrize("split_limit", [10**9, 5])
def test_server_keys_of_pairs_agree_with_single_id_keys(split_limit):
    keys = ShardingPlan(3, (6, 20, 11), split_limit).keys()
    ids = torch.tensor([[0, 19, 10], [5, 7, 3], [2, 0, 9]])
    bags = Bags.build(ids, [])
    assert torch.equal(keys.keys(bags), keys.of(ids))
    # and every (table, id) has a key of its own
    tables = torch.arange(3).repeat_interleave(torch.tensor([6, 20, 11]))
    all_ids = torch.cat([torch.arange(n) for n in (6, 20, 11)])
    assert len(torch.unique(keys.of_pairs(tables, all_ids))) == 37


SERVER_PLAN = ShardingPlan(2, (6, 6, 6), row_split_limit=4)  # every table split over both


def _sgd_server(index: int, port: int, results) -> None:
    from shadowsync.transport.rpc import RpcEndpoint
    from shadowsync.transport.servers.embedding.server import serve

    serve(SERVER_PLAN, index, 4, {"optimizer": "sgd", "lr": 0.1}, seed=0)
    at_job_store(port).join(f"emb{index}", index, 3)
    RpcEndpoint.leave()


def _bags_client(port: int, results) -> None:
    from shadowsync.transport.layout import ClusterLayout
    from shadowsync.transport.servers.embedding.client import RemoteEmbeddings

    layout = ClusterLayout(embedding_servers=2, dense_servers=0, trainers=1, workers=0)
    client = RemoteEmbeddings(SERVER_PLAN, layout, at_job_store(port), 4,
                              {"trainer0": 2}, transport="rpc")
    client.attach("trainer0")
    every_row = torch.arange(6).unsqueeze(1).expand(6, 3).contiguous()
    before = client.lookup(every_row)
    pooled = client.lookup(_bags())
    grads = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(0))
    client.apply_gradients(_bags(), grads)
    client.flush()
    after = client.lookup(every_row)
    client.detach()
    results.put([t.tolist() for t in (before, pooled, grads, after)])


@pytest.mark.timeout(60)
def test_bags_through_rpc_servers_pool_and_update_by_the_closed_forms():
    from tests.helpers import job_store, run_spawned

    with job_store() as port:
        [lists] = run_spawned([(_sgd_server, (0, port)), (_sgd_server, (1, port)),
                               (_bags_client, (port,))], 1, timeout=45)
    before, pooled, g, after = map(torch.tensor, lists)
    w = before.transpose(0, 1).reshape(18, 4)  # table t's row i at 6 t + i, as in one local matrix
    expected = torch.stack([
        torch.stack([w[3], 0.5 * w[6 + 1] + 2.0 * w[6 + 1] - w[6 + 4], (w[12] + w[14]) / 2]),
        torch.stack([w[5], torch.zeros(4), w[14]])])
    assert torch.allclose(pooled, expected, atol=1e-6)
    moved = w.clone()
    for row, grad in {3: g[0, 0], 5: g[1, 0], 7: 2.5 * g[0, 1], 10: -g[0, 1],
                      12: g[0, 2] / 2, 14: g[0, 2] / 2 + g[1, 2]}.items():
        moved[row] -= 0.1 * grad
    assert torch.allclose(after.transpose(0, 1).reshape(18, 4), moved, atol=1e-6)


# --- the arrays format --------------------------------------------------------------------

def test_jagged_rows_by_slice_and_by_index_match_a_loop():
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 4, 50)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    values = rng.integers(0, 100, offsets[-1])
    weights = rng.random(offsets[-1]).astype(np.float32)
    feature = Jagged("f", values, offsets, weights, "mean")
    for index in (slice(7, 19), rng.permutation(50)[:20], np.array([3, 3, 0, 49])):
        got_v, got_o, got_w = feature.rows(index)
        picked = range(50)[index] if isinstance(index, slice) else index
        assert np.array_equal(got_o, np.concatenate([[0], np.cumsum(lengths[picked])]))
        assert np.array_equal(got_v, np.concatenate(
            [values[offsets[i]:offsets[i + 1]] for i in picked]))
        assert np.array_equal(got_w, np.concatenate(
            [weights[offsets[i]:offsets[i + 1]] for i in picked]))


def test_batches_carry_every_feature(tmp_path):
    path = write_multi_hot_dir(tmp_path / "a", rows=500)
    assert feature_counts(str(path)) == (2, 3)
    data = open_data(str(path))
    assert data.num_tables == 3 and len(data.head(100).multi_hot[0]) == 100
    dense, ids, labels = next(batches(data, 10, 500, 64, table_size=[30, ITEMS, 10]))
    assert isinstance(ids, Bags) and ids.shape == (64, 3)
    items = data.multi_hot[0]
    first = ids.tables == 1
    assert np.array_equal(ids.ids[first].numpy(), items.values[items.offsets[10]:items.offsets[74]])
    tables = EmbeddingTables([30, ITEMS, 10], 4, seed=0)
    assert tables.lookup(ids).shape == (64, 3, 4)
    # any rows in any order (a shuffled pass): the same as those rows cut one by one
    modulus = np.array([30, ITEMS, 10], dtype=np.uint64)
    picked = np.array([7, 400, 3, 3, 499])
    _, shuffled, _ = batch_of(data, picked, modulus)
    one_by_one = [batch_of(data, slice(i, i + 1), modulus)[1] for i in picked]
    assert torch.equal(tables.lookup(shuffled), torch.cat([tables.lookup(b) for b in one_by_one]))


def _spoil(path, name, arr):
    np.save(path / name, arr)


@pytest.mark.parametrize("name, make, message", [
    ("items.offsets.npy", lambda o, v: o[:-1], "items.offsets.npy: 500 offsets, expected 501"),
    ("items.offsets.npy", lambda o, v: np.where(np.arange(len(o)) == 40, o[41] + 1, o),
     "items.offsets.npy: row 40: offsets go down"),
    ("items.offsets.npy", lambda o, v: np.append(o[:-1], o[-1] - 1),
     "items.offsets.npy: ends at"),
    ("items.values.npy", lambda o, v: np.where(np.arange(len(v)) == o[77], -3, v),
     "items.values.npy: row 77: negative id -3"),
    ("items.values.npy", lambda o, v: np.where(np.arange(len(v)) == o[12], ITEMS, v),
     f"items.values.npy: row 12: id {ITEMS} is past its table of {ITEMS} rows"),
    ("tags.weights.npy", lambda o, v: np.ones(3, np.float32),
     "tags.weights.npy: float32 of shape (3,), expected"),
])
def test_bad_multi_hot_arrays_name_the_file_and_row(tmp_path, name, make, message):
    path = write_multi_hot_dir(tmp_path / "a", rows=500)
    offsets, values = np.load(path / "items.offsets.npy"), np.load(path / "items.values.npy")
    _spoil(path, name, make(offsets, values))
    with pytest.raises(UserError, match=re.escape(message)) as e:
        open_data(str(path))
    assert str(path / name) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.timeout(60)
def test_a_bad_multi_hot_file_exits_2_in_one_line(tmp_path):
    path = write_multi_hot_dir(tmp_path / "a", rows=500)
    _spoil(path, "items.offsets.npy", np.arange(400))
    res = run_cli(["train", "--data", str(path), *LOCAL, "--out", str(tmp_path / "run")],
                  timeout=50)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "items.offsets.npy: 400 offsets" in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


# --- real runs ----------------------------------------------------------------------------

@pytest.mark.timeout(300)
def test_a_model_learns_from_every_id_of_a_bag(tmp_path):
    aucs = {}
    for variant, first in (("all", False), ("first", True)):
        data = write_multi_hot_dir(tmp_path / variant, first_id_only=first)
        out = tmp_path / f"run-{variant}"
        res = run_cli(["train", *LOCAL, "--data", str(data), "--out", str(out)], timeout=140)
        assert res.returncode == 0, res.stderr[-3000:]
        aucs[variant] = summary(out)["eval_auc"]
    # The label sums the effects of 1 to 6 items: the first alone explains a fraction of it.
    assert aucs["all"] > 0.75, aucs
    assert aucs["all"] > aucs["first"] + 0.08, aucs


def _rows_of(src, dst, lo, hi):
    """Rows [lo, hi) of the array directory ``src`` as a directory of their own."""
    data = open_data(str(src))
    dst.mkdir(parents=True)
    for name in ("labels", "dense", "cats"):
        np.save(dst / f"{name}.npy", getattr(data, name)[lo:hi])
    for feature in data.multi_hot:
        values, offsets, weights = feature.rows(slice(lo, hi))
        np.save(dst / f"{feature.name}.values.npy", values)
        np.save(dst / f"{feature.name}.offsets.npy", offsets)
        if weights is not None:
            np.save(dst / f"{feature.name}.weights.npy", weights)
    (dst / "features.json").write_text((src / "features.json").read_text())
    return dst


@pytest.mark.timeout(300)
def test_two_trainers_and_an_embedding_server_then_eval_from_the_checkpoint(tmp_path):
    whole = write_multi_hot_dir(tmp_path / "whole", rows=33_000)
    train, held = _rows_of(whole, tmp_path / "train", 0, 30_000), \
        _rows_of(whole, tmp_path / "held", 30_000, 33_000)
    out = tmp_path / "run"
    res = run_cli(["train", "--data", str(train), "--eval-data", str(held), "--trainers", "2",
                   "--workers", "1", "--embedding-servers", "1", "--sync", "s-ma",
                   "--no-progress", "--table-size", f"30,{ITEMS},10", "--checkpoint-every", "0",
                   "--out", str(out)], timeout=200)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.leftover == []
    s = summary(out)
    assert s["eval_auc"] > 0.72, s
    res = run_cli(["eval", "--checkpoint", str(out), "--data", str(held)], timeout=60)
    assert res.returncode == 0, res.stderr[-3000:]
    scored = {ln.split()[0]: float(ln.split()[1].replace(",", ""))
              for ln in res.stdout.splitlines() if ln.split()[0] in ("ne", "auc")}
    # The server's shard read back and looked up with the same pooling: the same scores.
    assert scored["ne"] == pytest.approx(s["eval_ne"], abs=1e-4)
    assert scored["auc"] == pytest.approx(s["eval_auc"], abs=1e-4)
    # the same ids pooled another way are not what the model learnt from: one line, exit 2
    spec = json.loads((held / "features.json").read_text())
    spec["multi_hot"][0]["pooling"] = "mean"
    (held / "features.json").write_text(json.dumps(spec))
    res = run_cli(["eval", "--checkpoint", str(out), "--data", str(held)], timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert "sparse features 1 single-id, items (mean), tags (weighted mean), but the " \
        "checkpoint's model was trained on 1 single-id, items (sum)" in res.stderr


@pytest.mark.timeout(200)
def test_bench_embedding_reports_bags_next_to_single_ids(tmp_path):
    res = run_cli(["bench", "embedding", "--steps", "4", "--repeats", "1",
                   "--out", str(tmp_path)], timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    bench = json.loads((tmp_path / "bench.json").read_text())
    medians = bench["multi_hot"]["medians"]
    for mode in ("rpc", "shm", "local"):
        single, multi = medians[f"{mode}-single"], medians[f"{mode}-multi"]
        assert single["ids_per_batch"] == 26 * 256
        assert 3 * 26 * 256 < multi["ids_per_batch"] < 5 * 26 * 256  # bags of 4 ids on average
        assert multi["lookups_per_s"] > 0 and multi["updates_per_s"] > 0
        assert f"multi_vs_single_lookups_per_s_{mode}" in bench["ratios"]


@pytest.mark.timeout(200)
def test_a_multi_hot_id_past_the_table_size_given_is_one_line(tmp_path):
    data = write_multi_hot_dir(tmp_path / "a", rows=2000)
    spec = json.loads((data / "features.json").read_text())
    del spec["categorical"]  # no sizes for the single-id column: --table-size sizes them all
    (data / "features.json").write_text(json.dumps(spec))
    res = run_cli(["train", "--data", str(data), *LOCAL, "--table-size", "30,100,10",
                   "--out", str(tmp_path / "run")], timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert re.search(r"items\.values\.npy: row \d+: id 1\d\d is past its table of 100 rows; "
                     r"its table needs 200", res.stderr), res.stderr


@pytest.mark.timeout(200)
def test_parquet_list_columns_train_as_multi_hot_features(tmp_path, private_cache_root):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    data = open_data(str(write_multi_hot_dir(tmp_path / "a", rows=20_000)))
    items = data.multi_hot[0]
    lists = [items.values[items.offsets[i]:items.offsets[i + 1]].tolist()
             for i in range(len(data))]
    pq.write_table(pa.table({"click": data.labels, "d0": data.dense[:, 0],
                             "d1": data.dense[:, 1], "c0": data.cats[:, 0],
                             "items": pa.array(lists, pa.list_(pa.int64()))}),
                   tmp_path / "d.parquet")
    (tmp_path / "schema.toml").write_text(
        'label = "click"\ndense = ["d0", "d1"]\n\n[[categorical]]\nname = "c0"\n'
        f'table_size = 30\n\n[[multi_hot]]\nname = "items"\ntable_size = {ITEMS}\n'
        'pooling = "sum"\n')
    out = tmp_path / "run"
    res = run_cli(["train", "--data", str(tmp_path / "d.parquet"), "--schema",
                   str(tmp_path / "schema.toml"), *ONE_PROCESS, "--epochs", "2", "--out",
                   str(out)],
                  timeout=150)
    assert res.returncode == 0, res.stderr[-3000:]
    assert summary(out)["eval_auc"] > 0.72  # the bags' ids are what the label is made of
