"""A number cut into buckets by the schema (`bucketize` + `edges`, as `data prepare` writes
them) goes through training, `shadowsync eval`, `shadowsync.load` and `shadowsync.export`
with its rule: the loaded model and the exported schema carry the edges, and ids cut from
them by hand score as eval scored the files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers import run_cli, summary

EDGES = [-1.0, -0.3, 0.3, 1.2, 2.0]
SCHEMA = f"""label = "click"
dense = ["x"]

[[categorical]]
name = "user"
table_size = 20

[[categorical]]
name = "x_bucket"
bucketize = "x"
edges = {json.dumps(EDGES)}
table_size = {len(EDGES) + 1}
"""


def _rows(path: Path, n: int, seed: int) -> Path:
    """Clicks likely only for x in [0.3, 1.2): a bump no weight on x alone can draw."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n)
    user = rng.integers(0, 20, n)
    p = np.where((x >= 0.3) & (x < 1.2), 0.85, 0.15)
    pq.write_table(pa.table({"click": (rng.random(n) < p).astype(np.int64), "x": x,
                             "user": user}), path)
    return path


@pytest.fixture(autouse=True)
def _private_cache(private_cache_root):
    pass


@pytest.mark.timeout(200)
def test_bucket_edges_travel_through_eval_load_and_export(tmp_path):
    import shadowsync
    from shadowsync.evaluation import evaluate_checkpoint

    schema = tmp_path / "schema.toml"
    schema.write_text(SCHEMA)
    train, held = _rows(tmp_path / "train.parquet", 6000, 0), _rows(tmp_path / "held.parquet",
                                                                     1500, 1)
    out = tmp_path / "run"
    res = run_cli(["train", "--data", str(train), "--schema", str(schema), "--trainers", "1",
                   "--embedding-servers", "0", "--sync", "none", "--epochs", "3",
                   "--batch-size", "128", "--eval-points", "0", "--no-progress", "-q",
                   "--out", str(out)], timeout=150)
    assert res.returncode == 0, res.stderr[-3000:]
    assert summary(out)["eval_auc"] > 0.75  # the bump, learned through its buckets

    pred_file = tmp_path / "pred.npy"
    result = evaluate_checkpoint(str(out), str(held), str(pred_file))
    predictions = np.load(pred_file)
    assert result["auc"] > 0.75

    model = shadowsync.load(out)
    bucket = model.features[1]
    assert (bucket.name, bucket.bucketize, list(bucket.edges)) == ("x_bucket", "x", EDGES)
    rows = pq.read_table(held)
    x = rows.column("x").to_numpy()
    ids = np.stack([rows.column("user").to_numpy(),
                    np.searchsorted(bucket.edges, x, side="right")], 1)
    mine = model.predict(x[:, None].astype(np.float32), ids, batch_size=500).numpy()
    assert np.abs(mine - predictions).max() <= 1e-6

    program = tmp_path / "model.pt2"
    shadowsync.export(out, program)
    exported = json.loads(Path(str(program) + ".schema.json").read_text())
    assert exported["features"][1] == {"name": "x_bucket", "rows": len(EDGES) + 1,
                                       "bucketize": "x", "edges": EDGES}
    assert exported["features"][0] == {"name": "user", "rows": 20}
