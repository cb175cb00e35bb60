"""The baselines of `bench realdata` read the prepared features: DeepFM embeds a bucketized
number like any single id; LightGBM, which splits the number itself, leaves it out."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shadowsync.bench.deepfm import load_rows
from shadowsync.data import tabular

SCHEMA = """label = "click"
dense = ["x", "y"]

[[categorical]]
name = "user"
table_size = 5

[[categorical]]
name = "x_quantile"
bucketize = "x"
edges = [0.0, 1.0]
table_size = 3
"""


@pytest.fixture(autouse=True)
def _private_cache(private_cache_root):
    pass


def test_lightgbm_reads_numbers_and_ids_but_not_buckets_of_the_numbers(tmp_path):
    pytest.importorskip("scipy")
    from shadowsync.bench.gbdt import features_of

    (tmp_path / "s.toml").write_text(SCHEMA)
    pq.write_table(pa.table({"click": [0, 1, 1, 0], "x": [-0.5, 0.5, 1.5, 0.0],
                             "y": [1.0, 2.0, 3.0, 4.0], "user": [4, 3, 2, 1]}),
                   tmp_path / "d.parquet")
    rows = load_rows(str(tabular.convert(str(tmp_path / "d.parquet"), str(tmp_path / "s.toml"))))
    assert rows.bucketized == (1,) and rows.cats[:, 1].tolist() == [0, 1, 2, 1]
    assert rows.take(np.array([2, 0])).bucketized == (1,)
    matrix = features_of(rows)
    assert matrix.tolist() == [[-0.5, 1.0, 4.0], [0.5, 2.0, 3.0], [1.5, 3.0, 2.0],
                               [0.0, 4.0, 1.0]]
