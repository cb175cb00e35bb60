"""Fixtures shared by several test modules."""

from __future__ import annotations

import pytest


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
    path.mkdir(parents=True, exist_ok=True)
    for name, arr in (("labels", labels), ("dense", dense), ("cats", cats)):
        np.save(path / f"{name}.npy", arr)
    return path


@pytest.fixture
def array_dir(tmp_path):
    return write_array_dir(tmp_path / "arrays")
