"""Dynamic tables in real jobs: two trainers and an embedding server on raw Zipf ids over two
"days" whose ids drift; the second day warm-starts from the first (maps kept, new ids
admitted, stale ones evicted); the model read back, and exported, gives the job's own eval."""

import json

import numpy as np
import pytest
import torch

from shadowsync.data.zipf import ZipfConfig, write_days
from shadowsync.metrics import evaluate_predictions
from tests.helpers import run_cli

ROWS = 20_000
JOB = ["--no-progress", "--eval-points", "0", "-q", "--trainers", "2", "--workers", "1",
       "--embedding-servers", "1", "--tables", "dynamic", "--table-size", "1000",
       "--admit-after", "2", "--examples", str(ROWS - ROWS // 10)]


@pytest.fixture(scope="module")
def days(tmp_path_factory):
    root = tmp_path_factory.mktemp("zipf")
    write_days(root, ROWS, days=2, config=ZipfConfig(vocab=10**6, drift=0.5))
    return root


def summary_of(out):
    return json.loads((out / "summary.json").read_text())


@pytest.mark.timeout(300)
def test_two_days_warm_start_keeps_the_maps_and_the_model_reads_back(days, tmp_path):
    import shadowsync
    from shadowsync.inference import export

    day0, day1 = tmp_path / "day0", tmp_path / "day1"
    res = run_cli(["train", *JOB, "--data", str(days / "day0"), "--out", str(day0)], timeout=140)
    assert res.returncode == 0, res.stderr[-2000:]
    first = summary_of(day0)["dynamic_tables"]
    assert 0 < first["live"] <= first["capacity"] == 8000
    assert first["admitted"] == first["live"] + first["evicted"]

    # The read-back model takes raw ids and scores the held-out rows as the job did.
    model = shadowsync.load(day0)
    dense = np.load(days / "day0" / "dense.npy")[-ROWS // 10:]
    cats = np.load(days / "day0" / "cats.npy")[-ROWS // 10:]
    labels = np.load(days / "day0" / "labels.npy")[-ROWS // 10:]
    pred = model.predict(dense, cats).numpy()
    assert evaluate_predictions(pred, labels)["ne"] == pytest.approx(
        summary_of(day0)["eval_ne"], abs=1e-6)
    program = tmp_path / "model.pt2"
    export(day0, program)
    with torch.no_grad():
        exported = torch.sigmoid(torch.export.load(str(program)).module()(
            torch.from_numpy(dense), torch.from_numpy(cats))).numpy()
    assert np.abs(exported - pred).max() < 1e-6
    assert (model.embed(torch.full((1, 8), 12345)) == 0).all()  # unknown ids: the default row

    # Day 2, its ids half new, reached over RPC this time: the maps go on from day 1's.
    res = run_cli(["train", *JOB, "--data", str(days / "day1"), "--warm-start", str(day0),
                   "--embedding-transport", "rpc", "--out", str(day1)], timeout=140)
    assert res.returncode == 0, res.stderr[-2000:]
    second = summary_of(day1)["dynamic_tables"]
    assert second["lookups"] > first["lookups"] and second["clock"] > first["clock"]
    assert second["admitted"] > first["admitted"] and second["evicted"] > first["evicted"]
    assert second["live"] <= second["capacity"]


@pytest.mark.timeout(60)
def test_a_budget_below_one_batch_is_a_one_line_error(days, tmp_path):
    res = run_cli(["train", *JOB, "--table-size", "100", "--data", str(days / "day0"),
                   "--out", str(tmp_path / "r")], timeout=50)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "shadowsync: error: --table-size 100: dynamic tables of 800 rows in all cannot hold "
        "one batch's 2,048 ids (--batch-size x 8 features); raise the budget"]


@pytest.mark.timeout(120)
def test_a_trainer_of_its_own_with_raw_multi_hot_ids_reads_back(tmp_path):
    """The tables in the trainer's shared memory (no servers), a multi-hot feature of raw
    ids ("ids": "raw"), pooled by mean; the model read back scores as the job did."""
    import shadowsync

    rng = np.random.default_rng(0)
    n, data = 6000, tmp_path / "data"
    data.mkdir()
    cats = rng.integers(0, 2**62, (n, 2)) // rng.zipf(1.5, (n, 2))
    offsets = np.concatenate([[0], np.cumsum(rng.integers(0, 4, n))])
    values = 10**15 + rng.zipf(1.3, offsets[-1]) % 10**6
    dense = rng.standard_normal((n, 2)).astype(np.float32)
    labels = (rng.random(n) < 1 / (1 + np.exp(-dense[:, 0] - (cats[:, 0] % 3 == 0)))).astype(
        np.float32)
    for name, arr in {"cats": cats, "dense": dense, "labels": labels, "tags.values": values,
                      "tags.offsets": offsets}.items():
        np.save(data / f"{name}.npy", arr)
    (data / "features.json").write_text(json.dumps({"multi_hot": [
        {"name": "tags", "table_size": 500, "pooling": "mean", "ids": "raw"}]}))
    out = tmp_path / "run"
    res = run_cli(["train", "--data", str(data), "--trainers", "1", "--embedding-servers", "0",
                   "--sync", "none", "--workers", "2", "--tables", "dynamic", "--table-size",
                   "500", "--batch-size", "64", "--no-progress", "--eval-points", "0", "-q",
                   "--out", str(out)], timeout=100)
    assert res.returncode == 0, res.stderr[-2000:]
    summary = summary_of(out)
    assert summary["dynamic_tables"]["live"] <= 1500
    model = shadowsync.load(out)
    tail = slice(n - n // 10, n)
    first = int(offsets[tail.start])
    pred = model.predict(dense[tail], cats[tail], multi_hot={"tags": (
        values[first:], offsets[tail.start:] - first)}).numpy()
    assert evaluate_predictions(pred, labels[tail])["ne"] == pytest.approx(
        summary["eval_ne"], abs=1e-6)
