"""Sync-Switch's policies on scripted inputs: the straggler detector, greedy and elastic, the
server's decisions and end of job, the configuration at a switch, and the offline search."""

import json
import random
import threading
import time

import pytest
import torch

from shadowsync.errors import UserError
from shadowsync.protocols import Protocol
from shadowsync.runners.switch import search as sw_search
from shadowsync.runners.switch.configure import asp_momentum, step_settings
from shadowsync.runners.switch.detector import DetectorConfig, StragglerDetector
from shadowsync.runners.switch.elastic import Elastic
from shadowsync.runners.switch.greedy import Greedy
from shadowsync.runners.switch.machine import SwitchMachine
from shadowsync.runners.switch.policy import Progress, SwitchPolicy
from shadowsync.runners.switch.schedule import Schedule
from shadowsync.spec.plan import SwitchPlan
from shadowsync.spec.share import BspShare
from shadowsync.spec.switch_policies import POLICIES
from shadowsync.transport.servers.dense import DenseServer, Push


def feed(det, trainers, times_of, steps):
    """Round-robin steps; returns the stragglers after each full round."""
    seen = []
    for step in range(steps):
        for t in range(trainers):
            det.observe(t, times_of(t, step))
        seen.append(det.stragglers)
    return seen


def test_detector_flags_a_3x_straggler_after_m_windows_and_clears_it():
    det = StragglerDetector(DetectorConfig(k=1.5, m=3, window=5))
    slow = range(50, 120)  # trainer 2 is 3x slower for steps 50..119
    seen = feed(det, 4, lambda t, s: 0.03 if t == 2 and s in slow else 0.01, 200)
    flagged = [s for s, who in enumerate(seen) if who == [2]]
    # windows close every 5 steps; the 3rd slow window closes at step 64
    assert flagged[0] == 64
    # cleared after 3 windows back at normal speed: the first closes at step 124
    assert flagged[-1] == 133 and all(w == [] for w in seen[134:])
    assert all(w in ([], [2]) for w in seen)


def test_detector_ignores_noise_and_short_blips():
    rng = random.Random(0)
    det = StragglerDetector()  # the defaults: k 1.5, m 3, window 5
    seen = feed(det, 4, lambda t, s: 0.01 * rng.uniform(0.7, 1.3), 500)
    assert all(w == [] for w in seen)
    # a 3x blip lasting 2 windows is not a straggler either
    det = StragglerDetector()
    seen = feed(det, 2, lambda t, s: 0.03 if t == 1 and 20 <= s < 30 else 0.01, 100)
    assert all(w == [] for w in seen)


def test_detector_is_not_fooled_by_one_stalled_step_a_window():
    """A step the machine stalls 10x in every window of one trainer lifts its windows' means
    over k = 1.5 (14/5 = 2.8 x), but not their medians; a 3x straggler lifts both."""
    stalled = StragglerDetector()
    seen = feed(stalled, 4, lambda t, s: 0.1 if t == 1 and s % 5 == 0 else 0.01, 200)
    assert all(w == [] for w in seen)
    slow = StragglerDetector()
    assert feed(slow, 4, lambda t, s: 0.03 if t == 1 else 0.01, 200)[-1] == [1]


def test_detector_options_parse_and_bad_ones_name_the_option():
    assert DetectorConfig.parse("k=2,m=4") == DetectorConfig(2.0, 4, 5)
    with pytest.raises(UserError, match="--switch-detector"):
        DetectorConfig.parse("k=0.5")
    with pytest.raises(UserError, match="--switch-detector"):
        DetectorConfig.parse("speed=3")


def test_every_policy_entry_builds_a_switch_policy_of_its_name():
    """The registry is the only list of policies: each entry's class has its name, is a
    SwitchPolicy, and a Schedule made with it decides the first step (BSP under this plan)."""
    for name, kind in POLICIES.items():
        cls = kind.build()
        assert cls.name == name
        schedule = Schedule(SwitchPlan.parse("bsp:0.5,asp"), budget=100, policy=name)
        assert isinstance(schedule.policy, SwitchPolicy)
        assert schedule.first_mode() is Protocol.BSP and schedule.isolated == ()
        assert (schedule.detector is not None) == cls.detects


def at(applied, bsp_applied, straggling, now):
    """The progress a policy decides on; `straggling`: trainer 1 is flagged."""
    return Progress(applied, bsp_applied, (1,) if straggling else (), now)


def test_greedy_runs_asp_while_a_straggler_lasts_then_bsp_until_the_quota():
    g = Greedy(quota=100)
    script = [(False, 0, "bsp"), (False, 40, "bsp"), (True, 40, "asp"), (True, 40, "asp"),
              (False, 40, "bsp"), (False, 99, "bsp"), (False, 100, "asp"), (True, 100, "asp")]
    assert [g.mode(at(0, b, s, 0.0)) for s, b, _ in script] == [m for _, _, m in script]


def test_elastic_rides_out_short_slowdowns_and_switches_on_a_lasting_one():
    e = Elastic(quota=100, patience_s=1.0)
    # a straggler seen at t=10 for 0.5 s: no switch
    assert [e.mode(at(0, 10, s, t)) for s, t in [(True, 10.0), (True, 10.5), (False, 10.6)]] == \
        ["bsp", "bsp", "bsp"]
    # one that lasts past the patience: ASP from t=21, back to BSP when it clears
    modes = [e.mode(at(0, 10, s, t)) for s, t in [(True, 20.0), (True, 20.9), (True, 21.0),
                                           (True, 25.0), (False, 26.0)]]
    assert modes == ["bsp", "bsp", "asp", "asp", "bsp"]
    assert e.mode(Progress(0, 100, (), 30.0)) == "asp"  # quota done


def scripted_schedule(policy):
    """A Schedule whose detector sees trainer 1 3x slower for its steps 20..59."""
    return Schedule(SwitchPlan.parse("bsp:0.5,asp"), budget=400, policy=policy,
                    detector=DetectorConfig(k=1.5, m=2, window=5), patience_s=0.0)


@pytest.mark.parametrize("policy", ["greedy", "elastic"])
def test_online_schedule_on_a_scripted_straggler(policy):
    s = scripted_schedule(policy)
    modes = []
    bsp = 0
    for step in range(100):
        for t in range(2):
            s.observe(t, 0.03 if t == 1 and 20 <= step < 60 else 0.01)
        mode = s.decide(2 * step, bsp, now=float(step))
        bsp += 2 if mode == "bsp" else 0
        modes.append(mode)
    first_asp = modes.index("asp")
    assert 25 <= first_asp <= 30  # 2 slow windows of 5 steps
    back = modes.index("bsp", first_asp)
    assert 60 <= back <= 70
    assert s.stragglers == []


def test_configuration_at_a_switch_scales_lr_and_compensates_momentum():
    # BSP at L with n workers -> ASP at L / n; momentum m -> m - (1 - 1/n) under ASP
    assert step_settings("bsp", 0.4, 4, 0.9, "keep", 0, False, compensate=True).lr == 0.4
    s = step_settings("asp", 0.4, 4, 0.9, "keep", 0, True, compensate=True)
    assert s.lr == pytest.approx(0.1) and s.momentum == pytest.approx(0.15)
    assert step_settings("asp", 0.4, 4, 0.9, "keep", 0, True).momentum == 0.9
    assert asp_momentum(0.5, 8) == 0.0 and asp_momentum(0.9, 1) == 0.9


def push(mode, phase=0, version=0, lr=1.0, trainer=0):
    return Push(mode, version, phase, lr, 0.0, False, trainer)


def test_a_bsp_step_nobody_else_joins_is_released_when_the_budget_is_spent():
    """ASP -> BSP near the end: worker A enters BSP, worker B's ASP gradient spends the
    budget; A must not wait forever (the job-end deadlock)."""
    server = DenseServer()
    plan = SwitchPlan.parse("asp:0.5,bsp")
    server.init_trained("w", torch.tensor([0.0]), "sgd", SwitchMachine(workers=2,
                        schedule=Schedule(plan, budget=4), budget=4))
    assert server.mode("w") == ("asp", 0)
    server.push("w", torch.tensor([1.0]), push("asp")).wait()
    r = server.push("w", torch.tensor([1.0]), push("asp")).wait()
    assert (r.mode, r.phase, r.done) == ("bsp", 1, False)  # the plan's boundary, 2 of 4
    held = server.push("w", torch.tensor([1.0]), push("bsp", phase=1))
    assert not held.done()  # waits for the second worker
    server.push("w", torch.tensor([1.0]), push("asp", phase=0)).wait()  # in flight before
    r = server.push("w", torch.tensor([1.0]), push("asp", phase=0)).wait()
    assert r.done and held.done() and held.wait().done
    late = server.push("w", torch.tensor([5.0]), push("bsp", phase=1)).wait()
    assert late.done and late.params.item() == r.params.item()  # nothing more applied


def test_state_identical_on_every_worker_across_switches_both_ways():
    """Two workers in threads under the greedy policy with a scripted straggler: BSP -> ASP
    -> BSP. Every worker holds the same parameters when BSP hands over to ASP and after the
    first BSP step back; version and momentum carry over."""
    from shadowsync.runners.protocol import ProtocolHook, ProtocolSettings, params_digest

    class Client:
        def __init__(self, server):
            self.server = server

        def push(self, grad, p):
            # trainer 1 reports 3x step times for its pushes 10..24
            slow = p.trainer == 1 and 10 <= counts[1] < 25
            counts[p.trainer] += 1
            time.sleep(0.001)  # let the other thread in: both push at about the same pace
            p = Push(p.mode, p.grad_version, p.phase, p.lr, p.momentum, p.reset_momentum,
                     p.trainer, 0.03 if slow else 0.01)
            return self.server.push("w", grad, p).wait()

    counts = [0, 0]
    settings = ProtocolSettings(SwitchPlan.parse("bsp:0.8,asp"), servers=1, numel=3,
                                optimizer="sgd", lr=0.1, momentum=0.5, momentum_policy="keep",
                                workers=2, scale_lr=True, compensate=True, policy="greedy",
                                detector=DetectorConfig(k=1.5, m=2, window=3), patience_s=0.0)
    budget = 2 * 100
    server = DenseServer()
    server.init_trained("w", torch.zeros(3), "sgd", SwitchMachine(workers=2,
                        schedule=settings.schedule(budget), budget=budget))
    hooks = []
    for t in range(2):
        h = ProtocolHook(settings)
        h.client, h.budget, h.trainer = Client(server), budget, t
        h.mode, h.next_phase = server.mode("w")
        hooks.append(h)

    last = [None, None]

    def work(h, t):
        params = [torch.zeros(3)]
        g = torch.tensor([1.0, -1.0, 0.5]) * (t + 1)
        while not h.finished():
            params[0] = h.push(g, params).clone()
        last[t] = params[0]

    threads = [threading.Thread(target=work, args=(h, t)) for t, h in enumerate(hooks)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=20)
    assert not any(th.is_alive() for th in threads)
    events = [e for h in hooks for e in h.report()["switches"]]
    kinds = sorted({(e["phase"], e["from"], e["to"]) for e in events})
    assert kinds[:2] == [(1, "bsp", "asp"), (2, "asp", "bsp")]
    for phase, _, _ in kinds:
        digests = {e["params_digest"] for e in events if e["phase"] == phase}
        assert len(digests) == 1, phase  # identical on both workers
    final, version, applied = server.params("w")
    assert applied >= budget
    # one version per BSP step (n gradients) and per ASP gradient, across every switch: a
    # version restarted at a switch would fall short
    bsp_applied = server.trained["w"].machine.bsp_applied
    assert bsp_applied % 2 == 0 and 0 < bsp_applied < applied
    assert version == bsp_applied // 2 + (applied - bsp_applied)
    # both workers end on the servers' final parameters
    assert [params_digest(p) for p in last] == [params_digest(final)] * 2


def test_search_picks_the_smallest_share_within_tolerance_and_seeds_are_averaged():
    """Accuracy 0.98 at BSP, falling as the share halves; seeds add +-0.001. With tolerance
    0.005 the halving passes 0.125 (0.977) and misses 0.0625; the bisection between them tries
    0.09375 (0.965, missing) and 0.109375 (0.976, passing) with the probes left."""
    table = {1.0: 0.98, 0.5: 0.979, 0.25: 0.978, 0.125: 0.977, 0.0625: 0.96,
             0.09375: 0.965, 0.109375: 0.976}
    calls = []

    def run(share, seed):
        calls.append((share, seed))
        return table[share] + (0.001 if seed else -0.001)

    r = sw_search.search(run, "digits-job", "accuracy", True, tolerance=0.005, seeds=2,
                         min_share=1 / 32, probes=7)
    assert [s for s, _ in calls[::2]] == [1.0, 0.5, 0.25, 0.125, 0.0625, 0.09375, 0.109375]
    assert r.share == 0.109375 and r.bsp_mean == pytest.approx(0.98)
    assert r.bracket == [0.09375, 0.109375] and r.probes == [s for s, _ in calls[::2]]
    # lower is better (NE): within 1% of BSP's; 2 probes: BSP and 50%, nothing to bisect
    ne = {1.0: 0.80, 0.5: 0.801, 0.25: 0.805, 0.125: 0.85, 0.0625: 0.9}
    r = sw_search.search(lambda s, _: ne[s], "ctr-job", "ne", False, 0.01, seeds=1, probes=2)
    assert (r.share, r.bracket, r.probes) == (0.5, None, [1.0, 0.5])


def test_the_default_tolerance_is_bsps_seed_to_seed_spread_and_the_floor_reaches_one_percent():
    """Accuracy: BSP's seeds 0.975 and 0.985 (spread 0.01): a share with mean 0.971 passes
    (0.98 - 0.971 < 0.01), 0.969 does not. NE: seeds 0.79 and 0.81 (spread 0.02 over a mean of
    0.8: 2.5% relative). Every share passing, the halving ends at the 1% floor itself."""
    accuracy = {1.0: (0.975, 0.985), 0.5: (0.971, 0.971), 0.25: (0.969, 0.969)}
    r = sw_search.search(lambda s, seed: accuracy[s][seed], "job", "accuracy", True, seeds=2,
                         probes=3)
    assert r.tolerance == pytest.approx(0.01) and r.share == 0.5 and r.bracket[0] == 0.25
    ne = {1.0: (0.79, 0.81)}
    r = sw_search.search(lambda s, seed: ne.get(s, (0.8199, 0.8199))[seed], "ctr", "ne", False,
                         seeds=2, probes=3)
    assert r.tolerance == pytest.approx(0.025) and r.share == 0.25  # 0.8199 <= 0.8 x 1.025
    assert sw_search.shares(0.01)[-2:] == [0.015625, 0.01]
    r = sw_search.search(lambda s, seed: 0.98, "flat", "accuracy", True, tolerance=0.0,
                         seeds=1, probes=9)
    assert r.share == 0.01 and r.probes[-1] == 0.01
    with pytest.raises(UserError, match="needs --seeds >= 2"):
        sw_search.search(lambda s, seed: 0.98, "one", "accuracy", True, seeds=1)


def halving_only(needed, min_share=1 / 16):
    """What a search that stops at the first miss returns."""
    passing = [s for s in sw_search.shares(min_share) if s >= needed]
    return min(passing, default=1.0)


@pytest.mark.parametrize("needed", [0.03, 0.07, 0.11, 0.2, 0.28, 0.3, 0.35, 0.45, 0.6, 0.9])
def test_search_narrows_to_within_one_probe_of_the_smallest_share_that_passes(needed):
    """A closed-form accuracy curve: 0.98 down to `needed` + 0.02, then falling 0.5 a unit
    of share, so with tolerance 0.01 exactly the shares >= `needed` pass. With the default
    budget the search measures at most 6 points, returns a share that passes, and the share
    that missed last is below `needed`: the answer is within one probe's step of the
    smallest share that passes, a step each probe left after the halving halves."""
    def accuracy(share, seed):
        return 0.98 - 0.5 * max(0.0, needed + 0.02 - share)

    r = sw_search.search(accuracy, "job", "accuracy", True, tolerance=0.01, seeds=1,
                         min_share=1 / 16)
    assert len(r.probes) <= 6 and len(set(r.probes)) == len(r.probes)
    assert r.share >= needed
    if needed < 1 / 16:  # every halving share passed: nothing to bisect
        assert r.bracket is None and r.share == 1 / 16
        return
    missed, passed = r.bracket
    assert missed < needed <= passed == r.share
    assert r.share <= halving_only(needed)
    halving = len([s for s in sw_search.shares(1 / 16) if s >= needed]) + 2  # BSP, the miss
    if halving < 6:
        bisections = 6 - halving
        assert passed - missed == pytest.approx(halving_only(needed) / 2 / 2 ** bisections)


def test_search_result_round_trips_and_drives_switch_at_auto(tmp_path):
    r = sw_search.SearchResult("job", 0.125, "accuracy", True, 0.005, 0.98,
                               {"1": [0.98], "0.5": [0.979], "0.125": [0.977]})
    path = sw_search.store(r, tmp_path)
    assert path.exists() and path.with_suffix(".png").exists()
    auto = BspShare.parse("auto")
    assert sw_search.resolve_share(auto, "job", tmp_path).share == 0.125
    assert str(sw_search.resolve_share(auto, "job", tmp_path)) == "auto"  # written as given
    plan = SwitchPlan.parse("bsp:0.1,asp").with_bsp_share(0.125)
    assert str(plan) == "bsp:0.125,asp:0.875"
    assert sw_search.resolve_share(BspShare.parse("0.25"), None, tmp_path).share == 0.25
    with pytest.raises(UserError, match="no search result for job 'other'"):
        sw_search.resolve_share(auto, "other", tmp_path)
    with pytest.raises(UserError, match="--job-name"):
        sw_search.resolve_share(auto, None, tmp_path)
    with pytest.raises(UserError, match="--switch-at"):
        BspShare.parse("2")


def test_switch_at_auto_is_read_once_at_the_entry(tmp_path, monkeypatch):
    """The configuration reads no file; the job's entry (`cluster.parts.resolve`) reads the
    stored share once and the runner's plan uses it."""
    from shadowsync.cluster.parts import resolve
    from shadowsync.config import TrainConfig, config_to_toml

    monkeypatch.chdir(tmp_path)  # the default store is runs/switch-search under it
    cfg = TrainConfig(sync="switch", switch_at="auto", job_name="job", examples=1000)
    assert cfg.switch.at.share is None
    with pytest.raises(UserError, match="--switch-at auto"):
        cfg.switch.protocol_plan()
    sw_search.store(sw_search.SearchResult("job", 0.125, "ne", False, 0.01, 0.5, {}))
    got = resolve(cfg)
    assert str(got.switch.protocol_plan()) == "bsp:0.125,asp:0.875"
    assert 'at = "auto"' in config_to_toml(got)  # written as the user wrote it


def test_switch_cli_mistakes_are_one_line_errors(capsys, tmp_path):
    from shadowsync.cli import main

    assert main(["switch", "search"]) == 2
    assert main(["switch", "search", "--config", str(tmp_path / "none.toml")]) == 2
    assert main(["bench", "switch", "--no-ctr", "--no-digits"]) == 2
    assert main(["bench", "switch", "--slow-link", "0"]) == 2
    assert main(["switch", "search", "--config", "job.toml", "--search-probes", "1"]) == 2
    assert main(["bench", "switch", "--variants", "bsp,warp"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("shadowsync: error: switch search: --config JOB.toml is required")
    assert "no such file" in err[1]
    assert "leave nothing to run" in err[2]
    assert "--slow-link must be > 0" in err[3]
    assert "--search-probes must be >= 2" in err[4]
    assert err[5].startswith("shadowsync: error: --variants: warp not among bsp, ddp")
    assert main(["switch", "search", "--config", "job.toml", "--min-share", "0.005"]) == 2
    assert main(["switch", "search", "--config", "job.toml", "--seeds", "1"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert "--min-share in [0.01, 0.5]" in err[0]
    assert "needs --seeds >= 2 (or give --tolerance)" in err[1]


def test_switch_search_command_runs_the_job_per_share_and_stores_the_result(
        tmp_path, monkeypatch, capsys):
    """The command's glue, with the training itself stubbed: each point runs the TOML's job
    as --sync switch with the plan of that share and the seed, and the result lands under
    the file's stem, ready for --switch-at auto."""
    import shadowsync.switch_search
    from shadowsync.cli import main

    ran = []

    def fake_run(cfg):
        time.sleep(0.02)  # the search's own time is at least its runs'
        ran.append((cfg.sync.mode, str(cfg.switch.plan), cfg.seed, cfg.task,
                    cfg.cluster.trainers))
        share = cfg.switch.plan.share_of(Protocol.BSP)
        return cfg, {"eval_accuracy": 0.98 if share >= 0.25 else 0.90}

    monkeypatch.setattr(shadowsync.switch_search, "run", fake_run)
    job = tmp_path / "digits-job.toml"
    job.write_text('task = "digits"\ntrainers = 4\nlr = 0.1\n')
    store = tmp_path / "store"
    assert main(["switch", "search", "--config", str(job), "--seeds", "2", "--store",
                 str(store), "--out", str(tmp_path / "runs")]) == 0
    assert ran[:3] == [("switch", "bsp", 0, "digits", 4), ("switch", "bsp", 1, "digits", 4),
                       ("switch", "bsp:0.5,asp", 0, "digits", 4)]
    # 1, 0.5, 0.25 pass, 0.125 misses; 0.1875 and 0.21875 miss too: 6 points, 2 seeds each
    assert [plan for _, plan, seed, _, _ in ran if seed == 0] == [
        "bsp", "bsp:0.5,asp", "bsp:0.25,asp", "bsp:0.125,asp", "bsp:0.1875,asp",
        "bsp:0.21875,asp"]
    assert "chosen BSP share: 0.25" in capsys.readouterr().out
    assert sw_search.resolve_share(BspShare.parse("auto"), "digits-job", store).share == 0.25
    curve = json.loads((tmp_path / "runs" / "curve.json").read_text())  # beside the runs
    assert curve["bracket"] == [0.21875, 0.25] and (tmp_path / "runs" / "curve.png").exists()
    assert sw_search.load("digits-job", store).wall_s >= 0.02 * len(ran)  # its time is kept


def test_a_switch_back_to_bsp_holds_until_its_first_step():
    """Once workers are told to join a BSP step, an ASP gradient still in flight must not
    flip the decision back to ASP before that step is done, or the joiners would wait for
    workers told to stay in ASP."""

    class Flipping:  # wants BSP, then ASP again at once, as a flickering detector might
        stragglers: list = []
        isolated = ()

        def __init__(self):
            self.wants = iter(["asp", "bsp", "asp", "asp", "asp"])

        def first_mode(self):
            return "asp"

        def observe(self, trainer, compute_s):
            pass

        def decide(self, applied, bsp_applied):
            return next(self.wants, "asp") if bsp_applied == 0 else "asp"

    server = DenseServer()
    server.init_trained("w", torch.tensor([0.0]), "sgd",
                        SwitchMachine(workers=2, schedule=Flipping(), budget=100))
    assert server.push("w", torch.tensor([1.0]), push("asp")).wait().mode == "asp"
    r = server.push("w", torch.tensor([1.0]), push("asp")).wait()
    assert (r.mode, r.phase) == ("bsp", 1)
    late = server.push("w", torch.tensor([1.0]), push("asp")).wait()  # was in flight
    assert (late.mode, late.phase) == ("bsp", 1)  # still BSP: nobody is stranded
    a = server.push("w", torch.tensor([1.0]), push("bsp", phase=1, trainer=0))
    b = server.push("w", torch.tensor([1.0]), push("bsp", phase=1, trainer=1))
    assert a.wait().phase == b.wait().phase  # the step completed; both got the same answer


def test_a_slow_link_is_seen_by_the_servers_under_bsp_and_asp():
    """A trainer whose compute is as fast as the others' but whose gradients cross a slow
    link: its round trips, less what the server held its gradient for a BSP step, are long
    under BSP and ASP alike. The server tells each held gradient how long it held it
    (`held_s`: trainer 0 waits 50 ms for trainer 1, trainer 1 not at all), so what BSP makes
    the punctual trainer wait is not counted against it. The detector reads the link (the
    compute alone would hide it), greedy leaves BSP for it."""
    schedule = Schedule(SwitchPlan.parse("bsp:0.5,asp"), budget=10_000, policy="greedy",
                        detector=DetectorConfig.parse("k=1.5,m=2,window=2"))
    server = DenseServer()
    server.init_trained("w", torch.tensor([0.0]), "sgd", SwitchMachine(workers=2, schedule=schedule,
                        budget=10_000))

    def from_trainer(trainer, mode, compute_s=0.01, wait_s=0.0):
        return Push(mode, 0, 0, 0.1, 0.0, False, trainer, compute_s, wait_s)

    replies = []
    for _ in range(4):  # BSP: trainer 1's link adds 50 ms to its round trip
        first = server.push("w", torch.tensor([1.0]), from_trainer(0, "bsp", wait_s=0.005))
        time.sleep(0.05)
        replies.append(server.push("w", torch.tensor([1.0]),
                                   from_trainer(1, "bsp", wait_s=0.055)).wait())
        assert first.wait().held_s >= 0.05 and replies[-1].held_s < 0.05
    assert schedule.stragglers == [1]
    assert replies[-1].mode == "asp"  # greedy: ASP while the straggler lasts
    r = server.push("w", torch.tensor([1.0]), from_trainer(0, "asp")).wait()
    assert r.held_s == 0.0  # ASP: applied on arrival

    schedule = Schedule(SwitchPlan.parse("bsp:0.5,asp"), budget=10_000, policy="greedy",
                        detector=DetectorConfig.parse("k=1.5,m=2,window=2"))
    machine = server.trained["w"].machine
    for _ in range(4):  # ASP: the same compute, trainer 1's round trips 10x longer
        schedule.observe(0, machine.pace(0.01, 0.005))
        schedule.observe(1, machine.pace(0.01, 0.05))
    assert schedule.stragglers == [1]
