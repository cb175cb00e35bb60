"""Fixtures shared by several test modules."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import run_cli

TrainedRun = tuple[Path, subprocess.CompletedProcess]


@pytest.fixture
def private_cache_root(tmp_path_factory: pytest.TempPathFactory, monkeypatch) -> None:
    """Data caches of this test go to a fresh directory instead of the user's cache."""
    monkeypatch.setenv("SHADOWSYNC_CACHE", str(tmp_path_factory.mktemp("cache-root")))


def write_array_dir(path, rows: int = 40_000, num_dense: int = 5, num_tables: int = 3,
                    seed: int = 0):
    """A `--data DIR` of .npy arrays whose labels depend on both kinds of feature, so a
    model that learns beats predicting the mean click rate."""
    import numpy as np

    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((rows, num_dense)).astype(np.float32)
    cats = rng.integers(0, 50, (rows, num_tables)).astype(np.int32)
    effect = rng.standard_normal((num_tables, 50))
    logit = dense @ rng.standard_normal(num_dense) + effect[np.arange(num_tables), cats].sum(1)
    labels = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    return save_array_dir(path, labels, dense, cats)


def save_array_dir(path, labels, dense, cats):
    """`path` as a `--data DIR` of .npy arrays holding these columns."""
    import numpy as np

    path.mkdir(parents=True, exist_ok=True)
    for name, arr in (("labels", labels), ("dense", dense), ("cats", cats)):
        np.save(path / f"{name}.npy", arr)
    return path


@pytest.fixture
def array_dir(tmp_path):
    return write_array_dir(tmp_path / "arrays")


@pytest.fixture(scope="session")
def trained(tmp_path_factory) -> Callable[..., TrainedRun]:
    """`trained(ARGS, timeout)`: `shadowsync train ARGS` run once a session, however many tests
    (of any module) check things of the same job; returns (its --out directory, the CLI's
    result, with `leftover`). Tests read the run directory and write nothing into it. A run
    that timed out is not kept: the next test to ask starts it again."""
    runs: dict[tuple[str, ...], TrainedRun] = {}

    def train(args: list[str], timeout: float) -> TrainedRun:
        key = tuple(args)
        if key not in runs:
            out = tmp_path_factory.mktemp("shared-run") / "run"
            runs[key] = (out, run_cli(["train", *args, "--out", str(out)], timeout=timeout))
        return runs[key]

    return train


@pytest.fixture(scope="session")
def quiet_arrays_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess, float]:
    """`shadowsync train -q` of the user's own model on one trainer over 12,000 rows of arrays,
    with one evaluation and no checkpoint (test_cli and test_train_local check it): (its --out
    directory, the CLI's result, the seconds the caller waited for it)."""
    tmp = tmp_path_factory.mktemp("quiet-arrays")
    data = write_array_dir(tmp / "arrays", rows=12_000)
    out = tmp / "run"
    started = time.perf_counter()
    res = run_cli(["train", "-q", "--data", str(data), "--trainers", "1",
                   "--embedding-servers", "0", "--sync", "none", "--table-size", "50",
                   "--model", "tests.helpers:two_layer_mlp", "--eval-points", "1",
                   "--checkpoint-every", "never", "--out", str(out)], timeout=120)
    return out, res, time.perf_counter() - started
