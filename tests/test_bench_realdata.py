"""`bench realdata`'s goals from its runs: medians, and the gaps' noise over the seeds."""

from __future__ import annotations

import pytest

pytest.importorskip("scipy")

from shadowsync.bench.realdata import LEARNERS, _summary, gap_noise  # noqa: E402


def test_the_gap_noise_is_zero_without_spread_and_scales_with_it():
    assert gap_noise([0.78, 0.78, 0.78], [0.77, 0.77, 0.77]) == 0.0
    a, b = [0.7871, 0.7888, 0.7864], [0.7829, 0.7868, 0.7866]
    noise = gap_noise(a, b)
    assert noise is not None and 0 < noise < max(a + b) - min(a + b)
    # The median is scale-equivariant, and the resamples are drawn the same each time.
    assert gap_noise([10 * x for x in a], [10 * x for x in b]) == pytest.approx(10 * noise)
    assert gap_noise([0.78], [0.77, 0.76]) is None  # one seed says nothing of the draw


def _runs(aucs: dict[str, list[float]]) -> list[dict[str, object]]:
    return [{"variant": f"set/{learner}", "repeat": i, "eval_auc": auc, "eval_ne": 0.8,
             "wall_s": 1.0, "best_val_auc": auc, "time_to_best_val_auc_s": 1.0,
             "validations": [[0.5, auc]]}
            for learner, values in aucs.items() for i, auc in enumerate(values)]


def test_each_goal_is_judged_on_medians_and_carries_its_noise():
    s = _summary(_runs({"default": [0.780, 0.786, 0.784], "local": [0.785, 0.785, 0.785],
                        "deepfm": [0.787, 0.787, 0.787], "lightgbm": [0.770, 0.790, 0.775]}),
                 "set")
    assert set(LEARNERS) == set(s["medians"])
    g = s["goals"]
    assert g["default_vs_deepfm_auc"]["gap"] == pytest.approx(0.003)
    assert not g["default_vs_deepfm_auc"]["met"]
    assert g["default_vs_lightgbm_auc"]["gap"] == pytest.approx(-0.009)
    assert g["default_vs_lightgbm_auc"]["met"]
    assert g["default_vs_local_auc"]["met"] and g["default_eval_ne"]["met"]
    # DeepFM's seeds agree, the default job's do not: the noise is the default's alone.
    assert 0 < g["default_vs_deepfm_auc"]["seed_noise"] < 0.006
