"""The Sync-Switch state machine (`runners.switch.machine`) on plain numbers: no server, no
tensors, no processes. Phases, quotas, the hold after a switch into BSP, isolate, switch time,
pace and rewind, each against the closed form of its rule."""

import pytest

from shadowsync.protocols import Protocol
from shadowsync.runners.switch.detector import DetectorConfig
from shadowsync.runners.switch.machine import SwitchMachine
from shadowsync.runners.switch.schedule import Schedule
from shadowsync.spec.plan import SwitchPlan
from shadowsync.transport.servers.dense import SwitchDecisions

BSP, ASP = Protocol.BSP, Protocol.ASP


class Clock:
    def __init__(self, now=0.0):
        self.now = now

    def __call__(self):
        return self.now


class Verdict:
    """The straggler detector's verdict, set by the test."""

    stragglers: list = []

    def observe(self, trainer, step_s):
        pass


def machine(plan, budget, workers=2, policy="plan", trainers=None, **kw):
    schedule = Schedule(SwitchPlan.parse(plan), budget, policy, DetectorConfig(), 0.0,
                        trainers=trainers or workers)
    if policy != "plan":
        schedule.detector = Verdict()
    m = SwitchMachine(workers, budget, schedule, **kw)
    m.start()
    return m


def bsp_step(m, phase=None):
    m.bsp_step_applied(m.bsp_workers, m.decided_phase if phase is None else phase)
    m.decide(0)


def test_it_is_what_the_dense_server_drives():
    assert isinstance(SwitchMachine(workers=2), SwitchDecisions)


@pytest.mark.parametrize("share,budget,workers", [(0.25, 40, 2), (0.5, 60, 3), (0.1, 100, 5)])
def test_plan_phases_switch_at_the_share_of_the_budget(share, budget, workers):
    """`bsp:s,asp`: BSP steps of n gradients while A < round(s Q), then ASP; one switch."""
    m = machine(f"bsp:{share},asp", budget, workers)
    assert m.mode is BSP
    boundary = round(share * budget)
    while m.mode is BSP:
        bsp_step(m)
    # the first BSP step that reaches the boundary decides ASP (steps are n gradients)
    assert m.applied == -(-boundary // workers) * workers == m.bsp_applied
    assert (m.decided_phase, m.bsp_at_switch) == (1, m.bsp_applied)
    (sw,) = m.switches
    assert (sw["phase"], sw["from"], sw["to"], sw["applied"]) == (1, "bsp", "asp", m.applied)
    while not m.done:
        m.asp_applied(1, 0.0)
        m.decide(0)
    assert m.applied == budget and m.decided_phase == 1 and len(m.switches) == 1


def test_nothing_is_decided_while_a_bsp_step_is_half_collected_or_after_the_end():
    m = machine("asp:0.5,bsp", budget=4)
    m.asp_applied(0, 0.0)
    m.asp_applied(0, 0.0)  # A = 2 = the boundary: BSP from now on ...
    m.decide(bsp_waiting=1)  # ... but not while a BSP gradient is held
    assert m.mode is ASP and m.decided_phase == 0
    m.decide(0)
    assert m.mode is BSP and m.decided_phase == 1
    m.stopped = True
    assert m.done
    m.schedule.plan = SwitchPlan.parse("asp")  # would switch back if asked
    m.decide(0)
    assert m.mode is BSP


def test_greedy_spends_the_bsp_quota_around_a_straggler_and_holds_after_a_switch_into_bsp():
    """mode = ASP if a straggler or B >= Q else BSP, with Q = round(s Q_budget); B counts only
    BSP gradients, so the quota is met in full however the straggler splits it."""
    m = machine("bsp:0.5,asp", budget=40, policy="greedy")
    quota = 20
    bsp_step(m)
    m.schedule.detector.stragglers = [1]
    bsp_step(m)  # B = 4: greedy leaves BSP for the straggler
    assert m.mode is ASP and m.bsp_applied == 4
    for _ in range(6):
        m.asp_applied(1, 0.0)
        m.decide(0)
    m.schedule.detector.stragglers = []
    m.asp_applied(1, 0.0)
    m.decide(0)
    assert m.mode is BSP and m.decided_phase == 2 and m.bsp_at_switch == 4
    # an ASP gradient still in flight must not flip it back before the first BSP step is done
    m.schedule.detector.stragglers = [1]
    m.asp_applied(1, 0.0)
    m.decide(0)
    assert m.mode is BSP and m.decided_phase == 2
    m.schedule.detector.stragglers = []
    while m.mode is BSP:
        bsp_step(m, phase=2)
    assert m.bsp_applied == quota and m.mode is ASP and m.decided_phase == 3
    assert [sw["to"] for sw in m.switches] == ["asp", "bsp", "asp"]


def test_isolate_takes_the_stragglers_workers_out_of_bsp_steps():
    """A BSP step averages n - k w gradients while k trainers of w workers are isolated; a
    change in who is isolated is a switch (a new phase) with the protocol unchanged."""
    m = machine("bsp:0.5,asp", budget=400, workers=6, policy="isolate", trainers=3,
                workers_per_trainer=2)
    assert m.bsp_workers == 6 and m.trainers == 3
    m.schedule.detector.stragglers = [2]
    bsp_step(m)
    assert m.isolated == (2,) and m.bsp_workers == 4 and m.mode is BSP
    assert m.decided_phase == 1 and m.switches[-1]["isolated"] == [2]
    bsp_step(m)  # a 4-gradient step
    assert m.bsp_applied == 6 + 4
    m.schedule.detector.stragglers = []
    m.asp_applied(1, 0.0)  # the isolated trainer's push: the members are computing, no change
    m.decide(0)
    assert m.isolated == (2,) and m.decided_phase == 1
    bsp_step(m)
    assert m.isolated == () and m.bsp_workers == 6 and m.decided_phase == 2
    m.schedule.detector.stragglers = [0, 1, 2]  # everyone: no BSP step could form
    bsp_step(m)
    assert m.isolated == () and m.bsp_workers == 6


class IsolateJob:
    """A job of `trainers` trainers of one worker under `isolate`, with the real detector
    (k 2, m 3, windows of 5), driven in rounds the way the dense server drives its machine:
    each round every trainer due pushes once, in trainer order. A member's gradient is held
    until its BSP step is complete (and hears the decision then); an isolated trainer's is
    applied on arrival. Trainer 2 takes `slowdown` x the others' time on its own steps
    `slow` (1-based), and while it is isolated and slow it pushes every `slowdown`-th round
    (under BSP the members wait for it)."""

    def __init__(self, plan, budget, slow, slowdown=3, trainers=3):
        self.cfg = DetectorConfig(k=2.0, m=3, window=5)
        sched = Schedule(SwitchPlan.parse(plan), budget, "isolate", self.cfg, trainers=trainers)
        self.m = SwitchMachine(trainers, budget, sched)
        self.m.start()
        self.trainers, self.slow, self.slowdown = range(trainers), slow, slowdown
        self.steps = [0] * trainers  # each trainer's pushes
        self.heard = [()] * trainers  # the isolated trainers, as each last heard
        self.held = []  # the BSP step being collected: its members' ids
        self.step_of_2 = []  # trainer 2's pushes at each switch decided

    def push(self, t):
        m = self.m
        self.steps[t] += 1
        pace = self.slowdown if t == 2 and self.steps[t] in self.slow else 1.0
        m.observe(t, pace, 0.0)
        switches = len(m.switches)
        if t in self.heard[t] or m.mode is ASP:
            m.asp_applied(m.decided_phase, pace)
            m.decide(len(self.held))
            self.heard[t] = m.isolated
        else:
            self.held.append(t)
            m.bsp_gradient(pace)
            if len(self.held) == self.trainers.stop - len(self.heard[self.held[0]]):
                m.bsp_step_applied(len(self.held), m.decided_phase)
                m.decide(0)
                for member in self.held:
                    self.heard[member] = m.isolated
                self.held = []
        self.step_of_2 += [self.steps[2]] * (len(m.switches) - switches)

    def run(self):
        for r in range(10**6):
            for t in self.trainers:
                if self.m.done:
                    return self
                slowed = 2 in self.heard[2] and self.steps[2] + 1 in self.slow
                if t != 2 or not slowed or r % self.slowdown == 0:
                    self.push(t)
        return self

    def phases(self):
        return [(sw["to"], sw["isolated"]) for sw in self.m.switches]


def cleared_at(e, m, w):
    """The step at which the detector clears a trainer whose last slow step is `e` (see
    `isolate`: the window holding step e + 1 closes at c0, slow if it holds more slow steps
    than normal ones, then m normal windows)."""
    c0 = w * -(-(e + 1) // w)
    return c0 + m * w if e - (c0 - w) > w / 2 else c0 + (m - 1) * w


@pytest.mark.parametrize("end", range(50, 55))  # every alignment of the end in a window
def test_isolate_releases_a_recovered_trainer_within_its_stated_bound(end):
    """Trainer 2 3x slower over its steps 21..end: isolated when its third slow window closes
    (step 35), cleared at `cleared_at` and released by the members' next BSP step, within
    (m + 1) w + 1 of its steps after the end; its isolated pushes count toward the plan's
    phases, which keep their switch point."""
    from shadowsync.runners.switch.isolate import release_bound

    job = IsolateJob("bsp:0.9,asp", budget=900, slow=range(21, end + 1)).run()
    cfg, m = job.cfg, job.m
    assert job.phases() == [("bsp", [2]), ("bsp", []), ("asp", [])]
    assert job.step_of_2[0] == 35  # windows 21-25, 26-30, 31-35 slow: m of them
    cleared = cleared_at(end, cfg.m, cfg.window)
    # decided by the members' step under way as its next one is: that one is still ASP
    assert job.step_of_2[1] == cleared
    assert cleared + 1 - end <= release_bound(cfg.m, cfg.window) == 21
    assert 810 <= m.switches[2]["applied"] < 810 + 3  # round(0.9 x 900), within a step
    assert m.applied == 900


@pytest.mark.parametrize("end", [30, 60, 100, 10**6])  # too short to flag, early, late, never
def test_isolate_keeps_the_plans_asp_phase_however_late_the_release(end):
    """The plan's switch to ASP comes at round(s Q) gradients applied, within one BSP step,
    whether the straggler is released early, late or never. Counted under BSP only, a quota
    of 810 is out of reach of a straggler isolated to the end at a third of the pace."""
    job = IsolateJob("bsp:0.9,asp", budget=900, slow=range(21, end + 1)).run()
    m = job.m
    released = [("bsp", [2]), ("bsp", []), ("asp", [])]
    expected = {30: [("asp", [])], 60: released, 100: released,
                10**6: [("bsp", [2]), ("asp", [])]}[end]
    assert job.phases() == expected
    assert 810 <= m.switches[-1]["applied"] < 810 + 3 and m.mode is ASP
    assert m.applied == 900 and m.isolated == ()
    if end == 10**6:
        assert m.bsp_applied < 810  # the straggler's isolated pushes took part of the phase


def test_switch_time_is_decision_to_first_new_step_less_its_pace():
    """switch_s = max(0, t_applied - t_decided - pace), pace = compute + link (a BSP step's:
    its longest)."""
    clock = Clock(10.0)
    m = machine("bsp:0.5,asp", budget=8, clock=clock)
    bsp_step(m)
    bsp_step(m)  # A = 4: ASP decided at t = 10
    assert m.switches[0]["decided_s"] == 10.0
    clock.now = 10.0 + 0.04 + 0.25 + 0.01
    m.enter_phase(1, ASP, version=2, server_s=0.001)
    m.asp_applied(1, SwitchMachine.pace(0.25, 0.01))
    assert m.switches[0]["switch_s"] == pytest.approx(0.04)
    assert (m.switches[0]["version"], m.switches[0]["server_s"]) == (2, 0.001)
    clock.now += 1.0
    m.asp_applied(1, 0.1)  # a later step does not move it
    assert m.switches[0]["switch_s"] == pytest.approx(0.04)

    clock = Clock(0.0)
    m = machine("asp:0.25,bsp", budget=8, clock=clock)
    m.asp_applied(0, 0.0)
    m.asp_applied(0, 0.0)
    m.decide(0)  # BSP decided at t = 0
    clock.now = 0.5
    m.bsp_gradient(SwitchMachine.pace(0.3, 0.05))
    m.bsp_gradient(SwitchMachine.pace(0.2, 0.02))
    m.bsp_step_applied(2, phase=1)
    assert m.switches[0]["switch_s"] == pytest.approx(0.5 - 0.35)
    assert m.step_pace == 0.0  # the next step starts its own maximum

    # a step whose link came back faster than the previous round trip's: 0, not less
    clock = Clock(0.0)
    m = machine("asp:0.25,bsp", budget=8, clock=clock)
    m.asp_applied(0, 0.0)
    m.asp_applied(0, 0.0)
    m.decide(0)
    clock.now = 0.3
    m.bsp_gradient(SwitchMachine.pace(0.28, 0.05))
    m.bsp_step_applied(2, phase=1)
    assert m.switches[0]["switch_s"] == 0.0


def test_pace_is_compute_plus_the_link_part_of_the_round_trip_under_either_protocol():
    """pace = compute + (round trip - time held for the BSP step), whatever the protocol:
    the push carries the second term as `wait_s`."""
    assert SwitchMachine.pace(0.1, 0.02) == pytest.approx(0.12)
    assert SwitchMachine.pace(0.1, 0.0) == pytest.approx(0.1)


def test_a_phase_decided_elsewhere_gets_its_entry_on_arrival():
    m = SwitchMachine(workers=2, wall=lambda: 123.0)  # a shard with no schedule
    m.enter_phase(1, ASP, version=7, server_s=0.002)
    assert m.phase == 1
    assert m.switches == [{"phase": 1, "to": "asp", "wall_time": 123.0, "version": 7,
                           "server_s": 0.002}]


@pytest.mark.parametrize("mode,applied,bsp_applied,gradients,expected", [
    (BSP, 20, 14, 16, (16, 10)),  # 4 extra under BSP: B = max(0, 14 - 4)
    (BSP, 20, 2, 16, (16, 0)),  # never below zero
    (ASP, 20, 14, 16, (16, 14)),  # the extra were ASP pushes: B stays
    (BSP, 20, 14, 30, (20, 14)),  # never forward
])
def test_rewind_counts_progress_from_the_positions(mode, applied, bsp_applied, gradients,
                                                   expected):
    m = SwitchMachine(workers=2, mode=mode, applied=applied, bsp_applied=bsp_applied)
    m.rewind(gradients)
    assert (m.applied, m.bsp_applied) == expected


def test_state_round_trips_through_a_checkpoint():
    m = machine("bsp:0.5,asp", budget=8)
    for _ in range(3):
        bsp_step(m)
    state = m.state_dict()
    assert state["asp"] == 1 and state["applied"] == 6 and state["decided_phase"] == 1
    other = machine("bsp:0.5,asp", budget=8)
    other.load_state_dict(state)
    assert (other.mode, other.applied, other.bsp_applied, other.decided_phase,
            other.bsp_at_switch) == (ASP, 6, 6, 1, 4)
