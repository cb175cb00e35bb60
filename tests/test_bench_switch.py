"""`bench switch`'s bookkeeping on made-up runs: paired differences by repeat, which
variants a default run and a --full run include, and the slow link's window."""

import math
import threading
import time

import pytest

import shadowsync.api
import shadowsync.bench.switch as bench
from shadowsync.bench.common import run_job
from shadowsync.bench.switch import runs as bench_runs
from shadowsync.bench.switch.bounds import delay_slowdown, detection_lag_share, greedy_bound
from shadowsync.bench.switch.goals import goal_met
from shadowsync.bench.switch.ratios import accuracy_gap_se, paired, ratios_of
from shadowsync.bench.switch.report import phases_text
from shadowsync.bench.switch.runs import (
    isolate_phases,
    measured_run,
    overhead_by_variant,
    pooled,
    switch_fields,
    time_split,
)
from shadowsync.bench.switch.scenarios import (
    CORE_VARIANTS,
    DELAYS,
    FALSE_ALARM,
    FULL_VARIANTS,
    SCENARIOS,
    VARIANTS,
    compared_with,
    digits_job,
    scenario_text,
    settings_of,
)
from shadowsync.bench.switch.slow_link import LinkWindow
from shadowsync.lifecycle.attempts import Progress, reset
from shadowsync.lifecycle.exits import TrainingDiverged


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


def test_a_diverged_run_is_a_result_at_chance_without_a_time(tmp_path, monkeypatch):
    """An ablation that diverges (ASP without the rate scaling) must not end the bench: the
    run scores chance, is marked, and its variant's time comes from the runs that ended."""
    def diverge(cfg):
        raise TrainingDiverged("training diverged: mean loss 201 under ASP")

    monkeypatch.setattr(shadowsync.api, "run", diverge)
    out = tmp_path / "run"
    r = measured_run(lambda: run_job(digits_job(4, 1000, 0.5), out), out, "accuracy")
    assert r["metric"] == 0.1 and r["train_s"] is None and "mean loss 201" in r["diverged"]
    assert measured_run(lambda: run_job(digits_job(4, 1000, 0.5), out), out,
                        "ne")["metric"] == 1.0
    runs = [_run("bsp", 0, 0.98, 10.0), {**_run("asp", 0, 0.0, 0.0), **r},
            _run("bsp", 1, 0.96, 20.0), _run("asp", 1, 0.90, 10.0)]
    p = paired(runs, "asp", "bsp", "accuracy")
    assert p["metric"]["each"] == pytest.approx([-88.0, -6.0])  # chance counts as a score
    assert p["time"]["each"] == pytest.approx([0.5])  # only the run that ended has a time
    for run in runs:
        run.update(run_s=run["train_s"] or 3.0, startup_s=1.0 if run["train_s"] else None)
    split = time_split(runs)
    assert split["train_s_total"] == 40.0 and split["run_s_total"] == 43.0


def test_ratios_are_each_variant_against_its_own_baseline():
    """Distinct medians, so an inverted ratio, a swapped baseline or a difference taken the
    wrong way round gives another number."""
    assert set(CORE_VARIANTS) < set(VARIANTS)
    med = {"bsp": (10.0, 0.98), "asp": (8.0, 0.94), "switch": (9.0, 0.975),
           "bsp+straggler": (20.0, 0.97), "greedy+straggler": (11.0, 0.96)}
    res = {"metric": "accuracy", "switch_overhead_s": 0.01, "switch_overhead_share": 0.002,
           "medians": {v: {"train_s": t, "metric": m} for v, (t, m) in med.items()}}
    ratios = ratios_of(res, "")
    assert ratios["switch_time_vs_bsp"] == pytest.approx(0.9)
    assert ratios["switch_acc_minus_bsp"] == pytest.approx(-0.5)
    assert ratios["asp_acc_minus_bsp"] == pytest.approx(-4.0)
    assert ratios["asp_time_vs_bsp"] == pytest.approx(0.8)
    assert ratios["switch_time_vs_bsp_straggler"] == pytest.approx(0.55)  # vs BSP's 20 s
    assert ratios["switch_acc_minus_bsp_straggler"] == pytest.approx(-1.0)  # vs BSP's 0.97
    assert ratios["switch_overhead_s"] == 0.01
    assert ratios["switch_overhead_share"] == 0.002
    assert "elastic_time_vs_bsp_straggler" not in ratios  # only with --full
    ne = ratios_of({**res, "metric": "ne"}, "_ctr")  # NE: a ratio, lower is better
    assert ne["switch_ne_vs_bsp_ctr"] == pytest.approx(0.975 / 0.98)
    assert ne["asp_ne_vs_bsp_ctr"] == pytest.approx(0.94 / 0.98)


def test_time_split_says_how_much_of_the_runs_was_training():
    runs = [{"run_s": 40.0, "train_s": 10.0, "startup_s": 30.0},
            {"run_s": 60.0, "train_s": 15.0, "startup_s": 45.0},
            {"run_s": 50.0, "train_s": 5.0, "startup_s": 45.0}]
    t = time_split(runs)
    assert t["runs"] == 3
    assert t["run_s_total"] == pytest.approx(150.0) and t["train_s_total"] == pytest.approx(30.0)
    assert t["run_s_median"] == pytest.approx(50.0)
    assert t["startup_s_median"] == pytest.approx(45.0)


def test_the_slow_link_is_limited_for_the_middle_half_of_the_job_by_its_progress(tmp_path):
    """`LinkWindow` reads the examples the trainers note (as `lifecycle.attempts` writes them)
    and limits the link from a quarter of the job to three quarters, then lifts it."""
    class Hosts:
        def __init__(self):
            self.rates = []

        def set_pair_rate(self, a, b, rate):
            self.rates.append(((a, b), rate))

    hosts = Hosts()
    window = LinkWindow(hosts, (1, 3), 40.0, examples=1000, trainers=2)
    reset(tmp_path)
    notes = [Progress(tmp_path, t) for t in range(2)]
    done = threading.Event()
    watcher = threading.Thread(target=window, args=(tmp_path, done))
    watcher.start()
    seen = []
    for each in range(0, 501, 25):  # both trainers at the same pace: the job at 2 x each
        for note in notes:
            note(each)
        time.sleep(0.06)
        seen.append((2 * each / 1000, list(hosts.rates)))
    done.set()
    watcher.join(5)
    assert hosts.rates == [((1, 3), 40.0), ((1, 3), None)]
    limited_at, lifted_at = (at for at, _ in window.changes)
    assert 0.25 <= limited_at < 0.35 and 0.75 <= lifted_at < 0.85
    assert all(rates == [] for at, rates in seen if at < 0.2)
    assert all(len(rates) == 1 for at, rates in seen if 0.35 <= at < 0.7)


def test_a_link_window_lifts_the_limit_when_the_job_ends_inside_it(tmp_path):
    rates = []

    class Hosts:
        def set_pair_rate(self, a, b, rate):
            rates.append(rate)

    reset(tmp_path)
    Progress(tmp_path, 0)(500)
    done = threading.Event()
    window = LinkWindow(Hosts(), (0, 1), 10.0, examples=1000, trainers=1)
    watcher = threading.Thread(target=window, args=(tmp_path, done))
    watcher.start()
    time.sleep(0.2)
    done.set()
    watcher.join(5)
    assert rates == [10.0, None]


def test_greedys_bound_is_the_issues_closed_form():
    """BSP and ASP equally fast (1 unit each for the job), 4 workers, one 3x slower for the
    middle half, BSP quota half the job: greedy at best 0.5 + 0.5 x 4 / (3 + 1/3) = 1.1."""
    assert greedy_bound(1.0, 1.0, 4, 0.5, 3.0) == pytest.approx(1.1)
    # two of four slowed 3x: the window's work at (2 + 2/3) / 4 of full pace
    assert greedy_bound(1.0, 1.0, 4, 0.5, 3.0, slowed=2) == pytest.approx(0.5 + 0.5 * 1.5)
    # a smaller quota leaves the rest of the outside to ASP: 0.25 x 2 + 0.25 x 1 + 0.5 x 1.2
    assert greedy_bound(2.0, 1.0, 4, 0.25, 3.0) == pytest.approx(0.5 + 0.25 + 0.6)
    # a 30 ms delay on a 10 ms ASP step (asp 7.5 s over 750 steps) is a 4x slowdown
    assert delay_slowdown(0.03, 7.5, 750) == pytest.approx(4.0)
    # the detector's lag: a tenth of the job in BSP at the slowed pace (1 + 2 x 1 a step),
    # and a tenth less of the quota outside the window, run as ASP instead
    assert greedy_bound(2.0, 1.0, 4, 0.5, 3.0, lag_share=0.1) == pytest.approx(
        0.1 * (2.0 + 2 * 1.0) + 0.4 * 1.2 + 0.4 * 2.0 + 0.1 * 1.0)
    # a lag as long as the window: BSP at the slowed pace all through it
    assert greedy_bound(1.0, 1.0, 4, 0.5, 3.0, lag_share=0.7) == pytest.approx(0.5 * 3.0 + 0.5)


def test_the_detection_lag_is_m_windows_of_steps_each_episode_and_elastics_patience_on_top():
    """L = E min(D, steps w / (2E - 1)) / steps, D = m w = 15 at the detector's defaults;
    elastic's patience at its floor adds 2 m w = 30."""
    assert detection_lag_share("greedy", 750, 1) == pytest.approx(15 / 750)
    assert detection_lag_share("isolate", 750, 4) == pytest.approx(4 * 15 / 750)
    assert detection_lag_share("elastic", 750, 1) == pytest.approx(45 / 750)
    # four episodes of 375 x 0.5 / 7 = 26.8 steps: elastic's 45 outlast each
    assert detection_lag_share("elastic", 375, 4) == pytest.approx(0.5 * 4 / 7)


def test_bounds_and_goals_from_a_runs_own_medians():
    med = {"bsp": (10.0, 0.98), "asp": (10.0, 0.94), "switch": (10.0, 0.978),
           "bsp+straggler": (20.0, 0.98), "greedy+straggler": (11.5, 0.975),
           "bsp+delay30ms_1t_1e": (30.0, 0.98), "greedy+delay30ms_1t_1e": (14.0, 0.965),
           "isolate+delay30ms_1t_1e": (15.0, 0.968),
           "bsp+delay10ms_2t_4e": (12.0, 0.98), "isolate+delay10ms_2t_4e": (9.0, 0.98)}
    res = {"metric": "accuracy", "switch_overhead_s": 0.01, "switch_overhead_share": 0.006,
           "gradients": 3000, "workers": 4, "bsp_share": 0.5,
           "medians": {v: {"train_s": t, "metric": m} for v, (t, m) in med.items()}}
    for v in ("greedy+delay30ms_1t_1e", "isolate+delay30ms_1t_1e"):  # 3 repeats of 300
        res["medians"][v].update(metric_mean=res["medians"][v]["metric"], eval_n=900)
    ratios = ratios_of(res, "")
    # the detector's 15 of 750 steps in BSP at the 3x pace, then the best case
    lag = 15 / 750
    bound = lag * (10 + 2 * 10) + (0.5 - lag) * 10 * 4 / (3 + 1 / 3) + (0.5 - lag) * 10 + lag * 10
    assert ratios["bound_s_straggler"] == pytest.approx(bound)
    assert ratios["greedy_time_vs_bound_straggler"] == pytest.approx(11.5 / bound)
    # delay: 30 ms on an ASP step of 10 s / 750 steps = 13.3 ms, a 3.25x slowdown of the step
    s = 1 + 0.03 * 750 / 10.0
    assert ratios["step_slowdown_delay30ms_1t_1e"] == pytest.approx(s)
    assert ratios["bsp_slowdown_delay30ms_1t_1e"] == pytest.approx(3.0)  # BSP 30 s over 10 s
    assert ratios["bound_s_delay30ms_1t_1e"] == pytest.approx(
        greedy_bound(10.0, 10.0, 4, 0.5, s, 1, 0.5, lag))
    assert ratios["greedy_time_vs_bsp_delay30ms_1t_1e"] == pytest.approx(14.0 / 30.0)
    assert ratios["greedy_acc_minus_bsp_delay30ms_1t_1e"] == pytest.approx(-1.5)
    # isolate against greedy: +0.3 points in 15 / 14 of its time, over 900 images each
    assert ratios["isolate_acc_minus_greedy_delay30ms_1t_1e"] == pytest.approx(0.3)
    se = 100 * math.sqrt((0.968 * 0.032 + 0.965 * 0.035) / 900)
    assert ratios["isolate_acc_tolerance_vs_greedy_delay30ms_1t_1e"] == pytest.approx(-se)
    assert ratios["isolate_time_vs_greedy_delay30ms_1t_1e"] == pytest.approx(15 / 14)
    # 10 ms on 2 trainers in 4 episodes: on for 4 of the window's 7 slices (2/7 of the job),
    # a 1.75x slowdown; the bound's window is that share, the rest BSP then ASP
    s, on = 1 + 0.01 * 750 / 10.0, 0.5 * 4 / 7
    assert ratios["step_slowdown_delay10ms_2t_4e"] == pytest.approx(s)
    assert ratios["bound_s_delay10ms_2t_4e"] == pytest.approx(
        greedy_bound(10.0, 10.0, 4, 0.5, s, 2, on, 4 * lag))
    assert ratios["bound_s_delay10ms_2t_4e"] == pytest.approx(
        4 * lag * (10 + (s - 1) * 10) + (on - 4 * lag) * 10 * 4 / (2 + 2 / s)
        + (0.5 - 4 * lag) * 10 + (1 - on - 0.5 + 4 * lag) * 10)
    met = {k: goal_met(k, ratios) for k in ratios}
    assert met["greedy_time_vs_bound_straggler"] is True  # 1.045 <= 1.1
    assert met["switch_acc_minus_bsp"] is True  # -0.2 >= -0.5
    assert met["asp_acc_minus_bsp"] is True  # -4 <= -1
    assert met["switch_acc_minus_bsp_straggler"] is True  # -0.5 >= -1
    assert met["greedy_acc_minus_bsp_delay30ms_1t_1e"] is False  # -1.5 < -1
    assert met["isolate_acc_minus_greedy_delay30ms_1t_1e"] is True  # +0.3 >= -0.85
    assert goal_met("isolate_acc_minus_greedy_delay30ms_1t_1e", {  # -0.9 < -0.85: below
        **ratios, "isolate_acc_minus_greedy_delay30ms_1t_1e": -0.9}) is False
    assert met["isolate_time_vs_greedy_delay30ms_1t_1e"] is True  # 1.07 <= 1.1
    assert "isolate_time_vs_greedy_delay10ms_2t_4e" not in ratios  # greedy did not run
    # -1.0 points as accuracies give it (100 x (0.9667 - 0.9767) = -1.0000000000000009)
    assert goal_met("switch_acc_minus_bsp_straggler",
                    {"switch_acc_minus_bsp_straggler": 100 * (0.9667 - 0.9767)}) is True
    assert met["switch_overhead_share"] is False  # 0.6% > 0.5%
    assert met["switch_time_vs_bsp"] is None  # no goal
    assert goal_met("asp_time_vs_bsp_jitter", ratios) is None  # not measured


def test_variants_compare_with_bsp_under_the_same_slowdown_and_asp_first_keeps_the_share():
    assert compared_with("elastic+delay30ms_2t_4e") == "bsp+delay30ms_2t_4e"
    assert SCENARIOS["delay10ms_2t_4e"] == (
        "kind=delay,ms=10,trainers=2,episodes=4,start=25%,duration=50%")
    assert len(DELAYS) == 8 and all(f"{p}+{sc}" in VARIANTS for sc in DELAYS
                                    for p in ("bsp", "greedy", "elastic", "isolate"))
    assert compared_with("switch/zero") == "bsp"
    base = VARIANTS["switch"]
    plan = digits_job(4, 1000, 0.5).switch.plan
    assert settings_of(VARIANTS["switch/asp-first"], plan) == {"switch_plan": "asp:0.5,bsp"}
    assert settings_of(base, plan) == {}
    assert VARIANTS["switch/compensate"].settings == (("switch_compensate_momentum", True),)
    assert not digits_job(4, 1000, 0.5).switch.compensate_momentum  # the paper's, by default
    assert all(compared_with(v) in VARIANTS for v in VARIANTS)


def test_an_isolate_runs_phases_and_releases_come_from_its_switches():
    """Each switch opens a phase; a trainer leaving the isolated set is released when the
    phase is BSP, and only ends its isolation when it is the plan's ASP phase."""
    def sw(frm, to, isolated, applied):
        return {"from": frm, "to": to, "isolated": isolated, "applied": applied,
                "cost_s": 0.0, "params_identical": True}

    released = switch_fields({"switches": [sw("bsp", "bsp", [2], 270),
                                           sw("bsp", "bsp", [], 611),
                                           sw("bsp", "asp", [], 1014)]})
    assert phases_text(released["phases"]) == (
        "bsp, bsp isolating [2] at 270, bsp at 611 (released [2]), asp at 1014")
    assert released["isolations"] == [
        {"trainer": 2, "isolated_at": 270, "released_at": 611, "ended_at": 611}]
    never = isolate_phases([sw("bsp", "bsp", [1, 2], 90), sw("bsp", "bsp", [2], 120),
                            sw("bsp", "asp", [], 1013)])
    assert phases_text(never["phases"]) == ("bsp, bsp isolating [1, 2] at 90, "
                                            "bsp isolating [2] at 120 (released [1]), "
                                            "asp at 1013")
    assert never["isolations"] == [
        {"trainer": 1, "isolated_at": 90, "released_at": 120, "ended_at": 120},
        {"trainer": 2, "isolated_at": 90, "released_at": None, "ended_at": 1013}]
    assert isolate_phases([]) == {"phases": [], "isolations": []}


def test_the_overhead_goal_sees_the_variant_that_spent_most_time_switching():
    """A run's share comes from its summary (`switch_fields`); per variant the median, and
    the goal takes the largest: greedy's many switches, not the plan's one."""
    summary = {"switches": [{"cost_s": 0.0, "params_identical": True, "step": 5}],
               "switch_overhead": {"switch_s": [0.01], "share_of_run": 0.001}}
    assert switch_fields(summary)["switch_share"] == 0.001
    assert switch_fields({"switches": []})["switch_share"] is None  # no switch, no share
    runs = [{"variant": "switch", "switch_share": s} for s in (0.001, 0.0005, 0.002)]
    runs += [{"variant": "greedy+straggler", "switch_share": s} for s in (0.01, 0.004, 0.006)]
    runs += [{"variant": "bsp", "switch_share": None}]
    assert overhead_by_variant(runs) == {"switch": 0.001, "greedy+straggler": 0.006}


def test_full_runs_only_what_its_goals_need_and_judges_the_false_alarm(tmp_path, monkeypatch):
    """`--full` on made-up runs: BSP, ASP, the 4 policies under each of the 8 delays and the
    false alarm for greedy and elastic, 3 seeds each, digits only at 48k examples. Greedy left
    BSP for the false alarm on 2 of 3 seeds (median 1: met), elastic on 1 (median 0: met);
    isolate's accuracy against greedy comes with its seed-by-seed range."""
    seen = []

    def fake_run(train, out, metric):
        cfg = train()  # the job, as the fake common.run_job below hands it back
        variant = out.parent.name and out.name.rsplit("-", 1)[0]
        seen.append((variant, cfg.seed, cfg.data.examples, str(cfg.testing.straggler)))
        seed = cfg.seed - digits_job(4, 1000, 0.5).seed
        left = {"greedy-false-alarm": [1, 1, 0], "elastic-false-alarm": [0, 0, 1]}
        iso = variant.startswith("isolate")
        return {"train_s": 10.0 + seed, "run_s": 12.0 + seed, "startup_s": 2.0,
                "metric": 0.97 + 0.01 * seed * iso, "loss": 0.1, "examples": 1,
                "eval_examples": 300,
                "curve": [], **switch_fields({}), "staleness_mean": None, "diverged": None,
                "straggler_switches": left.get(variant, [0, 0, 0])[seed]}

    monkeypatch.setattr(bench_runs, "measured_run", fake_run)
    monkeypatch.setattr(bench_runs.common, "run_job", lambda cfg, out: cfg)
    out = bench.run_switch_bench(str(tmp_path), full=True, ctr=False)
    assert len(FULL_VARIANTS) == 2 + 4 * len(DELAYS) + 2 and len(seen) == 3 * len(FULL_VARIANTS)
    assert {s[2] for s in seen} == {48_000}
    alarm = scenario_text(FALSE_ALARM, 48_000 // 32 // 4)  # 16 of 375 steps
    assert alarm == "trainer=1,slowdown=3,start=40%,duration=4.267%"
    assert {s[3] for s in seen if s[0] == "elastic-false-alarm"} == {alarm}
    goals = out["goals"]
    assert goals["greedy_false_alarm_switches"] == {"goal": ">= 1", "value": 1, "met": True}
    assert goals["elastic_false_alarm_switches"] == {"goal": "<= 0", "value": 0, "met": True}
    sc = "delay30ms_1t_1e"
    assert goals[f"isolate_acc_minus_greedy_{sc}"]["value"] == pytest.approx(1.0)  # 900 images
    assert goals[f"isolate_acc_minus_greedy_{sc}"]["goal"] == ">= 0"
    assert out["ratio_spread"][f"isolate_acc_minus_greedy_{sc}"] == pytest.approx([0.0, 2.0])
    assert out["ratio_spread"][f"greedy_time_vs_bsp_{sc}"] == [1.0, 1.0]


def test_pooled_accuracy_weighs_each_repeat_by_its_held_out_images():
    """metric_mean = sum(acc_r N_r) / sum(N_r) over the repeats that evaluated; a diverged
    repeat (no examples) is left out of it, and a variant with none has no pooled value."""
    runs = [{"variant": "isolate", "metric": 0.98, "eval_examples": 300},
            {"variant": "isolate", "metric": 0.96, "eval_examples": 300},
            {"variant": "isolate", "metric": 0.90, "eval_examples": 600},
            {"variant": "isolate", "metric": 0.1, "eval_examples": None},
            {"variant": "greedy", "metric": 0.1, "eval_examples": None}]
    assert pooled(runs, "isolate") == {
        "metric_mean": pytest.approx((0.98 * 300 + 0.96 * 300 + 0.9 * 600) / 1200),
        "eval_n": 1200}
    assert pooled(runs, "greedy") == {}
    # the standard error of a difference of two such accuracies, in points
    a, b = {"metric_mean": 0.98, "eval_n": 900}, {"metric_mean": 0.95, "eval_n": 400}
    assert accuracy_gap_se(a, b) == pytest.approx(
        100 * math.sqrt(0.98 * 0.02 / 900 + 0.95 * 0.05 / 400))
