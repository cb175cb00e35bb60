"""NE, log loss and calibration against hand-computed values."""

import math

import numpy as np
import pytest

from shadowsync.metrics import (
    RunningNE,
    binary_entropy,
    calibration,
    evaluate_predictions,
    log_loss,
    normalized_entropy,
    worse_than_constant,
)


def test_ne_matches_hand_computation():
    # log loss = -(ln .5 + ln .9 + ln .8 + ln .7) / 4 = 0.344581548; CTR 0.25 has entropy
    # -(.25 ln .25 + .75 ln .75) = 0.562335145; NE = 0.612769006.
    pred = np.array([0.5, 0.1, 0.2, 0.3])
    labels = np.array([1, 0, 0, 0])
    assert log_loss(pred, labels) == pytest.approx(0.344581548, abs=1e-9)
    assert binary_entropy(0.25) == pytest.approx(0.562335145, abs=1e-9)
    assert normalized_entropy(pred, labels) == pytest.approx(0.612769006, abs=1e-9)


def test_predicting_the_mean_ctr_scores_exactly_one():
    labels = np.array([1, 0, 0, 1, 0, 0, 0, 0])
    assert normalized_entropy(np.full(8, labels.mean()), labels) == pytest.approx(1.0)


def test_an_ne_above_one_is_worse_than_the_constant_rate_and_says_so():
    labels = np.array([1.0, 0.0, 0.0, 0.0])
    ne = normalized_entropy(np.array([0.1, 0.9, 0.9, 0.9]), labels)  # backwards
    assert ne > 1 and "above 1: worse than predicting the mean click rate" in \
        worse_than_constant(ne, "eval")
    assert worse_than_constant(normalized_entropy(np.full(4, 0.25), labels), "eval") is None
    assert worse_than_constant(None, "eval") is None


def test_predictions_are_clamped_so_a_confident_mistake_is_finite():
    value = log_loss(np.array([0.0, 1.0]), np.array([1, 0]))
    assert math.isfinite(value) and value == pytest.approx(-math.log(1e-12), rel=1e-6)


def test_calibration_and_auc():
    pred = np.array([0.9, 0.2, 0.6, 0.1])
    labels = np.array([1, 0, 1, 0])
    m = evaluate_predictions(pred, labels)
    assert m["auc"] == 1.0
    assert calibration(pred, labels) == pytest.approx(0.45 / 0.5)
    assert m["ne"] == pytest.approx(0.340724969, abs=1e-9)


def test_running_ne_forgets_old_chunks():
    r = RunningNE(window=100)
    r.add(100, loss_sum=100 * 5.0, label_sum=50)  # a terrible start
    for _ in range(3):
        r.add(50, loss_sum=50 * math.log(2), label_sum=25)
    # only the last two chunks (100 examples) remain: loss ln 2 at CTR 0.5 is NE 1
    assert r.value == pytest.approx(1.0)


def test_tensorboard_scalars_come_from_the_metrics_rows(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from shadowsync.train.report import MetricsLog

    log = MetricsLog(tmp_path / "metrics.jsonl", tensorboard=True)
    log.write({"trainer": 0, "examples": 100, "train_ne": 0.9, "eval_ne": None})
    log.write({"trainer": 0, "examples": 200, "train_ne": 0.8, "eval_ne": 0.85})
    log.close()
    board = EventAccumulator(str(tmp_path / "tensorboard"))
    board.Reload()
    assert sorted(board.Tags()["scalars"]) == ["eval_ne", "train_ne"]
    assert [(e.step, round(e.value, 3)) for e in board.Scalars("train_ne")] == [(100, 0.9),
                                                                             (200, 0.8)]
    assert [e.step for e in board.Scalars("eval_ne")] == [200]


def test_ne_plot_is_drawn_once_a_curve_has_two_points(tmp_path):
    from shadowsync.train.report import plot_ne

    one = [{"examples": 1000, "train_ne": 0.9, "eval_ne": 0.95}]
    assert plot_ne(tmp_path, one, 0.8) is None and not (tmp_path / "ne.png").exists()
    two = [*one, {"examples": 2000, "train_ne": 0.85, "eval_ne": None}]
    assert plot_ne(tmp_path, two, 0.8) == tmp_path / "ne.png"
    assert (tmp_path / "ne.png").stat().st_size > 10_000


def test_metrics_of_a_diverged_model_are_nan_not_an_error():
    pred = np.array([0.2, np.nan, 0.7, 0.4])
    labels = np.array([0, 1, 1, 0])
    m = evaluate_predictions(pred, labels)
    assert all(np.isnan(m[k]) for k in ("ne", "logloss", "auc", "calibration"))
    assert m["examples"] == 4
