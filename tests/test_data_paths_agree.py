"""The same rows read as Parquet with a schema and as the array directories that
`data prepare --format arrays` writes train the same model: one path, whatever the format.

One local trainer with one worker and no --val-share, so the run itself is reproducible to the
bit: with --val-share the best model is copied while the worker trains on (Hogwild), so which
step it holds varies from run to run."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shadowsync
from shadowsync.data import tabular

SCHEMA = """
label = "label"
dense = ["x0", "x1"]

[[categorical]]
name = "user"
table_size = 50

[[categorical]]
name = "item"
table_size = 30

[[categorical]]
name = "x0_quantile"
bucketize = "x0"
edges = [-1.0, 0.0, 0.7]
table_size = 4

[[multi_hot]]
name = "tags"
table_size = 8
pooling = "mean"
"""


def _write(path, rows, rng):
    user, item = rng.integers(0, 50, rows), rng.integers(0, 30, rows)
    x = rng.normal(size=(rows, 2))
    tags = [sorted(set(rng.integers(0, 8, rng.integers(1, 4)).tolist())) for _ in range(rows)]
    logit = x[:, 0] - 0.5 * x[:, 1] + np.sin(user) + np.cos(item) + [len(t) - 2 for t in tags]
    label = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    pq.write_table(pa.table({"label": label, "x0": x[:, 0], "x1": x[:, 1], "user": user,
                             "item": item, "tags": pa.array(tags, pa.list_(pa.int64()))}), path)


@pytest.mark.timeout(240)
def test_parquet_with_a_schema_and_its_arrays_train_the_same_model(tmp_path):
    rng = np.random.default_rng(0)
    (tmp_path / "schema.toml").write_text(SCHEMA)
    schema = tabular.TableSchema.load(str(tmp_path / "schema.toml"))
    for part, rows in (("train", 3000), ("eval", 500)):
        _write(tmp_path / f"{part}.parquet", rows, rng)
        (tmp_path / part).mkdir()
        tabular.build(tmp_path / part, str(tmp_path / f"{part}.parquet"), schema)
    common = {"trainers": 1, "embedding_servers": 0, "sync": "none", "workers": 1,
              "epochs": 2, "batch_size": 64, "progress": False, "log_level": "warning"}
    by_parquet = shadowsync.train(data=str(tmp_path / "train.parquet"),
                                  eval_data=str(tmp_path / "eval.parquet"),
                                  schema=str(tmp_path / "schema.toml"),
                                  out=str(tmp_path / "run-parquet"), **common)
    by_arrays = shadowsync.train(data=str(tmp_path / "train"), eval_data=str(tmp_path / "eval"),
                                 out=str(tmp_path / "run-arrays"), **common)
    assert by_parquet.summary["examples"] == by_arrays.summary["examples"] == 2 * 3000
    a, b = by_parquet.model().state_dict(), by_arrays.model().state_dict()
    assert a.keys() == b.keys() and len(a) > 4
    for key in a:
        assert (a[key] - b[key]).abs().max().item() <= 1e-6, key
    assert by_parquet.summary["eval_auc"] == pytest.approx(by_arrays.summary["eval_auc"],
                                                           abs=1e-6)
    assert by_parquet.summary["eval_auc"] > 0.6  # it learned something
