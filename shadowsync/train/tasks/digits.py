"""The `digits` task: scikit-learn's bundled 8x8 handwritten digits (1,797 real images, no
download), a small CNN, accuracy. The image-classification side of Sync-Switch (Li et al.,
ICDCS 2021, arXiv 2104.08364), small enough for CPU runs of seconds.

A fixed 300 images (chosen by --seed) are held out for evaluation; the rest are repeated in a
fresh random order every pass until `--examples` training examples have been laid out, so a
run of E examples is E / 1,497 epochs and every process lays out the same rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from shadowsync.data.cache import built_once, cache_root
from shadowsync.models.digits_cnn import SIDE, DigitsCNN
from shadowsync.train.tasks.base import DataPlan, Features, TaskInputs

if TYPE_CHECKING:
    from shadowsync.embeddings import EmbeddingClient

EVAL_IMAGES = 300
DEFAULT_EXAMPLES = 60_000  # about 40 passes over the training images
CACHE_VERSION = 1


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits (images [1797, 64], labels [1797]) through a cache of ``.npy``
    files: importing scikit-learn costs about a CPU-second, and every process of a run (the
    launcher, each trainer and each worker) opens the data."""

    def build(tmp: Path) -> None:
        from sklearn.datasets import load_digits

        images, labels = load_digits(return_X_y=True)
        np.save(tmp / "images.npy", images)
        np.save(tmp / "labels.npy", labels)

    cache = built_once(cache_root() / f"digits-v{CACHE_VERSION}", "labels.npy", build)
    return np.load(cache / "images.npy"), np.load(cache / "labels.npy")


class DigitsData:
    """Rows in the layout `batches` reads: dense pixels [n, 64], no categorical ids, labels."""

    skipped_lines = 0
    teacher_ne_hint = None
    num_dense = SIDE * SIDE
    num_tables = 0
    multi_hot = ()  # images have no categorical features

    def __init__(self, examples: int, seed: int) -> None:
        images, labels = digits_arrays()
        rng = np.random.default_rng(seed)
        order = rng.permutation(len(labels))
        held, train = order[:EVAL_IMAGES], order[EVAL_IMAGES:]
        passes = -(-examples // len(train))
        rows = np.concatenate([rng.permutation(train) for _ in range(passes)])[:examples]
        rows = np.concatenate([rows, held])
        self.dense = (images[rows] / 16.0).astype(np.float32)
        self.cats = np.zeros((len(rows), 0), dtype=np.int64)
        self.labels = labels[rows].astype(np.float32)
        self.train_rows = examples

    def __len__(self) -> int:
        return len(self.labels)


class RunningLoss:
    """Mean cross-entropy over the most recent `window` training examples."""

    name = "loss"

    def __init__(self, window: int = 5_000) -> None:
        self.window = window
        self._chunks: list[tuple[int, float]] = []

    def add(self, examples: int, loss_sum: float, label_sum: float = 0.0) -> None:
        self._chunks.append((examples, loss_sum))
        while sum(n for n, _ in self._chunks[1:]) >= self.window:
            self._chunks.pop(0)

    @property
    def value(self) -> float:
        n = sum(n for n, _ in self._chunks)
        return sum(v for _, v in self._chunks) / n if n else float("nan")


class DigitsTask:
    name = "digits"
    metric = "accuracy"
    higher_is_better = True
    output = "softmax"
    categorical = False

    def evaluation_data(self, trained_on: str, data: str) -> str | None:
        """Its own held-out rows, whatever --data says (the digits are the only rows)."""
        return trained_on

    def metrics_of(self, pred: np.ndarray, labels: np.ndarray) -> dict[str, float]:
        return {"accuracy": float((pred.argmax(1) == labels.astype(np.int64)).mean())}

    def features(self, cfg: TaskInputs) -> Features:
        # No categorical features: one table of one unused row keeps the embedding path
        # uniform (ids have zero columns, so nothing is ever looked up).
        return Features(SIDE * SIDE, (1,))

    def build_model(self, cfg: TaskInputs, features: Features) -> torch.nn.Module:
        torch.manual_seed(cfg.seed)
        return DigitsCNN()

    def plan_data(self, cfg: TaskInputs) -> DataPlan:
        examples = cfg.data.examples or DEFAULT_EXAMPLES
        data = self.open_data("digits", examples, cfg.seed, False)
        return DataPlan(data, data, examples * cfg.data.epochs, examples, len(data), None,
                        self.features(cfg), open_examples=examples,
                        epoch_rows=examples if cfg.data.epochs > 1 else None)

    def open_data(self, path: str, examples: int | None, seed: int,
                  skip_bad_lines: bool) -> DigitsData:
        return DigitsData(examples or DEFAULT_EXAMPLES, seed)

    def loss_sum(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, labels.long(), reduction="sum")

    def running_metric(self) -> RunningLoss:
        return RunningLoss()

    def prepare_evaluation(self) -> None:
        pass  # accuracy and cross-entropy need nothing beyond torch

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, tables: EmbeddingClient, plan: DataPlan, start: int,
                 stop: int) -> dict[str, float]:
        data = plan.eval
        x = torch.from_numpy(np.asarray(data.dense[start:stop]))
        y = torch.from_numpy(np.asarray(data.labels[start:stop])).long()
        logits = model(x, None)
        return {"accuracy": float((logits.argmax(1) == y).float().mean()),
                "loss": float(F.cross_entropy(logits, y)), "examples": stop - start}

    def summary(self, final: dict[str, float], plan: DataPlan) -> dict[str, object]:
        return {"eval_accuracy": final["accuracy"], "eval_loss": final["loss"],
                "eval_examples": final["examples"]}
