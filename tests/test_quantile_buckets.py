"""--buckets (on with --val-share): each dense column of an array directory (or of Parquet and
CSV, which convert into one) also becomes a quantile-bucket feature, its edges from the rows
the model fits on alone, and every reader of the run (eval, `shadowsync.load`, the exported
model's schema) cuts other rows at the same edges. The synthetic default job is unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from shadowsync.config import TrainConfig
from shadowsync.data.buckets import quantile_edges
from shadowsync.errors import UserError
from shadowsync.train.tasks import features_of
from shadowsync.train.tasks.ctr import plan_data, rows_path
from tests.helpers import run_cli, summary


@pytest.fixture(autouse=True)
def _private_cache(private_cache_root):
    pass


def _array_dir(path: Path, dense: np.ndarray, labels: np.ndarray, cats: np.ndarray,
               features: dict | None = None) -> Path:
    path.mkdir(parents=True)
    np.save(path / "labels.npy", labels.astype(np.float32))
    np.save(path / "dense.npy", dense.astype(np.float32))
    np.save(path / "cats.npy", cats.astype(np.int64))
    if features is not None:
        (path / "features.json").write_text(json.dumps(features))
    return path


def _leaky_rows(tmp_path: Path) -> Path:
    """100 rows: the last tenth is eval, and --val-share 0.2 holds out the 18 before it, so
    the model fits on rows 0..71, where x = row and y = 2 x row; the other rows hold numbers
    far past them, which would move the edges if they were read."""
    n = 100
    row = np.arange(n, dtype=np.float64)
    x = np.where(row < 72, row, 1000 + row)
    dense = np.stack([x, 2 * x, np.full(n, 3.0)], 1)  # the third column is constant
    return _array_dir(tmp_path / "rows", dense, row % 2, (row % 5)[:, None])


def _features_json(path: str) -> dict:
    return json.loads((Path(path) / "features.json").read_text())


def test_edges_come_from_the_rows_the_model_fits_on_alone(tmp_path):
    data = _leaky_rows(tmp_path)
    cfg = TrainConfig(data=str(data), val_share=0.2, buckets=4).adapted()
    plan = plan_data(cfg)
    assert (plan.val_start, plan.val_stop, plan.eval_start) == (72, 90, 90)
    added = _features_json(plan.train.source)["categorical"][1:]
    # quantiles of 0..71 at 1/4, 2/4, 3/4: q x 71; y's are twice x's; a constant has none
    assert added == [
        {"name": "I1_quantile", "table_size": 4, "bucketize": "I1",
         "edges": [17.75, 35.5, 53.25]},
        {"name": "I2_quantile", "table_size": 4, "bucketize": "I2", "edges": [35.5, 71.0, 106.5]}]
    assert plan.features.table_rows == (100_000, 4, 4)  # --table-size sizes the user's table
    ids = np.asarray(plan.train.cats)
    x = np.asarray(plan.train.dense)[:, 0]
    assert (ids[:, 1] == np.searchsorted([17.75, 35.5, 53.25], x, side="right")).all()
    assert (ids[72:, 1] == 3).all()  # validation and eval rows: past the last edge
    assert (ids[:, 0] == np.arange(100) % 5).all()  # the user's ids as they were
    assert features_of(cfg) == plan.features  # every process sizes the same tables


def test_eval_data_is_cut_at_the_training_edges(tmp_path):
    data = _leaky_rows(tmp_path)
    held = _array_dir(tmp_path / "held", np.array([[10.0, 20, 3], [50, 100, 3], [60, 0, 3]]),
                      np.array([0, 1, 1]), np.array([[1], [2], [3]]))
    cfg = TrainConfig(data=str(data), eval_data=str(held), val_share=0.2, buckets=4)
    plan = plan_data(cfg.adapted())
    # --eval-data: the model fits on 80 of the 100 rows, x = 0..71 and 1072..1079
    edges = quantile_edges(np.asarray(plan.train.dense)[:80, 0].astype(np.float64), 4)
    assert _features_json(plan.train.source)["categorical"][1]["edges"] == edges
    cut = np.asarray(plan.eval.cats)
    assert cut[:, 1].tolist() == np.searchsorted(edges, [10.0, 50, 60], side="right").tolist()
    assert cut[:, 0].tolist() == [1, 2, 3]


def test_off_per_column_by_option_and_by_features_json(tmp_path):
    data = _leaky_rows(tmp_path)
    cfg = TrainConfig(data=str(data), val_share=0.2, buckets=4, no_buckets="I2")
    names = [c["name"] for c in _features_json(rows_path(cfg.adapted()))["categorical"]]
    assert names == ["C1", "I1_quantile"]
    (data / "features.json").write_text(json.dumps({"no_buckets": ["I1"]}))
    assert rows_path(cfg.adapted()) == str(data)  # I1 and I2 whole: nothing to add
    with pytest.raises(UserError, match="--no-buckets: .* no dense column 'I9'"):
        rows_path(TrainConfig(data=str(data), val_share=0.2, no_buckets=["I9"]).adapted())
    assert rows_path(TrainConfig(data=str(data), val_share=0.2, buckets=0).adapted()) == str(data)


def test_a_schema_keeps_its_own_buckets_and_can_leave_a_column_whole(tmp_path):
    rng = np.random.default_rng(0)
    n = 400
    table = pa.table({"click": rng.integers(0, 2, n), "x": rng.standard_normal(n),
                      "y": rng.standard_normal(n), "z": rng.standard_normal(n),
                      "user": rng.integers(0, 5, n)})
    pq.write_table(table, tmp_path / "rows.parquet")
    (tmp_path / "schema.toml").write_text(
        'label = "click"\ndense = ["x", "y", "z"]\nno_buckets = ["z"]\n\n'
        '[[categorical]]\nname = "user"\ntable_size = 5\n\n'
        '[[categorical]]\nname = "x_bucket"\nbucketize = "x"\nedges = [0.0]\ntable_size = 2\n')
    cfg = TrainConfig(data=str(tmp_path / "rows.parquet"), schema=str(tmp_path / "schema.toml"),
                      val_share=0.1).adapted()
    doc = _features_json(rows_path(cfg))
    assert [c["name"] for c in doc["categorical"]] == ["user", "x_bucket", "y_quantile"]
    fit = (n - n // 10) - round((n - n // 10) * 0.1)
    y = table.column("y").to_numpy()[:fit]
    assert doc["categorical"][2]["edges"] == pytest.approx(
        quantile_edges(y.astype(np.float32).astype(np.float64), 128))
    assert features_of(cfg).table_rows[:2] == (5, 2)
    (tmp_path / "bad.toml").write_text('label = "click"\ndense = ["x"]\nno_buckets = ["q"]\n\n'
                                       '[[categorical]]\nname = "user"\ntable_size = 5\n')
    with pytest.raises(UserError, match="'no_buckets' must be a list of dense columns"):
        rows_path(TrainConfig(data=str(tmp_path / "rows.parquet"),
                              schema=str(tmp_path / "bad.toml"), val_share=0.1))


def test_a_warm_start_keeps_its_models_buckets(tmp_path):
    """The next day's rows are cut at the edges the warm-started model learned its bucket
    rows for, not at edges of their own."""
    data = _leaky_rows(tmp_path)
    step = tmp_path / "run" / "checkpoint" / "step-1"
    step.mkdir(parents=True)
    (step / "config.toml").write_text("")
    (step / "manifest.json").write_text(json.dumps({"format": 1, "sparse_features": [
        {"name": "C1", "multi_hot": False},
        {"name": "I1_quantile", "multi_hot": False, "bucketize": "I1", "edges": [0.5, 70.0]}]}))
    cfg = TrainConfig(data=str(data), val_share=0.2, warm_start=str(tmp_path / "run"))
    added = _features_json(rows_path(cfg.adapted()))["categorical"][1:]
    assert added == [{"name": "I1_quantile", "table_size": 3, "bucketize": "I1",
                      "edges": [0.5, 70.0]}]


def test_the_synthetic_default_job_is_unchanged():
    default = TrainConfig()
    assert default.data.quantile_buckets() == 0
    assert rows_path(default.adapted()) == "synthetic"
    assert features_of(default.adapted()).table_rows == (100_000,) * 26
    validated = TrainConfig(val_share=0.1).adapted()  # generated rows are never cut
    assert validated.data.quantile_buckets() == 128
    assert features_of(validated).table_rows == (100_000,) * 26
    with pytest.raises(UserError, match="--buckets must be 0"):
        TrainConfig(buckets=1)


def _bump_rows(path: Path, n: int, seed: int) -> Path:
    """Clicks likely only for x in [0.3, 1.2): a bump no weight on x alone can draw."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n)
    p = np.where((x >= 0.3) & (x < 1.2), 0.85, 0.15)
    return _array_dir(path, x[:, None], (rng.random(n) < p).astype(np.float32),
                      rng.integers(0, 20, n)[:, None],
                      {"dense": ["x"], "categorical": [{"name": "user", "table_size": 20}]})


@pytest.mark.timeout(240)
def test_train_eval_load_and_export_cut_at_the_same_edges(tmp_path):
    import shadowsync
    from shadowsync.evaluation import evaluate_checkpoint

    data, held = _bump_rows(tmp_path / "data", 6000, 0), _bump_rows(tmp_path / "held", 1500, 1)
    out = tmp_path / "run"
    res = run_cli(["train", "--data", str(data), "--val-share", "0.1", "--epochs", "2",
                   "--trainers", "1", "--embedding-servers", "0", "--sync", "none",
                   "--eval-points", "1", "--no-progress", "-q", "--out", str(out)], timeout=200)
    assert res.returncode == 0, res.stderr[-3000:]
    assert summary(out)["eval_auc"] > 0.75  # the bump, learned through its buckets

    model = shadowsync.load(out)
    bucket = model.features[1]
    fit = 5400 - 540  # the rows before the eval tenth, less the validation tenth of those
    x = np.load(data / "dense.npy")[:, 0].astype(np.float64)
    assert (bucket.name, bucket.bucketize) == ("x_quantile", "x")
    assert list(bucket.edges) == quantile_edges(x[:fit], 128)

    pred_file = tmp_path / "pred.npy"
    result = evaluate_checkpoint(str(out), str(held), str(pred_file))
    assert result["auc"] > 0.75 and result["examples"] == 1500
    predictions = np.load(pred_file)
    dense, cats = np.load(held / "dense.npy"), np.load(held / "cats.npy")
    mine = model.predict(dense, cats).numpy()  # the bucket column cut from dense
    assert np.abs(mine - predictions).max() <= 1e-6

    program = tmp_path / "model.pt2"
    shadowsync.export(out, program)
    schema = json.loads(Path(str(program) + ".schema.json").read_text())
    entry = schema["features"][1]
    assert (entry["bucketize"], entry["edges"]) == ("x", list(bucket.edges))
    ids = np.stack([cats[:, 0], np.searchsorted(entry["edges"], dense[:, 0], side="right")], 1)
    logits = torch.export.load(str(program)).module()(torch.from_numpy(dense),
                                                      torch.from_numpy(ids))
    assert np.abs(torch.sigmoid(logits).detach().numpy() - predictions).max() <= 1e-6
