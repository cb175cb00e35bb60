"""Sync-Switch's online timing policies against their definitions (`runners.switch.greedy`,
`elastic`, `detector`), on scripted step times and a scripted clock: no processes, no
timing. Greedy and elastic must behave differently where the definitions say they do."""

import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shadowsync.runners.switch.detector import DetectorConfig, StragglerDetector
from shadowsync.runners.switch.policy import Progress
from shadowsync.runners.switch.schedule import Schedule
from shadowsync.spec.plan import SwitchPlan


def modes_under(policy, slow_steps, steps, patience_s=100.0, tick_s=1.0, schedule=None):
    """Two trainers, one step each per tick of a clock at `tick_s` a step; trainer 1 is 3x
    slower on `slow_steps`. The default detector (k 1.5, m 3, windows of 5 steps); a BSP quota
    the job never reaches. The protocol the server decides after each step."""
    s = schedule or Schedule(SwitchPlan.parse("bsp:0.9,asp"), budget=10**6, policy=policy,
                             patience_s=patience_s)
    modes, bsp = [], 0
    for step in range(steps):
        for t in (0, 1):
            s.observe(t, 0.03 if t == 1 and step in slow_steps else 0.01)
        mode = s.decide(2 * step, bsp, now=step * tick_s)
        bsp += 2 if mode == "bsp" else 0
        modes.append(mode)
    return modes


def asp_steps(modes):
    return [i for i, m in enumerate(modes) if m == "asp"]


def test_a_short_false_alarm_moves_greedy_and_not_elastic():
    """Trainer 1 slow for steps 20..44 (its windows 4..8): flagged when its third slow window
    closes (step 34), cleared when its third normal one does (step 59). That is 25 s, under
    elastic's 100 s patience: greedy runs ASP for steps 34..58 (two switches), elastic never
    leaves BSP."""
    blip = range(20, 45)
    assert asp_steps(modes_under("greedy", blip, 120)) == list(range(34, 59))
    assert asp_steps(modes_under("elastic", blip, 120)) == []


def test_elastic_leaves_bsp_once_a_straggler_lasts_and_returns_when_it_ends():
    """Trainer 1 slow for steps 20..219: flagged at step 34, cleared at step 234. Greedy runs
    ASP over all of it; elastic from step 134 (flagged 100 s, its patience) to 233, then BSP
    again: the quota is not done, so the job goes back for it."""
    lasting = range(20, 220)
    greedy = modes_under("greedy", lasting, 300)
    elastic = modes_under("elastic", lasting, 300)
    assert asp_steps(greedy) == list(range(34, 234))
    assert asp_steps(elastic) == list(range(134, 234))
    assert elastic[234:] == ["bsp"] * (300 - 234)
    # with no patience the two are the same policy
    assert modes_under("elastic", lasting, 300, patience_s=0.0) == greedy


def test_at_their_defaults_elastic_ignores_a_false_alarm_shorter_than_its_patience():
    """The same two trainers, a BSP step every 1/128 s by a clock (exact in binary), both
    policies at their defaults. Elastic's derived patience (its docstring's rule): t = 1/128 s,
    the median interval between the BSP steps it was asked after; a = the share of slow
    windows of the trainer not flagged; m w t = 15 t times n = ceil(ln 0.01 / ln 3a), over
    2 C / (1 - 1/k). A 25-step alarm is under it: greedy leaves BSP for it, elastic does not.
    A lasting straggler: elastic leaves BSP once it has been flagged for the patience, after
    greedy."""
    from shadowsync.runners.switch.elastic import derived_patience_s

    tick = 2.0**-7

    def default(policy):
        return Schedule(SwitchPlan.parse("bsp:0.9,asp"), budget=10**6, policy=policy)

    blip = range(20, 45)
    assert asp_steps(modes_under("greedy", blip, 120, tick_s=tick,
                                 schedule=default("greedy"))) == list(range(34, 59))
    elastic = default("elastic")
    assert asp_steps(modes_under("elastic", blip, 120, tick_s=tick, schedule=elastic)) == []

    elastic = default("elastic")
    modes = modes_under("elastic", range(20, 400), 400, tick_s=tick, schedule=elastic)
    patience = elastic.policy.patience_s
    normal = elastic.detector.tracks[0]  # trainer 1 is flagged
    assert elastic.detector.stragglers == [1]
    assert patience == pytest.approx(derived_patience_s(
        tick, normal.slow_windows / normal.windows, 1.5, 3, 5))
    assert 25 * tick < patience < 100 * tick  # over the blip's alarm, under the straggler
    first = asp_steps(modes)[0]
    assert first == 34 + math.ceil(patience / tick - 1e-9)
    assert asp_steps(modes_under("greedy", range(20, 400), 400, tick_s=tick,
                                 schedule=default("greedy")))[0] == 34


def test_elastics_step_time_is_the_bsp_steps_not_the_trainers_pace():
    """Paces of 10 ms (what the detector sees of each trainer) while a BSP step takes 40 ms
    by the clock (it waits for the slowest, and for the server): the patience counts m w
    steps of 40 ms, the time a flagged trainer needs to be cleared under BSP."""
    from shadowsync.runners.switch.elastic import derived_patience_s

    elastic = Schedule(SwitchPlan.parse("bsp:0.9,asp"), budget=10**6, policy="elastic")
    modes_under("elastic", range(20, 400), 60, tick_s=0.04, schedule=elastic)
    normal = elastic.detector.tracks[0]
    assert elastic.policy.patience_s == pytest.approx(derived_patience_s(
        0.04, normal.slow_windows / normal.windows, 1.5, 3, 5))


def test_an_alarm_keeps_the_patience_it_was_raised_with():
    """The derived patience moves with the job (here: 1 s at the alarm, then 5 s); the alarm
    raised at 0 s is left for ASP at 1 s and stays there, where a patience read afresh would
    flip it back to BSP. The next alarm takes the patience of its own start."""
    from shadowsync.runners.switch.elastic import Elastic

    class Moving(Elastic):
        now_patience = 1.0

        @property
        def patience_s(self):
            return self.now_patience

    e = Moving(quota=10**6)
    assert e.mode(Progress(0, 0, (1,), 0.0)) == "bsp"
    e.now_patience = 5.0
    assert [e.mode(Progress(0, 0, (1,), t)) for t in (0.5, 1.0, 2.0, 3.0)] == ["bsp"] + ["asp"] * 3
    assert e.mode(Progress(0, 0, (), 4.0)) == "bsp"
    assert [e.mode(Progress(0, 0, (1,), t)) for t in (5.0, 8.0, 10.0)] == ["bsp", "bsp", "asp"]


def test_the_derived_patience_is_its_rule():
    """Closed forms: the false-alarm term at the floor (a = 1%, m = 3: n = 2), with a higher
    rate (a = 10%: 3a = 0.3, n = ceil(3.82) = 4), and the switch-cost term when switches are
    the paper's restarts (C = 180 s, k = 1.5: 2 x 180 / (1/3) = 1080 s)."""
    from shadowsync.runners.switch.elastic import derived_patience_s

    assert derived_patience_s(0.01, 0.0, 1.5, 3, 5) == pytest.approx(0.30)
    assert derived_patience_s(0.01, 0.10, 1.5, 3, 5) == pytest.approx(0.60)
    assert derived_patience_s(0.01, 0.0, 1.5, 3, 5, switch_s=180.0) == pytest.approx(1080.0)


def stragglers_by_definition(cfg, feed):
    """The rule as stated in `detector`, recomputed from the whole history at each step: at
    the close of each of its windows (every `window` of its observations), a trainer's
    verdict is 'slow' when the window's median is over k x the median of the other trainers'
    latest closed-window medians (no verdict while no other has closed one). A trainer is a
    straggler once its last m verdicts are all slow, and stops being one once its last m are
    all not slow."""
    history = {}  # trainer -> its observations so far
    paces = {}  # trainer -> medians of its closed windows
    verdicts = {}  # trainer -> its verdicts
    state = {}
    after = []
    for trainer, x in feed:
        history.setdefault(trainer, []).append(x)
        obs = history[trainer]
        if len(obs) % cfg.window == 0:
            paces.setdefault(trainer, []).append(statistics.median(obs[-cfg.window:]))
            others = [p[-1] for i, p in paces.items() if i != trainer]
            if others:
                v = verdicts.setdefault(trainer, [])
                v.append(paces[trainer][-1] > cfg.k * statistics.median(others))
                last = v[-cfg.m:]
                if len(last) == cfg.m and all(last):
                    state[trainer] = True
                elif len(last) == cfg.m and not any(last):
                    state[trainer] = False
        after.append(sorted(i for i, s in state.items() if s))
    return after


@settings(max_examples=60, deadline=None)
@given(trainers=st.integers(2, 4), k=st.sampled_from([1.5, 2.0]), m=st.integers(1, 3),
       window=st.integers(1, 5),
       paces=st.lists(st.sampled_from([0.01, 0.012, 0.015, 0.016, 0.02, 0.03, 0.05]),
                      min_size=40, max_size=160))
def test_the_detector_is_its_stated_rule(trainers, k, m, window, paces):
    """Any sequence of step times, round robin over the trainers: the detector flags exactly
    whom the rule flags, after every observation. Step times include 1.5x and 2x exactly, so
    'over k x', not 'at least', is checked."""
    cfg = DetectorConfig(k, m, window)
    feed = [(i % trainers, x) for i, x in enumerate(paces)]
    det = StragglerDetector(cfg)
    seen = []
    for trainer, x in feed:
        det.observe(trainer, x)
        seen.append(det.stragglers)
    assert seen == stragglers_by_definition(cfg, feed)


def test_at_exactly_k_times_the_others_a_trainer_is_not_a_straggler():
    at_k = StragglerDetector(DetectorConfig(k=1.5, m=1, window=1))
    over = StragglerDetector(DetectorConfig(k=1.5, m=1, window=1))
    for _ in range(3):
        at_k.observe(0, 0.01), at_k.observe(1, 0.015)
        over.observe(0, 0.01), over.observe(1, 0.0151)
    assert at_k.stragglers == [] and over.stragglers == [1]


def test_isolate_names_the_stragglers_during_the_plans_bsp_phases():
    """mode = the plan's phase at A (every gradient applied); isolated = the stragglers while
    that is BSP. `bsp:0.25,asp:0.5,bsp` over 400 gradients: BSP below 100, ASP below 300."""
    from shadowsync.runners.switch.isolate import Isolate

    p = Isolate(SwitchPlan.parse("bsp:0.25,asp:0.5,bsp"), budget=400, trainers=4)

    def at(applied, stragglers=()):
        return Progress(applied, 0, stragglers, 0.0)

    assert p.isolated(at(10, (2,))) == (2,) and p.mode(at(10)) == "bsp"
    assert p.isolated(at(100, (2,))) == () and p.mode(at(100)) == "asp"  # the plan's switch
    assert p.isolated(at(300, (3, 1))) == (1, 3) and p.mode(at(300)) == "bsp"  # next BSP
    assert p.isolated(at(10, (0, 1, 2, 3))) == ()  # nobody left to run BSP with
    assert p.release(DetectorConfig(m=3, window=5)) == 21  # (m + 1) w + 1


def test_an_isolated_trainer_pushes_asp_while_the_others_keep_bsp_among_themselves():
    """Three trainers. Step 1: BSP of 3 (mean of 1, 2, 3 at lr 0.3). Trainer 2 is isolated:
    its gradient 4 is applied on arrival at lr 0.1, the others' steps average 2 gradients.
    When it recovers, BSP steps take all 3 again."""
    import torch

    from shadowsync.runners.switch.machine import SwitchMachine
    from shadowsync.transport.servers.dense import DenseServer, Push

    class Scripted:  # the policy's decisions, set by the test
        stragglers: list = []
        workers_per_trainer = 1
        isolated: tuple = ()

        def first_mode(self):
            return "bsp"

        def observe(self, trainer, pace):
            pass

        def decide(self, applied, bsp_applied):
            return "bsp"

    sched = Scripted()
    server = DenseServer()
    server.init_trained("w", torch.tensor([0.0]), "sgd", SwitchMachine(workers=3, schedule=sched,
                        budget=100))

    def push(trainer, g, mode, phase, version, lr, isolated=()):
        return server.push("w", torch.tensor([float(g)]), Push(
            mode, version, phase, lr, 0.0, False, trainer, isolated=isolated))

    a, _ = push(0, 1, "bsp", 0, 0, 0.3), push(1, 2, "bsp", 0, 0, 0.3)
    sched.isolated = (2,)  # decided when this step completes
    r = push(2, 3, "bsp", 0, 0, 0.3).wait()
    assert a.wait().params.item() == pytest.approx(-0.6)
    assert (r.mode, r.phase, r.isolated) == ("bsp", 1, (2,))
    iso = push(2, 4, "asp", 1, 1, 0.1, (2,)).wait()  # applied at once, nobody waits for it
    assert iso.params.item() == pytest.approx(-1.0) and iso.version == 2
    a = push(0, 1, "bsp", 1, 1, 0.3, (2,))
    assert not a.done()
    sched.isolated = ()  # recovered: decided when the others' step completes
    r = push(1, 3, "bsp", 1, 1, 0.3, (2,)).wait()
    assert r.params.item() == pytest.approx(-1.6)  # mean of 2 gradients: 2 x 0.3
    assert (r.phase, r.isolated, r.staleness) == (2, (), 1)
    assert server.trained["w"].machine.bsp_applied == 5
    steps = [push(t, g, "bsp", 2, 3, 0.3) for t, g in ((0, 1), (1, 1))]
    assert not any(f.done() for f in steps)  # the step waits for trainer 2 again
    r = push(2, 4, "bsp", 2, 3, 0.3).wait()
    assert r.params.item() == pytest.approx(-1.6 - 0.6) and r.version == 4
    assert server.trained["w"].machine.bsp_applied == 8 and server.trained["w"].machine.applied == 9
    assert [(w["to"], w["isolated"]) for w in server.switches("w")] == [
        ("bsp", [2]), ("bsp", [])]
