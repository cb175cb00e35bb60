"""examples/load_and_predict.py runs end to end: it trains on synthetic multi-hot data, loads
the run and predicts held-out rows whose AUC equals the run's own evaluation of them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import run_python

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "load_and_predict.py"


@pytest.mark.timeout(150)
def test_load_and_predict_example(tmp_path):
    res = run_python([str(EXAMPLE), "--out", str(tmp_path)], timeout=120, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.leftover == []
    assert "genres (mean of a bag)" in res.stdout and "tags (sum of a bag, weighted)" in res.stdout
    loaded = float(re.search(r"auc \(loaded model's predictions\): ([\d.]+)", res.stdout)[1])
    own = float(re.search(r"auc \(the run's own evaluation\): +([\d.]+)", res.stdout)[1])
    assert loaded == own  # the same held-out rows scored the same, printed to 4 places
    assert loaded > 0.65, res.stdout  # the planted effects are learnt (chance: 0.5)
