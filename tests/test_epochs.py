"""Epochs, the validation tail, the best checkpoint and early stopping; embedding weight
decay."""

import json
import re

import numpy as np
import pytest
import torch

from shadowsync.checkpoint.store import find_checkpoint
from shadowsync.config import TrainConfig
from shadowsync.data.dataset import CtrData, EpochOrder, batches
from shadowsync.embeddings import EmbeddingTables
from shadowsync.errors import UserError
from shadowsync.train.selection import ModelSelection, gate_step, validation_points
from tests.conftest import save_array_dir, write_array_dir
from tests.helpers import run_cli, summary


def test_each_pass_reads_every_row_once_in_its_own_order():
    order = EpochOrder(10, seed=3)
    rows = order.rows_of(0, 30)
    passes = rows.reshape(3, 10)
    for p in passes:
        assert sorted(p) == list(range(10))
    assert not (passes[0] == passes[1]).all()
    again = EpochOrder(10, seed=3)
    assert (again.rows_of(7, 23) == rows[7:23]).all()  # any process, any span: same rows
    assert not (EpochOrder(10, seed=4).rows_of(0, 10) == passes[0]).all()


def test_sharded_batches_over_three_epochs_read_each_row_three_times():
    n = 37
    data = CtrData(np.arange(n, dtype=np.float32) % 2, np.arange(n, dtype=np.float32)[:, None],
                   np.zeros((n, 1), dtype=np.int64), source="t")
    order = EpochOrder(n, seed=0)
    seen = []
    for shard in range(2):
        for dense, _, _ in batches(data, 0, 3 * n, 4, shard=shard, num_shards=2, table_size=5,
                                   order=order):
            seen += dense[:, 0].int().tolist()
    assert sorted(seen) == sorted(list(range(n)) * 3)


def test_model_selection_keeps_the_best_and_stops_after_patience():
    sel = ModelSelection(higher_is_better=False, patience=2)
    assert sel.observe(0.9, epoch=1)
    assert sel.observe(0.8, epoch=2)
    assert not sel.observe(0.8, epoch=3)  # a tie keeps the earlier model
    assert not sel.should_stop
    assert not sel.observe(float("nan"), epoch=4)
    assert sel.should_stop and sel.best == 0.8 and sel.best_at == {"epoch": 2}
    auc = ModelSelection(higher_is_better=True)
    assert auc.observe(0.7) and not auc.observe(0.6) and auc.observe(0.71)
    assert not auc.should_stop  # no patience: never


def test_validation_points_end_each_epoch():
    assert validation_points(100, 2, 4) == [25, 50, 75, 100, 125, 150, 175, 200]
    assert validation_points(10, 3, 0) == [10, 20, 30]


def test_a_point_gates_the_first_step_at_which_the_workers_have_read_it():
    # ceil(point / (workers x batch)): 2 workers of 16 read 32 rows a step together
    assert [gate_step(v, 2, 16) for v in (1, 32, 33, 64, 65)] == [1, 1, 2, 2, 3]
    assert gate_step(100, 1, 100) == 1 and gate_step(101, 1, 100) == 2


@pytest.mark.parametrize("options, message", [
    ({"epochs": 0}, "--epochs must be positive"),
    ({"val_share": 1.0}, "--val-share must be in [0, 1)"),
    ({"early_stop": 3}, "--early-stop needs --val-share"),
    ({"early_stop": 3, "val_share": 0.1, "sync": "bsp"}, "--early-stop: --sync bsp"),
    ({"val_share": 0.1, "checkpoint_every": "never"}, "not with --checkpoint-every never"),
    ({"embedding_weight_decay": -1.0}, "--embedding-weight-decay must be"),
])
def test_bad_options_name_the_option(options, message):
    with pytest.raises(UserError, match=message.replace("[", r"\[").replace(")", r"\)")):
        TrainConfig(**options)


def test_examples_past_the_data_is_an_error_that_says_epochs(tmp_path):
    from shadowsync.train.tasks import plan_data

    data = write_array_dir(tmp_path / "a", rows=1000)
    with pytest.raises(UserError, match="holds 900 training rows; .* use --epochs"):
        plan_data(TrainConfig(data=str(data), examples=5000, table_size=[50]))
    plan = plan_data(TrainConfig(data=str(data), epochs=3, val_share=0.1, table_size=[50]))
    # 900 training rows: the last 90 validate, 810 a pass, 3 passes
    assert (plan.val_start, plan.val_stop, plan.epoch_rows, plan.train_stop) == \
        (810, 900, 810, 2430)


def test_weight_decay_is_l2_on_the_rows_read_inside_row_wise_adagrad():
    wd, lr, acc0 = 0.1, 0.5, 0.2
    t = EmbeddingTables([4], 3, lr=lr, initial_accumulator=acc0, weight_decay=wd)
    w0 = t.weight.clone()
    g = torch.tensor([[1.0, 0.0, -1.0], [0.5, 0.5, 0.5]])
    t.apply_rows(torch.tensor([2, 2]), g)  # id 2 twice: one step on the summed gradient
    total = g.sum(0) + wd * w0[2]
    acc = acc0 + total.pow(2).mean()
    assert torch.allclose(t.weight[2], w0[2] - lr * total / (acc.sqrt() + 1e-8))
    assert torch.equal(t.weight[[0, 1, 3]], w0[[0, 1, 3]])  # rows not read: left alone
    assert torch.allclose(t.state[2], acc)


def test_finder_prefers_best_but_resume_takes_the_newest(tmp_path):
    for name in ("step-10", "step-20", "best"):
        d = tmp_path / "checkpoint" / name
        d.mkdir(parents=True)
        (d / "manifest.json").write_text(json.dumps({"format": 1}))
        (d / "config.toml").write_text("")
    assert find_checkpoint(tmp_path).name == "best"
    assert find_checkpoint(tmp_path / "checkpoint").name == "best"
    assert find_checkpoint(tmp_path, "--resume").name == "step-20"
    assert find_checkpoint(tmp_path / "checkpoint" / "step-10").name == "step-10"


LOCAL = ["--trainers", "1", "--embedding-servers", "0", "--sync", "none", "--no-progress",
         "--table-size", "50"]


@pytest.mark.timeout(240)
def test_epochs_keep_the_best_model_and_eval_uses_it(tmp_path):
    data = write_array_dir(tmp_path / "a", rows=6000)
    out = tmp_path / "run"
    res = run_cli(["train", *LOCAL, "--data", str(data), "--epochs", "3", "--val-share", "0.2",
                   "--eval-points", "2", "--batch-size", "64", "--out", str(out)], timeout=200)
    assert res.returncode == 0, res.stderr[-3000:]
    s = summary(out)
    assert s["epochs"] == 3 and s["examples"] == 3 * 4320  # 5400 training rows, 20% validate
    assert s["validations"] == 6  # 2 points an epoch: each worker waits at every one
    best = s["best"]
    assert 0 < best["epoch"] <= 3.0 and best["checkpoint"].endswith("checkpoint/best")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    # the best of the models validated and of any average of their epoch ends
    scored = [r[k] for r in rows for k in ("val_ne", "average_val_ne") if k in r]
    assert min(scored) == pytest.approx(best["val_ne"])
    assert s["eval_auc"] > 0.7  # the best model's, on the held-out rows
    assert re.search(r"best model: (the average of \d+ epoch ends to )?epoch ", res.stdout)
    ev = run_cli(["eval", "--checkpoint", str(out), "--data", str(data)], timeout=100)
    assert ev.returncode == 0, ev.stderr[-2000:]
    assert "checkpoint/best" in ev.stdout


def write_memorisable_arrays(path, rows: int = 12_000, ids: int = 3000):
    """Arrays whose clicks follow the dense features only, with ids drawn from 3,000 a table:
    each id is seen a few times, so a model that fits its rows learns ids that tell nothing."""
    rng = np.random.default_rng(0)
    dense = rng.standard_normal((rows, 5)).astype(np.float32)
    cats = rng.integers(0, ids, (rows, 3)).astype(np.int32)
    logit = dense @ rng.standard_normal(5) * 0.5
    labels = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    return save_array_dir(path, labels, dense, cats)


@pytest.fixture(scope="module")
def overfitting_job(tmp_path_factory):
    """The default job with --val-share 0.2 over 12,000 rows whose ids carry no signal, with
    tables holding every id and a high embedding rate: the rows' ids are memorised, validation
    gets worse after the first points (the final average of the trainers too, for the
    embeddings are the servers' one copy), and --early-stop 2 ends it (2 points an epoch: one
    epoch without a better model) long before its 200 epochs. test_early_stop_... and
    test_the_best_model_kept_... check it. Returns the data and the run's folder."""
    tmp = tmp_path_factory.mktemp("overfitting")
    data = write_memorisable_arrays(tmp / "a")
    out = tmp / "run"
    res = run_cli(["train", "--data", str(data), "--table-size", "3000", "--no-progress",
                   "--val-share", "0.2", "--embedding-lr", "2", "--lr", "0.05",
                   "--epochs", "200", "--eval-points", "2", "--early-stop", "2",
                   "--batch-size", "32", "--out", str(out)], timeout=260)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.leftover == []
    return data, out


@pytest.mark.timeout(300)
def test_early_stop_ends_the_default_job_and_reports_the_best(overfitting_job):
    _, out = overfitting_job
    s = summary(out)
    assert s["early_stopped"] is True
    assert s["examples"] < 200 * 8640 // 4  # stopped long before the 200 epochs
    assert (out / "checkpoint" / "best" / "manifest.json").is_file()
    assert not list(out.glob("**/.tmp-*"))


@pytest.fixture(scope="module")
def default_job_over_epochs(tmp_path_factory):
    """The default job (2 trainers, s-bmuf) for 4 epochs of 40,000 rows with --val-share 0.2,
    one validation an epoch and no early stop: test_the_default_jobs_final_validation_... and
    test_the_default_jobs_first_validations_... check it. Returns the data and the run's
    folder."""
    tmp = tmp_path_factory.mktemp("default-epochs")
    data = write_array_dir(tmp / "a", rows=40_000)
    out = tmp / "run"
    res = run_cli(["train", "--data", str(data), "--table-size", "50", "--no-progress",
                   "--epochs", "4", "--val-share", "0.2", "--eval-points", "1",
                   "--early-stop", "0", "--batch-size", "64", "--out", str(out)], timeout=260)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.leftover == []
    return data, out


@pytest.mark.timeout(300)
def test_the_default_jobs_final_validation_scores_the_model_it_ends_with(
        default_job_over_epochs):
    """With several trainers the run ends with a last synchronization round (s-bmuf: the
    average of the replicas); the final validation scores that model, not trainer 0's replica
    from before it."""
    from shadowsync.inference import load
    from shadowsync.metrics import evaluate_predictions

    data, out = default_job_over_epochs
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    last_val = [r for r in rows if "val_ne" in r][-1]
    model = load(find_checkpoint(out, latest=True))  # the final step, not the best
    dense, cats = np.load(data / "dense.npy"), np.load(data / "cats.npy")
    labels = np.load(data / "labels.npy")
    val = slice(28_800, 36_000)  # the last 20% of the 36,000 training rows (4,000 held out)
    pred = model.predict(dense[val], cats[val]).numpy()
    assert last_val["val_ne"] == pytest.approx(evaluate_predictions(pred, labels[val])["ne"],
                                               rel=1e-4)


@pytest.mark.timeout(300)
def test_the_best_model_kept_is_the_model_validated(overfitting_job):
    """Every worker of the job is parked at the validation point's step, its embedding pushes
    answered, and no sync round runs, while trainer 0 validates and saves a new best model:
    the best checkpoint holds every worker of both trainers at that one step, and scores on
    the validation rows exactly what its validation said (workers training on through the
    save moved it away)."""
    from shadowsync.inference import load
    from shadowsync.metrics import evaluate_predictions

    data, out = overfitting_job  # the best model comes early, while the workers still train
    s = summary(out)
    best = s["best"]
    assert best["examples"] < s["examples"]  # kept while the workers trained on
    manifest = json.loads((out / "checkpoint" / "best" / "manifest.json").read_text())
    parked = manifest["best"]["parked_steps"]
    assert sorted(parked) == ["trainer0", "trainer1"]
    # 8,640 rows an epoch, 4,320 a trainer; 2 points an epoch: a gate every 67.5 steps of 32
    gate = parked["trainer0"][0]
    assert parked == {"trainer0": [gate], "trainer1": [gate]}
    assert gate == -(-best["examples"] // 2 // 32)
    assert manifest["positions"] == parked  # every push answered: no step counted short
    dense, cats = np.load(data / "dense.npy"), np.load(data / "cats.npy")
    labels = np.load(data / "labels.npy")
    val = slice(8640, 10_800)  # the last 20% of the 10,800 training rows
    pred = load(find_checkpoint(out)).predict(dense[val], cats[val]).numpy()
    assert evaluate_predictions(pred, labels[val])["ne"] == pytest.approx(best["val_ne"],
                                                                          rel=1e-5)


@pytest.mark.timeout(300)
def test_a_small_data_sets_job_validates_every_point(tmp_path):
    """The default job trains 400 rows an epoch in a few milliseconds, far faster than trainer
    0 looks at its progress: every worker waits at each validation point until it is
    validated, or most points passed unvalidated."""
    epochs, points = 10, 2
    data = write_array_dir(tmp_path / "a", rows=600)
    out = tmp_path / "run"
    res = run_cli(["train", "--data", str(data), "--table-size", "50", "--no-progress",
                   "--epochs", str(epochs), "--val-share", "0.2", "--eval-points", str(points),
                   "--early-stop", "0", "--batch-size", "16", "--out", str(out)], timeout=260)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.leftover == []
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    validated = [r["epoch"] for r in rows if "val_ne" in r]
    # every point, at its place to within a step of each trainer (16 of 216 rows an epoch),
    # then the final validation of the model the job ends with
    assert len(validated) == epochs * points + 1, validated
    for k, epoch in enumerate(validated[:-1], start=1):
        assert epoch == pytest.approx(k / points, abs=2 * 16 / 216), validated


@pytest.mark.timeout(300)
def test_the_default_jobs_first_validations_come_at_their_points(default_job_over_epochs):
    """Trainer 0 of a cluster job validates while its workers train on: what its first
    evaluation needs is imported before training (2-4 s of scikit-learn), or the workers
    train past the points due meanwhile (MovieLens: epochs 0.5 to about 1.9) and those are
    never validated."""
    _, out = default_job_over_epochs
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    validated = [r["epoch"] for r in rows if "val_ne" in r]
    # each of the first two points before the workers reach the next one (the old first
    # validation, importing as it went, let the second one pass: epochs 1.07, 3.25, 4.0)
    assert 1 <= validated[0] < 2 <= validated[1] < 3, validated
    assert validated == sorted(validated) and validated[-1] == pytest.approx(4)


@pytest.mark.timeout(300)
def test_the_default_job_averages_its_epoch_ends_from_the_third_and_keeps_the_better(
        default_job_over_epochs):
    """--val-share folds the model at the end of epoch 3 and each later one into a running
    average (--weight-average-from 3), scores the average from two snapshots on (epoch 4, the
    last, here) and keeps it as the best model where it validates better: the best checkpoint
    scores what its `best` says, an average or the model trained."""
    from shadowsync.inference import load
    from shadowsync.metrics import evaluate_predictions

    data, out = default_job_over_epochs
    s = summary(out)
    assert s["config"]["weight_average_from"] == 3
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    averaged = [round(r["epoch"]) for r in rows if "average_val_ne" in r]
    assert averaged == [4]
    scored = [r["val_ne"] for r in rows if "val_ne" in r]
    scored += [r["average_val_ne"] for r in rows if "average_val_ne" in r]
    best = s["best"]
    assert best["val_ne"] == pytest.approx(min(scored))  # the better of all, either kind
    assert ("averaged" in best) == (min(scored) not in [r["val_ne"] for r in rows
                                                        if "val_ne" in r])
    dense, cats = np.load(data / "dense.npy"), np.load(data / "cats.npy")
    labels = np.load(data / "labels.npy")
    val = slice(28_800, 36_000)
    pred = load(find_checkpoint(out)).predict(dense[val], cats[val]).numpy()
    assert evaluate_predictions(pred, labels[val])["ne"] == pytest.approx(best["val_ne"],
                                                                          rel=1e-4)
