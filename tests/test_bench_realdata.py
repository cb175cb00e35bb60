"""`bench realdata`'s goals from its runs: medians, and the gaps' noise over the seeds."""

from __future__ import annotations

import pytest

pytest.importorskip("scipy")

from shadowsync.bench.commands import parse_splits  # noqa: E402
from shadowsync.bench.realdata import (  # noqa: E402
    DEEPFM_GRID,
    LEARNERS,
    LIGHTGBM_GRID,
    TUNING_SPLIT,
    _summary,
    gap_noise,
    grid_points,
    pick_by_validation,
    run_realdata_bench,
)
from shadowsync.errors import UserError  # noqa: E402


def test_the_gap_noise_is_zero_without_spread_and_scales_with_it():
    assert gap_noise([0.78, 0.78, 0.78], [0.77, 0.77, 0.77]) == 0.0
    a, b = [0.7871, 0.7888, 0.7864], [0.7829, 0.7868, 0.7866]
    noise = gap_noise(a, b)
    assert noise is not None and 0 < noise < max(a + b) - min(a + b)
    # The median is scale-equivariant, and the resamples are drawn the same each time.
    assert gap_noise([10 * x for x in a], [10 * x for x in b]) == pytest.approx(10 * noise)
    assert gap_noise([0.78], [0.77, 0.76]) is None  # one seed says nothing of the draw


def _runs(aucs: dict[str, list[float]], prefix: str = "set") -> list[dict[str, object]]:
    return [{"variant": f"{prefix}/{learner}", "repeat": i, "eval_auc": auc, "eval_ne": 0.8,
             "wall_s": 1.0, "best_val_auc": auc, "time_to_best_val_auc_s": 1.0,
             "validations": [[0.5, auc]]}
            for learner, values in aucs.items() for i, auc in enumerate(values)]


def test_each_goal_is_judged_on_medians_against_the_tuned_baselines_and_carries_its_noise():
    s = _summary(_runs({"default": [0.780, 0.786, 0.784], "local": [0.785, 0.785, 0.785],
                        "deepfm": [0.770, 0.770, 0.770], "deepfm-tuned": [0.787, 0.787, 0.787],
                        "lightgbm": [0.800, 0.800, 0.800],
                        "lightgbm-tuned": [0.770, 0.790, 0.775]}), "set")
    assert set(LEARNERS) == set(s["medians"])
    g = s["goals"]
    assert g["default_vs_deepfm_tuned_auc"]["gap"] == pytest.approx(0.003)
    assert not g["default_vs_deepfm_tuned_auc"]["met"]
    assert g["default_vs_lightgbm_tuned_auc"]["gap"] == pytest.approx(-0.009)
    assert g["default_vs_lightgbm_tuned_auc"]["met"]
    assert g["default_vs_local_auc"]["met"] and g["default_eval_ne"]["met"]
    # DeepFM's seeds agree, the default job's do not: the noise is the default's alone.
    assert 0 < g["default_vs_deepfm_tuned_auc"]["seed_noise"] < 0.006
    # The untuned baselines are shown beside them and judged by no goal.
    assert s["untuned_gaps"]["default_vs_deepfm_auc"] == pytest.approx(-0.014)
    assert s["untuned_gaps"]["default_vs_lightgbm_auc"] == pytest.approx(0.016)
    assert not any("untuned" in k or k in ("default_vs_deepfm_auc", "default_vs_lightgbm_auc")
                   for k in g)


def test_the_grids_cover_every_setting_and_hold_the_untuned_one():
    points = grid_points(DEEPFM_GRID)
    assert len(points) == 9 and len({tuple(p.values()) for p in points}) == 9
    assert {"lr": 1e-3, "dropout": 0.2} in points
    assert len(grid_points(LIGHTGBM_GRID)) == 18
    assert {"learning_rate": 0.05, "num_leaves": 31, "min_data_in_leaf": 20} in \
        grid_points(LIGHTGBM_GRID)
    assert grid_points({"a": (1, 2), "b": (3,)}) == [{"a": 1, "b": 3}, {"a": 2, "b": 3}]


def test_a_setting_is_picked_by_validation_auc_and_never_by_eval():
    trials = [{"setting": {"lr": 1}, "val_auc": 0.80, "eval_auc": 0.99},
              {"setting": {"lr": 2}, "val_auc": 0.82, "eval_auc": 0.70},
              {"setting": {"lr": 3}, "val_auc": 0.82, "eval_auc": 0.75}]
    assert pick_by_validation(trials)["setting"] == {"lr": 2}  # first of the equals


def test_splits_parse_and_the_tuning_split_is_never_reported(tmp_path):
    assert parse_splits("1-5") == (1, 2, 3, 4, 5)
    assert parse_splits("3,1-2,3") == (3, 1, 2)
    for bad in ("", "a", "2-x", "-1"):
        with pytest.raises(UserError, match="--splits"):
            parse_splits(bad)
    with pytest.raises(UserError, match="tuning split"):
        run_realdata_bench(str(tmp_path), splits=(1, TUNING_SPLIT))


def test_results_hold_each_finished_set_and_split_with_a_page_column_a_split(tmp_path):
    import json

    from shadowsync.bench.realdata import write_results

    runs = []
    for split in (1, 2):
        for name in ("a", "b"):
            for r in _runs({n: [0.78, 0.79] for n in LEARNERS}, f"{name}/split{split}"):
                runs.append({**r, "split": split})
    runs = [r for r in runs if not (r["variant"] == "b/split2/local" and r["repeat"] == 1)]
    trials = [{"setting": {"lr": 1}, "val_auc": 0.8}]
    tuning = {n: {b: {"picked": {"lr": 1}, "trials": trials} for b in ("deepfm", "lightgbm")}
              for n in ("a", "b")}
    out = write_results(tmp_path, runs, ("a", "b"), (1, 2),
                        {"seeds": 2, "tuning": tuning, "split_wall_s": {1: 60.0, 2: 60.0}})
    # set b's split 2 stopped short of its last local seed: left out, not summarized
    assert {k: sorted(v) for k, v in out["splits"].items()} == {1: ["a", "b"], 2: ["a"]}
    page = json.loads((tmp_path / "split2" / "bench.json").read_text())
    assert set(page["ratios"]) == {f"a {k}" for k in (
        "default_vs_deepfm_tuned_auc", "default_vs_lightgbm_tuned_auc", "default_vs_local_auc",
        "default_eval_ne", "default_vs_deepfm_auc", "default_vs_lightgbm_auc")}
    assert [t["title"].split(":")[0] for t in page["tables"]][1] == "split 2"
    whole = json.loads((tmp_path / "bench.json").read_text())
    assert "b split1 default_vs_local_auc" in whole["ratios"]
    assert "b split2 default_vs_local_auc" not in whole["ratios"]
    assert whole["not_met"] == []


def test_runs_of_commands_run_side_by_side_are_put_together(tmp_path):
    import json

    from shadowsync.bench.realdata import collect_results

    trials = [{"setting": {"lr": 1}, "val_auc": 0.8}]
    for name in ("adult", "movielens100k"):
        d = tmp_path / name
        d.mkdir()
        runs = [{**r, "split": 1} for r in _runs({n: [0.78, 0.79] for n in LEARNERS},
                                                  f"{name}/split1")]
        runs.append({**runs[0], "eval_auc": 0.5})  # the same seed run again: the later counts
        (d / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
        (d / "tuning.json").write_text(json.dumps({"sets": {name: {
            b: {"picked": {"lr": 1}, "trials": trials} for b in ("deepfm", "lightgbm")}}}))
    out = collect_results(str(tmp_path / "all"), [str(tmp_path / "adult"),
                                                  str(tmp_path / "movielens100k")], seeds=2)
    assert sorted(out["splits"][1]) == ["adult", "movielens100k"]
    assert out["splits"][1]["adult"]["medians"]["default"]["eval_auc"] == pytest.approx(0.645)
    assert len(json.loads((tmp_path / "all" / "split1" / "bench.json").read_text())
               ["tables"][0]["rows"]) == 4  # two sets' two baselines tuned
    with pytest.raises(UserError, match="--collect"):
        collect_results(str(tmp_path / "x"), [str(tmp_path / "none")])
