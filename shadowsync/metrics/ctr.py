"""CTR metrics: normalized entropy (NE), log loss, AUC, calibration.

NE (He et al., "Practical Lessons from Predicting Clicks on Ads at Facebook", 2014) is the
mean log loss divided by the entropy of the mean click rate, so a model that always predicts
the average CTR scores exactly 1.0 and lower is better. Predictions are clamped to
[eps, 1 - eps] before the logarithm, as TorchRec's NE metric does, so a confident mistake
costs a large but finite loss.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

EPS = 1e-12


def binary_entropy(p: float) -> float:
    """Entropy (nats) of a Bernoulli(p); 0 at p in {0, 1}."""
    if p <= 0.0 or p >= 1.0:
        return 0.0
    return -(p * math.log(p) + (1.0 - p) * math.log(1.0 - p))


def log_loss(pred: np.ndarray, labels: np.ndarray) -> float:
    """Mean binary cross-entropy (nats) of clamped predictions."""
    p = np.clip(np.asarray(pred, dtype=np.float64), EPS, 1.0 - EPS)
    y = np.asarray(labels, dtype=np.float64)
    return float(-np.mean(y * np.log(p) + (1.0 - y) * np.log1p(-p)))


def normalized_entropy(pred: np.ndarray, labels: np.ndarray) -> float:
    """Log loss over the entropy of the mean label; NaN when every label is the same."""
    h = binary_entropy(float(np.mean(labels)))
    return log_loss(pred, labels) / h if h > 0 else float("nan")


def worse_than_constant(ne: object, what: str) -> str | None:
    """The warning for an NE above 1 (`what`: whose), else None. NE 1 is what the constant
    prediction of the mean label scores: above it the model's predictions cost more log loss
    than knowing the click rate alone."""
    if not isinstance(ne, float) or not ne > 1:
        return None
    return (f"{what} NE {ne:.4f} is above 1: worse than predicting the mean click rate for "
            "every row (too few examples or passes, a learning rate too high, or eval data "
            "unlike the training data)")


def calibration(pred: np.ndarray, labels: np.ndarray) -> float:
    """Mean prediction over mean label: 1.0 is perfectly calibrated."""
    mean_label = float(np.mean(labels))
    return float(np.mean(pred)) / mean_label if mean_label > 0 else float("nan")


def roc_auc() -> Callable[..., float]:
    """scikit-learn's `roc_auc_score`, imported on first use: with scipy, 2 s of imports
    (`CtrTask.prepare_evaluation` calls this early where a process has time to spare)."""
    from sklearn.metrics import roc_auc_score

    return roc_auc_score


def evaluate_predictions(pred: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """NE, log loss, AUC and calibration of click probabilities against 0/1 labels; every
    metric NaN when a prediction is not finite (a diverged model is the divergence check's to
    report, not a metric's)."""
    roc_auc_score = roc_auc()
    labels = np.asarray(labels)
    if not np.all(np.isfinite(pred)):
        nan = float("nan")
        return {"ne": nan, "logloss": nan, "auc": nan, "calibration": nan,
                "examples": int(len(labels))}
    auc = float(roc_auc_score(labels, pred)) if 0 < labels.sum() < len(labels) else float("nan")
    return {
        "ne": normalized_entropy(pred, labels),
        "logloss": log_loss(pred, labels),
        "auc": auc,
        "calibration": calibration(pred, labels),
        "examples": int(len(labels)),
    }


@dataclass
class _Chunk:
    examples: int
    loss_sum: float
    label_sum: float


class RunningNE:
    """NE over a sliding window of the most recent training examples.

    Workers report (examples, sum of log loss, sum of labels) per chunk; the window keeps the
    newest chunks whose examples add up to at least `window` so the value tracks the model as
    it is now rather than its average over the whole run.
    """

    name = "ne"

    def __init__(self, window: int = 100_000) -> None:
        self.window = window
        self._chunks: deque[_Chunk] = deque()
        self._examples = 0
        self._loss = 0.0
        self._labels = 0.0

    def add(self, examples: int, loss_sum: float, label_sum: float) -> None:
        self._chunks.append(_Chunk(examples, loss_sum, label_sum))
        self._examples += examples
        self._loss += loss_sum
        self._labels += label_sum
        while self._chunks and self._examples - self._chunks[0].examples >= self.window:
            old = self._chunks.popleft()
            self._examples -= old.examples
            self._loss -= old.loss_sum
            self._labels -= old.label_sum

    @property
    def value(self) -> float:
        if self._examples == 0:
            return float("nan")
        h = binary_entropy(self._labels / self._examples)
        return (self._loss / self._examples) / h if h > 0 else float("nan")
