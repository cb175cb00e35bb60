"""`bench switch`'s bookkeeping on made-up runs: paired differences by repeat, and which
variants a default run and a --full run include."""

import pytest

from shadowsync.bench.switch import (
    CORE_VARIANTS,
    VARIANTS,
    compared_with,
    paired,
    ratios_of,
    time_split,
)


def _run(variant, repeat, metric, train_s):
    return {"variant": variant, "repeat": repeat, "metric": metric, "train_s": train_s}


def test_paired_compares_repeat_by_repeat_against_the_right_baseline():
    runs = [_run("bsp", 0, 0.98, 10.0), _run("switch", 0, 0.97, 8.0),
            _run("bsp", 1, 0.96, 20.0), _run("switch", 1, 0.97, 10.0),
            _run("bsp", 2, 0.99, 10.0), _run("switch", 2, 0.985, 9.0)]
    p = paired(runs, "switch", compared_with("switch"), "accuracy")
    assert p["vs"] == "bsp"
    assert p["metric"]["each"] == pytest.approx([-1.0, 1.0, -0.5])
    assert p["metric"]["median"] == pytest.approx(-0.5)
    assert p["metric"]["range"] == pytest.approx([-1.0, 1.0])
    assert p["time"]["each"] == pytest.approx([0.8, 0.5, 0.9])
    ne = paired(runs, "switch", "bsp", "ne")  # NE: a ratio, not a difference
    assert ne["metric"]["each"] == pytest.approx([0.97 / 0.98, 0.97 / 0.96, 0.985 / 0.99])
    assert compared_with("greedy+straggler") == "bsp+straggler"


def test_the_default_variants_are_enough_for_every_ratio_the_issue_names():
    assert set(CORE_VARIANTS) < set(VARIANTS)
    res = {"metric": "accuracy", "switch_overhead_s": 0.01,
           "medians": {v: {"train_s": 10.0, "metric": 0.98} for v in CORE_VARIANTS}}
    ratios = ratios_of(res, "")
    for name in ("switch_time_vs_bsp", "switch_acc_minus_bsp", "asp_acc_minus_bsp",
                 "switch_time_vs_bsp_straggler", "switch_acc_minus_bsp_straggler",
                 "switch_overhead_s"):
        assert ratios[name] is not None
    assert "elastic_time_vs_bsp_straggler" not in ratios  # only with --full


def test_time_split_says_how_much_of_the_runs_was_training():
    runs = [{"run_s": 40.0, "train_s": 10.0, "startup_s": 30.0},
            {"run_s": 60.0, "train_s": 15.0, "startup_s": 45.0},
            {"run_s": 50.0, "train_s": 5.0, "startup_s": 45.0}]
    t = time_split(runs)
    assert t["runs"] == 3
    assert t["run_s_total"] == pytest.approx(150.0) and t["train_s_total"] == pytest.approx(30.0)
    assert t["run_s_median"] == pytest.approx(50.0)
    assert t["startup_s_median"] == pytest.approx(45.0)
