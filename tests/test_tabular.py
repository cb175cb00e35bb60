"""Parquet and CSV with a schema: converted once into the array-directory layout (multi-hot
features as values / offsets / weights), and every bad input one line."""

from __future__ import annotations

import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from shadowsync.data import arrays, tabular
from shadowsync.data.ids import raw_ids
from shadowsync.errors import UserError
from tests.helpers import run_cli

SCHEMA = """
label = "click"
dense = ["age", "price"]

[[categorical]]
name = "user"
table_size = 10

[[categorical]]
name = "item"
table_size = 7
hash = true

[[multi_hot]]
name = "genres"
table_size = 5
pooling = "mean"
weights = "genre_weights"
"""


def _table(**override):
    cols = {
        "click": pa.array([1, 0, 1, 0], pa.int64()),
        "age": pa.array([0.5, 1.5, -2.0, 3.0]),
        "price": pa.array([1, 2, 3, 4], pa.int32()),
        "user": pa.array([3, 9, 0, 3], pa.int64()),
        "item": pa.array(["a", "b", "a", "zz"]),
        "genres": pa.array([[1, 2], [], None, [4, 0, 4]], pa.list_(pa.int64())),
        "genre_weights": pa.array([[0.5, 0.5], [], None, [1.0, 2.0, 3.0]],
                                  pa.list_(pa.float32())),
        "unused": pa.array(["x"] * 4),
    }
    cols.update(override)
    return pa.table({k: v for k, v in cols.items() if v is not None})


@pytest.fixture
def schema(tmp_path):
    path = tmp_path / "schema.toml"
    path.write_text(SCHEMA)
    return str(path)


@pytest.fixture(autouse=True)
def _private_cache(private_cache_root):
    pass


def _parquet(tmp_path, table, name="d.parquet", row_group_size=None):
    path = tmp_path / name
    pq.write_table(table, path, row_group_size=row_group_size)
    return str(path)


def test_parquet_converts_to_the_shared_array_layout(tmp_path, schema, monkeypatch):
    monkeypatch.setattr(tabular, "BATCH_ROWS", 3)  # batches that split the rows
    data = _parquet(tmp_path, _table(), row_group_size=2)
    out = tabular.convert(data, schema)
    assert (np.load(out / "labels.npy") == [1, 0, 1, 0]).all()
    dense = np.load(out / "dense.npy")
    assert dense.dtype == np.float32 and (dense == [[0.5, 1], [1.5, 2], [-2, 3], [3, 4]]).all()
    cats = np.load(out / "cats.npy")
    assert cats.dtype == np.int64 and (cats[:, 0] == [3, 9, 0, 3]).all()
    assert (cats[:, 1] < 7).all() and cats[0, 1] == cats[2, 1]  # "a" hashes alike
    assert (np.load(out / "genres.values.npy") == [1, 2, 4, 0, 4]).all()
    assert (np.load(out / "genres.offsets.npy") == [0, 2, 2, 2, 5]).all()
    w = np.load(out / "genres.weights.npy")
    assert w.dtype == np.float32 and (w == [0.5, 0.5, 1, 2, 3]).all()
    assert json.loads((out / "features.json").read_text()) == {
        "dense": ["age", "price"],
        "categorical": [{"name": "user", "table_size": 10}, {"name": "item", "table_size": 7}],
        "multi_hot": [{"name": "genres", "table_size": 5, "pooling": "mean", "weighted": True}]}
    arrays.check_multi_hot(str(out), "genres", 5, 4)
    assert tabular.convert(data, schema) == out  # found again, not converted twice


def test_csv_reads_like_parquet(tmp_path, schema):
    table = _table(genres=pa.array(["1|2", "", "", "4|0|4"]),
                   genre_weights=pa.array(["0.5|0.5", "", "", "1|2|3"]))
    csv = tmp_path / "d.csv"
    pacsv.write_csv(table, csv)
    from_csv = tabular.convert(str(csv), schema)
    from_parquet = tabular.convert(_parquet(tmp_path, _table()), schema)
    for name in ("labels", "dense", "cats", "genres.values", "genres.offsets", "genres.weights"):
        assert (np.load(from_csv / f"{name}.npy") == np.load(from_parquet / f"{name}.npy")).all()


def _message(tmp_path, schema, **override):
    with pytest.raises(UserError) as e:
        tabular.convert(_parquet(tmp_path, _table(**override)), schema)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_a_missing_column_is_named_with_its_role(tmp_path, schema):
    assert _message(tmp_path, schema, price=None).endswith(
        "d.parquet: no column 'price' (the schema " + schema + " names it as dense)")
    assert "no column 'click'" in _message(tmp_path, schema, click=None)


def test_a_column_of_the_wrong_type(tmp_path, schema):
    assert _message(tmp_path, schema, age=pa.array(["old", "young", "x", "y"])).endswith(
        "d.parquet: column 'age' (dense) is string, expected numbers")
    assert "column 'genres' (multi_hot) is int64, expected lists of integer ids" in \
        _message(tmp_path, schema, genres=pa.array([1, 2, 3, 4]))


def test_a_negative_id_names_file_and_row(tmp_path, schema):
    assert _message(tmp_path, schema, user=pa.array([3, 9, -1, 3])).endswith(
        "d.parquet:3: column 'user': negative id -1 (ids must be >= 0)")
    assert _message(tmp_path, schema, genres=pa.array([[1], [], None, [0, -4, 1]]),
                    genre_weights=pa.array([[1.0], [], None, [1.0, 1.0, 1.0]])).endswith(
        "d.parquet:4: column 'genres': negative id -4 (ids must be >= 0)")


def test_an_id_past_its_table_says_the_size_to_set(tmp_path, schema):
    msg = _message(tmp_path, schema, user=pa.array([3, 10, 0, 12]))
    assert msg.endswith(f"d.parquet:2: column 'user': id 10 is past its table of 10 rows; set "
                        f"table_size = 13 for it in {schema} (or hash = true)")


def test_nan_or_null_in_a_dense_column(tmp_path, schema):
    assert _message(tmp_path, schema, age=pa.array([0.5, 1.0, float("nan"), 2.0])).endswith(
        "d.parquet:3: column 'age' (dense): nan is not a finite number")
    assert _message(tmp_path, schema, age=pa.array([0.5, None, 1.0, 2.0])).endswith(
        "d.parquet:2: column 'age' (dense) is empty")


def test_weights_that_do_not_match_the_ids(tmp_path, schema):
    assert _message(tmp_path, schema, genre_weights=pa.array(
        [[0.5], [], None, [1.0, 2.0, 3.0]], pa.list_(pa.float32()))).endswith(
        "d.parquet:1: column 'genre_weights' has 1 weights for 2 ids of 'genres'")


def test_a_bad_csv_value_names_its_line(tmp_path, schema):
    csv = tmp_path / "d.csv"
    table = _table(genres=pa.array(["1", "", "", "2"]), genre_weights=pa.array(["1", "", "", "1"]))
    pacsv.write_csv(table.set_column(2, "price", pa.array(["1", "2", "cheap", "4"])), csv)
    with pytest.raises(UserError, match=re.escape(f"{csv}:4: column 'price' (dense): 'cheap' is "
                                                  "not a number")):
        tabular.convert(str(csv), schema)


def test_a_ragged_csv_row_names_its_line(tmp_path, schema):
    csv = tmp_path / "d.csv"
    pacsv.write_csv(_table(genres=pa.array(["1", "", "", "2"]),
                           genre_weights=pa.array(["1", "", "", "1"])), csv)
    lines = csv.read_text().splitlines()
    lines[3] = lines[3].rsplit(",", 1)[0]  # the third row loses its last field
    csv.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError) as e:
        tabular.convert(str(csv), schema)
    assert str(e.value) == f"{csv}:4: 7 fields, but the header has 8"


@pytest.mark.parametrize("text, message", [
    ("dense = []\n", "'label' must name the label column"),
    ('label = "click"\n', "no [[categorical]] or [[multi_hot]] column"),
    ('label = "click"\n[[categorical]]\nname = "u"\n', "'table_size' must be a positive"),
    ('label = "click"\nlabels = 1\n', "unknown key 'labels'"),
    ('label = "click"\n[[multi_hot]]\nname = "g"\ntable_size = 3\npooling = "max"\n',
     "'pooling' must be one of sum, mean"),
])
def test_bad_schemas_name_the_key(tmp_path, text, message):
    path = tmp_path / "s.toml"
    path.write_text(text)
    with pytest.raises(UserError, match=re.escape(message)):
        tabular.TableSchema.load(str(path))


def test_offsets_that_do_not_end_at_the_values(tmp_path):
    d = tmp_path / "mh"
    d.mkdir()
    np.save(d / "g.values.npy", np.array([1, 2, 3], np.int64))
    np.save(d / "g.offsets.npy", np.array([0, 1, 2], np.int64))
    with pytest.raises(UserError, match=re.escape("g.offsets.npy: ends at 2, but g.values.npy "
                                                  "holds 3 ids")):
        arrays.check_multi_hot(str(d), "g", 5, 2)
    np.save(d / "g.offsets.npy", np.array([0, 1, 3], np.int64))
    with pytest.raises(UserError, match=re.escape("g.values.npy: row 1: id 3 is past its table "
                                                  "of 3 rows")):
        arrays.check_multi_hot(str(d), "g", 3, 2)


@pytest.mark.timeout(120)
def test_parquet_trains_and_a_bad_file_exits_2_in_one_line(tmp_path):
    rng = np.random.default_rng(0)
    n = 4000
    user = rng.integers(0, 40, n)
    effect = rng.standard_normal(40) * 2
    y = (rng.random(n) < 1 / (1 + np.exp(-effect[user]))).astype(np.int64)
    table = pa.table({"click": y, "age": rng.standard_normal(n), "user": user})
    data = _parquet(tmp_path, table)
    schema = tmp_path / "s.toml"
    schema.write_text('label = "click"\ndense = ["age"]\n[[categorical]]\nname = "user"\n'
                      'table_size = 40\n')
    out = tmp_path / "run"
    local = ["--trainers", "1", "--embedding-servers", "0", "--sync", "none", "--no-progress"]
    res = run_cli(["train", "--data", data, "--schema", str(schema), *local, "--epochs", "2",
                   "--batch-size", "64", "--out", str(out)], timeout=100)
    assert res.returncode == 0, res.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["eval_auc"] > 0.7 and s["config"]["schema"] == str((out / "schema.toml").resolve())
    assert (out / "schema.toml").read_text() == schema.read_text()  # the run keeps its schema
    bad = _parquet(tmp_path, table.set_column(2, "user", pa.array(user + 1)), "bad.parquet")
    res = run_cli(["train", "--data", bad, "--schema", str(schema), *local, "--out",
                   str(tmp_path / "r2")], timeout=60)
    assert res.returncode == 2
    assert "is past its table of 40 rows; set table_size = 41" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
    res = run_cli(["train", "--data", data, *local, "--out", str(tmp_path / "r3")], timeout=60)
    assert res.returncode == 2 and "needs --schema" in res.stderr


def test_raw_ids_keep_all_64_bits(tmp_path):
    """ids = "raw" (for --tables dynamic): integers kept as their 64-bit pattern (uint64
    hashes past 2^63 and negative int64 ones alike), strings hashed by `raw_ids`, multi-hot
    values too, table_size optional; the array directory says so."""
    path = tmp_path / "raw.toml"
    path.write_text(SCHEMA.replace('table_size = 7\nhash = true', 'ids = "raw"')
                    .replace('table_size = 5\n', 'table_size = 5\nids = "raw"\n')
                    .replace('table_size = 10\n', 'table_size = 10\nids = "raw"\n'))
    top = 2**64 - 5
    table = _table(user=pa.array([3, 10**15, top, 3], pa.uint64()),
                   genres=pa.array([[1, -2], [], None, [4, -10**12, 4]], pa.list_(pa.int64())))
    out = tabular.convert(_parquet(tmp_path, table), str(path))
    cats = np.load(out / "cats.npy")
    assert cats[:, 0].tolist() == [3, 10**15, top - 2**64, 3]
    assert (cats[:, 1] == raw_ids(["a", "b", "a", "zz"])).all()
    assert cats[0, 1] == cats[2, 1] != cats[1, 1]
    assert (np.load(out / "genres.values.npy") == [1, -2, 4, -10**12, 4]).all()
    features = json.loads((out / "features.json").read_text())
    assert features["multi_hot"][0]["ids"] == "raw" and features["categorical"][1]["ids"] == "raw"
    assert "table_size" not in features["categorical"][1]
    # the run's options set the budget of the column that gives none
    assert arrays.declared_table_rows(str(out)) == [10, None, 5]
    assert len(arrays.load_multi_hot(str(out), 4)[0].values) == 5  # no table-size check
    labels, _, loaded = arrays.load(str(out))  # negative words are ids, not errors
    assert (loaded == cats).all()
    # CSV: the same ids, uint64 text past 2^63 included
    csv = tmp_path / "raw.csv"
    csv.write_text("click,age,price,user,item,genres,genre_weights\n"
                   f"1,0.5,1,3,a,1|-2,0.5|0.5\n0,1.5,2,{10**15},b,,\n"
                   f"1,-2,3,{top},a,,\n0,3,4,3,zz,4|-{10**12}|4,1|2|3\n")
    from_csv = tabular.convert(str(csv), str(path))
    assert (np.load(from_csv / "cats.npy") == cats).all()
    assert (np.load(from_csv / "genres.values.npy") == [1, -2, 4, -10**12, 4]).all()
    path.write_text(SCHEMA.replace("hash = true", 'hash = true\nids = "raw"'))
    with pytest.raises(UserError, match="choose one"):
        tabular.convert(_parquet(tmp_path, _table(), name="e.parquet"), str(path))


def test_table_size_against_sizes_the_schema_declares_is_refused(tmp_path, schema):
    from shadowsync.config import TrainConfig
    from shadowsync.train.tasks import features_of

    data = _parquet(tmp_path, _table())
    declared = features_of(TrainConfig(data=data, schema=schema)).table_rows
    assert declared == (10, 7, 5)
    assert features_of(TrainConfig(data=data, schema=schema, table_size=[10, 7, 5])).table_rows \
        == declared  # the same sizes again: nothing ignored
    with pytest.raises(UserError) as e:
        features_of(TrainConfig(data=data, schema=schema, table_size=[50]))
    assert str(e.value) == (f"--table-size: {schema} declares its tables' sizes (10, 7, 5); "
                            "set them there, not with --table-size")


BUCKETED = SCHEMA + """
[[categorical]]
name = "age_bucket"
bucketize = "age"
edges = [0.0, 1.5]
table_size = 3
"""


def test_a_bucketized_feature_cuts_its_column_at_the_edges_in_parquet_and_csv(tmp_path):
    """id = #edges <= value: ages 0.5, 1.5, -2, 3 against edges 0, 1.5 -> 1, 2, 0, 2; the
    age stays a dense feature too, and features.json carries the rule."""
    path = tmp_path / "b.toml"
    path.write_text(BUCKETED)
    table = _table()
    from_parquet = tabular.convert(_parquet(tmp_path, table), str(path))
    csv = tmp_path / "d.csv"
    pacsv.write_csv(table.drop(["genres", "genre_weights"]), csv)
    path_csv = tmp_path / "c.toml"
    path_csv.write_text(BUCKETED.replace('weights = "genre_weights"\n', "")
                        .replace("[[multi_hot]]\nname = \"genres\"\ntable_size = 5\n"
                                 "pooling = \"mean\"\n", ""))
    from_csv = tabular.convert(str(csv), str(path_csv))
    for out in (from_parquet, from_csv):
        assert np.load(out / "cats.npy")[:, 2].tolist() == [1, 2, 0, 2]
        assert np.load(out / "dense.npy")[:, 0].tolist() == [0.5, 1.5, -2.0, 3.0]
        declared = json.loads((out / "features.json").read_text())["categorical"][2]
        assert declared == {"name": "age_bucket", "table_size": 3, "bucketize": "age",
                            "edges": [0.0, 1.5]}


@pytest.mark.parametrize("extra, message", [
    ('edges = [1.0]\n', "'edges' needs 'bucketize'"),
    ('bucketize = "age"\nedges = [1.0, 1.0]\n', "'edges' must increase"),
    ('bucketize = "age"\nedges = []\n', "'edges' must be a list of finite numbers"),
    ('bucketize = "age"\nedges = [0.0, nan]\n', "'edges' must be a list of finite numbers"),
    ('bucketize = "age"\nedges = [0.0, 1.0, 2.0]\n', "3 edges make 4 buckets: set "
     "table_size = 4"),
    ('bucketize = "age"\nedges = [0.0, 1.0]\nhash = true\n', "no hash"),
])
def test_bad_bucket_rules_name_the_feature(tmp_path, extra, message):
    path = tmp_path / "s.toml"
    path.write_text(f'label = "click"\n[[categorical]]\nname = "a"\ntable_size = 3\n{extra}')
    with pytest.raises(UserError, match=re.escape(message)):
        tabular.TableSchema.load(str(path))


def test_a_bucketized_column_that_is_not_a_number_is_named(tmp_path):
    path = tmp_path / "b.toml"
    path.write_text(BUCKETED.replace('bucketize = "age"', 'bucketize = "unused"'))
    with pytest.raises(UserError, match=re.escape("column 'unused' (dense) is string")):
        tabular.convert(_parquet(tmp_path, _table()), str(path))
