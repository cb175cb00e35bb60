"""The digits task: real images, a small CNN, accuracy, through the same spine as CTR."""

import sys

import numpy as np
import pytest
import torch

from shadowsync.config import TrainConfig
from shadowsync.train.tasks import task_of
from tests.helpers import run_cli, summary


def test_digits_rows_are_reproducible_and_hold_out_unseen_images():
    task = task_of("digits")
    cfg = TrainConfig(task="digits", examples=4000, seed=3)
    plan = task.plan_data(cfg)
    again = task.open_data("digits", plan.open_examples, 3, False)
    assert np.array_equal(plan.train.dense, again.dense)
    assert plan.train_stop == 4000 and plan.eval_stop - plan.eval_start == 300
    train = {r.tobytes() for r in plan.train.dense[:4000]}
    held = [r.tobytes() for r in plan.eval.dense[4000:]]
    assert sum(h in train for h in held) <= 5  # a few digits are pixel-identical twins
    assert plan.train.cats.shape == (len(plan.train), 0)
    logits = task.build_model(cfg, plan.features)(torch.from_numpy(plan.train.dense[:5]), None)
    assert logits.shape == (5, 10)


def test_digits_images_are_read_through_the_cache(private_cache_root, monkeypatch):
    """The first open converts scikit-learn's digits; every later one (each process of a
    run) reads the .npy cache without importing scikit-learn."""
    from sklearn.datasets import load_digits

    from shadowsync.train.tasks.digits import digits_arrays

    images, labels = load_digits(return_X_y=True)
    first = digits_arrays()
    monkeypatch.setitem(sys.modules, "sklearn", None)  # importing it now fails
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    again = digits_arrays()
    for got in (first, again):
        assert np.array_equal(got[0], images) and np.array_equal(got[1], labels)


@pytest.mark.timeout(120)
def test_digits_trains_to_high_accuracy_on_one_trainer(tmp_path):
    out = tmp_path / "run"
    res = run_cli(["train", "--task", "digits", "--trainers", "1", "--embedding-servers", "0",
                   "--sync", "none", "--batch-size", "32", "--optimizer", "sgd", "--lr", "0.05",
                   "--examples", "20000", "--no-progress", "--eval-points", "2",
                   "--out", str(out)], timeout=100)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.leftover == []
    s = summary(out)
    assert s["task"] == "digits" and s["eval_examples"] == 300
    assert s["eval_accuracy"] > 0.9  # 10 classes: chance is 0.1
    assert s["train_loss"] < 0.5
