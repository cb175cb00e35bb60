"""Raw ids as users have them: 64-bit hashes (uint64, or int64 with the top bit set) and
strings, one id rule (`raw_ids`) from the file to the exported program, a schema read off the
columns, and day-by-day runs that take a new budget and refuse other columns in one line."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from shadowsync.data.ids import raw_id, raw_ids, string_ids
from shadowsync.data.infer import infer_schema
from shadowsync.errors import UserError
from shadowsync.models.trained import unsigned_remainder
from tests.helpers import run_cli

TOP = 2**64 - 1


def test_an_integer_is_its_bit_pattern_and_a_string_its_blake2b_word():
    import hashlib

    as_uint = raw_ids(np.array([TOP, 2**63, 7], dtype=np.uint64))
    as_int = raw_ids(np.array([-1, -(2**63), 7], dtype=np.int64))
    assert as_uint.tolist() == as_int.tolist() == [-1, -(2**63), 7]
    assert raw_ids([TOP, -1, 7, "a"]).tolist()[:3] == [-1, -1, 7]  # Python ints, mixed
    word = int.from_bytes(hashlib.blake2b(b"example.com", digest_size=8).digest(), "little")
    assert raw_id("example.com") == word - (1 << 64) * (word >= 1 << 63)
    assert (raw_ids(pa.chunked_array([["x", "y"], ["x"]])) == string_ids(["x", "y", "x"])).all()
    assert raw_ids(pa.array([TOP], pa.uint64())).tolist() == [-1]
    for bad in ([1.5], [True], pa.array([1, None])):
        with pytest.raises(ValueError, match="not an id|null"):
            raw_ids(bad)


def test_fixed_tables_fold_a_word_as_an_unsigned_number():
    """id mod rows of the word read as u in [0, 2^64), in torch ops (the exported program's)."""
    words = torch.tensor([-1, -5, 0, 9, -(2**63), 2**63 - 1])
    for rows in (1, 3, 1000, 99_991):
        expected = [(int(w) % 2**64) % rows for w in words]
        assert unsigned_remainder(words, rows).tolist() == expected
        assert unsigned_remainder(words, torch.tensor(rows)).tolist() == expected


def test_a_schema_read_off_the_columns(tmp_path):
    table = pa.table({"f": [0.5, 1.0], "flag": [True, False], "click": [1, 0],
                      "h": pa.array([TOP, 3], pa.uint64()), "s": ["a", "b"],
                      "tags": [[1, 2], []], "when": pa.array([1, 2], pa.timestamp("s"))})
    pq.write_table(table, tmp_path / "d.parquet")
    text = infer_schema(str(tmp_path / "d.parquet"))
    assert 'label = "click"\ndense = ["f", "flag"]' in text and "left out: when" in text
    for kind, name in (("categorical", "h"), ("categorical", "s"), ("multi_hot", "tags")):
        assert f'[[{kind}]]\nname = "{name}"\nids = "raw"' in text
    assert "table_size" not in text
    # CSV: a hash past 2^63 is an integer id (pyarrow alone would read a float)
    (tmp_path / "d.csv").write_text(f"y,h,price,s\n1,{TOP},1.5,a\n0,12,2,b\n")
    text = infer_schema(str(tmp_path / "d.csv"), label="y")
    assert 'dense = ["price"]' in text and 'name = "h"' in text and 'name = "s"' in text
    with pytest.raises(UserError, match="--label nope: .* has no such column"):
        infer_schema(str(tmp_path / "d.csv"), label="nope")


def _log(path, seed, new_share, vocab):
    """A click log: 2 dense columns, 2 uint64 hash columns (a share of ids new that day),
    a string column; clicks depend on all three kinds."""
    rng = np.random.default_rng(seed)
    n = 1200
    cols = {}
    for name in ("ad", "user"):
        ids = vocab[name][rng.integers(0, len(vocab[name]), n)]
        fresh = rng.random(n) < new_share
        ids[fresh] = rng.integers(0, TOP, int(fresh.sum()), dtype=np.uint64)
        cols[name] = pa.array(ids, pa.uint64())
    domain = np.array(["a.com", "b.org", "c.net"])[rng.integers(0, 3, n)]
    x = rng.normal(size=(n, 2))
    top_bit = (cols["ad"].to_numpy() >> np.uint64(63)).astype(float)
    logit = x[:, 0] + (domain == "a.com") + 0.7 * top_bit - 0.8
    click = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    pq.write_table(pa.table({"click": click, "age": x[:, 0], "price": x[:, 1], **cols,
                             "domain": domain}), path)


@pytest.mark.timeout(150)
def test_a_hash_log_day_by_day_gives_one_prediction_everywhere(tmp_path):
    """No hand-written schema: day 1, day 2 warm-started with a new budget, then eval, predict
    on raw rows (strings and uint64 included) and the exported program agree to 1e-6."""
    import shadowsync
    from shadowsync.evaluation import evaluate_checkpoint

    rng = np.random.default_rng(0)
    vocab = {c: rng.integers(0, TOP, 150, dtype=np.uint64) for c in ("ad", "user")}
    day1, day2 = tmp_path / "day1.parquet", tmp_path / "day2.parquet"
    _log(day1, 1, 0.0, vocab)
    _log(day2, 2, 0.3, vocab)
    res = run_cli(["data", "schema", str(day1)], timeout=60)
    assert res.returncode == 0, res.stderr
    (tmp_path / "schema.toml").write_text(res.stdout)
    job = dict(trainers=1, embedding_servers=0, workers=1, sync="none", eval_points=0,
               progress=False, batch_size=64)
    first = shadowsync.train(data=str(day1), schema=str(tmp_path / "schema.toml"),
                             tables="dynamic", table_memory="2MB", out=str(tmp_path / "r1"),
                             **job)
    assert (first.out / "schema.toml").read_text() == res.stdout
    second = shadowsync.train(data=str(day2), warm_start=str(first.out), table_memory="1MB",
                              out=str(tmp_path / "r2"), **job)
    kept = second.summary["dynamic_tables"]
    assert kept["capacity"] < first.summary["dynamic_tables"]["capacity"]  # the new budget
    assert kept["clock"] > first.summary["dynamic_tables"]["clock"]  # the maps carried on
    assert second.config.model.tables == "dynamic"  # taken from day 1
    evaluated = evaluate_checkpoint(str(second.out), str(day2), str(tmp_path / "p.npy"))
    expected = np.load(tmp_path / "p.npy")
    model = shadowsync.load(second.out)
    rows = pq.read_table(day2)
    by_table = model.predict(rows).numpy()
    by_dict = model.predict({c: rows.column(c).to_pylist() for c in rows.column_names}).numpy()
    shadowsync.export(second.out, tmp_path / "m.pt2")
    schema = json.loads((tmp_path / "m.pt2.schema.json").read_text())
    dense = torch.tensor(np.stack([rows.column(c).to_numpy() for c in schema["dense"]], 1),
                         dtype=torch.float32)
    sparse = torch.from_numpy(np.stack([raw_ids(rows.column(f["name"]))
                                        for f in schema["features"]], 1))
    program = torch.export.load(str(tmp_path / "m.pt2")).module()
    exported = torch.sigmoid(program(dense, sparse)).numpy()
    assert evaluated["examples"] == rows.num_rows
    for got in (by_table, by_dict, exported):
        assert np.abs(got - expected).max() < 1e-6
    assert schema["ids"]["function"] == "shadowsync.data.ids.raw_ids"
    assert [f["ids"] for f in schema["features"]] == ["raw"] * 3

    # Other columns on the next day: one line naming them, nothing written.
    pq.write_table(rows.drop(["user"]).append_column("site", rows.column("domain")),
                   tmp_path / "day3.parquet")
    with pytest.raises(UserError) as e:
        shadowsync.train(data=str(tmp_path / "day3.parquet"), schema="auto",
                         warm_start=str(second.out), out=str(tmp_path / "r3"), **job)
    assert str(e.value).endswith("has other features than the run it starts from (here only: "
                                 "site; there only: user)") and "\n" not in str(e.value)
    assert not (tmp_path / "r3").exists()


@pytest.mark.timeout(60)
def test_a_model_that_cannot_be_imported_is_one_line_and_model_opens_it(tmp_path):
    """A run whose --model cannot be imported here: eval and export say so in one line and
    write nothing; --model MODULE:FUNCTION opens it."""
    import shadowsync
    from shadowsync.models.dlrm import DLRMDense, ModelConfig

    def factory(num_dense, num_tables, dim):  # a closure: not importable by name
        return DLRMDense(ModelConfig(
            num_dense=num_dense, num_sparse=num_tables, embedding_dim=dim, bottom_mlp=[8],
            top_mlp=[8], id_bias=False))

    rng = np.random.default_rng(3)
    vocab = {c: rng.integers(0, TOP, 50, dtype=np.uint64) for c in ("ad", "user")}
    _log(tmp_path / "d.parquet", 3, 0.0, vocab)
    run = shadowsync.train(data=str(tmp_path / "d.parquet"), schema="auto", tables="dynamic",
                           table_size=2000, model=factory, trainers=1, embedding_servers=0,
                           workers=1, sync="none", eval_points=0, progress=False,
                           out=str(tmp_path / "r"))
    out = tmp_path / "m.pt2"
    res = run_cli(["export", "--checkpoint", str(run.out), "--out", str(out)], timeout=50)
    assert res.returncode == 2
    line = res.stderr.strip()
    assert "\n" not in line and "cannot be imported from here; pass the same factory: --model" \
        in line and not out.exists()
    with pytest.raises(UserError, match="pass the same factory"):
        shadowsync.load(run.out)
    assert len(shadowsync.load(run.out, model=factory).predict(
        pq.read_table(tmp_path / "d.parquet"))) == 1200
