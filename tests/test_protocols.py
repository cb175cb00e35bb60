"""Sync-Switch's server protocols against closed forms, on plain tensors and a DenseServer
object (no processes): BSP, ASP, staleness, switching, and the policies that drive them."""

import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shadowsync.errors import UserError
from shadowsync.rules import BulkSynchronous
from shadowsync.rules.server_update import ServerState, apply_update
from shadowsync.runners.switch.configure import RAMP_STEPS, step_settings
from shadowsync.runners.switch.machine import SwitchMachine
from shadowsync.spec.plan import SwitchPlan
from shadowsync.transport.servers.dense import DenseServer, Push


def bsp(lr, momentum=0.0, phase=0, version=0, reset=False, trainer=0):
    return Push("bsp", version, phase, lr, momentum, reset, trainer)


def asp(lr, version, momentum=0.0, phase=0, reset=False):
    return Push("asp", version, phase, lr, momentum, reset)


def test_bsp_rule_returns_the_mean_once_all_have_arrived():
    rule = BulkSynchronous.of_trainers(3)
    assert rule.offer(torch.tensor([1.0]), 0) is None
    assert rule.offer(torch.tensor([2.0]), 2) is None
    assert torch.equal(rule.offer(torch.tensor([6.0]), 1), torch.tensor([3.0]))
    assert rule.waiting == 0  # the next step starts empty
    assert rule.offer(torch.tensor([5.0]), 1) is None


def test_a_bsp_step_is_formed_by_trainer_id_not_by_the_count_of_pushes():
    """Trainers 0..3 of 2 workers each, trainer 2 isolated: the step is trainers 0, 1 and 3's
    six gradients; a gradient from trainer 2, or a third from trainer 0, is refused."""
    rule = BulkSynchronous.of_trainers(4, per_trainer=2, isolated=(2,))
    assert rule.workers == 6 and sorted(rule.members) == [0, 1, 3]
    with pytest.raises(ValueError, match="trainer 2, which is not a member"):
        rule.offer(torch.tensor([1.0]), 2)
    rule.offer(torch.tensor([1.0]), 0), rule.offer(torch.tensor([1.0]), 0)
    with pytest.raises(ValueError, match="trainer 0, which is done"):
        rule.offer(torch.tensor([1.0]), 0)
    for t in (1, 1, 3):
        assert rule.offer(torch.tensor([4.0]), t) is None
    assert torch.equal(rule.offer(torch.tensor([4.0]), 3), torch.tensor([3.0]))


def test_bsp_server_holds_every_reply_until_the_nth_gradient():
    server = DenseServer()
    w0 = torch.tensor([1.0, -2.0])
    server.init_trained("w", w0, "sgd", SwitchMachine(workers=3))
    grads = [torch.tensor([1.0, 0.0]), torch.tensor([2.0, 3.0]), torch.tensor([0.0, 3.0])]
    futs = [server.push("w", g, bsp(0.5, trainer=i)) for i, g in enumerate(grads[:2])]
    assert not any(f.done() for f in futs)
    futs.append(server.push("w", grads[2], bsp(0.5, trainer=2)))
    expected = w0 - 0.5 * torch.stack(grads).mean(0)
    for f in futs:
        reply = f.wait()
        assert torch.allclose(reply.params, expected) and reply.version == 1
        assert reply.staleness == 0


def test_bsp_with_momentum_matches_heavy_ball_by_hand():
    server = DenseServer()
    server.init_trained("w", torch.tensor([0.0]), "sgd", SwitchMachine(workers=2))
    lr, m = 0.1, 0.9
    for g in ([1.0, 3.0], [2.0, 2.0]):  # step means 2 then 2
        futs = [server.push("w", torch.tensor([x]), bsp(lr, m, trainer=i))
                for i, x in enumerate(g)]
    # v1 = 2, w1 = -0.2; v2 = 0.9 * 2 + 2 = 3.8, w2 = -0.2 - 0.38
    assert futs[0].wait().params.item() == pytest.approx(-0.58)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.floats(0.01, 1.0),
       st.lists(st.floats(-10, 10), min_size=6, max_size=6))
def test_asp_at_lr_over_n_equals_one_bsp_step(n, lr, values):
    """Linear scaling: n gradients applied one by one at L / n move the parameters as their
    mean does in one step at L (plain SGD, the same gradients)."""
    grads = [torch.tensor([v], dtype=torch.float64) for v in values[:n]]
    w0 = torch.tensor([0.5], dtype=torch.float64)
    a = DenseServer()
    a.init_trained("w", w0, "sgd", SwitchMachine(workers=n))
    for i, g in enumerate(grads):
        a.push("w", g, asp(lr / n, version=i))
    b = DenseServer()
    b.init_trained("w", w0, "sgd", SwitchMachine(workers=n))
    for i, g in enumerate(grads):
        fut = b.push("w", g, bsp(lr, trainer=i))
    assert torch.allclose(a.params("w")[0], fut.wait().params)
    assert a.params("w")[1] == n and b.params("w")[1] == 1


def test_asp_staleness_is_versions_applied_in_between():
    server = DenseServer()
    server.init_trained("w", torch.zeros(2), "sgd", SwitchMachine(workers=3))
    r1 = server.push("w", torch.ones(2), asp(0.1, version=0)).wait()
    r2 = server.push("w", torch.ones(2), asp(0.1, version=0)).wait()
    r3 = server.push("w", torch.ones(2), asp(0.1, version=0)).wait()
    assert [r1.staleness, r2.staleness, r3.staleness] == [0, 1, 2]
    assert r3.version == 3 and torch.allclose(r3.params, torch.full((2,), -0.3))


def test_adagrad_server_step_closed_form():
    state = ServerState(torch.tensor([1.0, 1.0]))
    apply_update(state, torch.tensor([2.0, -0.5]), "adagrad", lr=0.1)
    # s = g^2, w -= lr * g / |g| = lr * sign(g)
    assert torch.allclose(state.params, torch.tensor([0.9, 1.1]))
    assert torch.allclose(state.slot, torch.tensor([4.0, 0.25]))


def test_switch_keeps_state_and_resets_momentum_only_when_asked():
    for reset in (False, True):
        server = DenseServer()
        server.init_trained("w", torch.tensor([0.0]), "sgd", SwitchMachine(workers=1))
        server.push("w", torch.tensor([1.0]), bsp(1.0, momentum=0.5)).wait()  # v = 1, w = -1
        r = server.push("w", torch.tensor([1.0]),
                        asp(1.0, version=1, momentum=0.5, phase=1, reset=reset)).wait()
        # kept: v = 0.5 + 1, w = -2.5; reset: v = 1, w = -2
        assert r.params.item() == (-2.0 if reset else -2.5)
        assert r.version == 2  # the version carries over the switch
        (sw,) = server.switches("w")
        assert sw["phase"] == 1 and sw["to"] == "asp" and sw["version"] == 1
        assert sw["server_s"] < 0.01


def test_step_settings_scale_lr_and_handle_momentum():
    s = step_settings("bsp", 0.4, 4, 0.9, "keep", 0, after_switch=False)
    assert (s.lr, s.momentum, s.reset_momentum) == (0.4, 0.9, False)
    s = step_settings("asp", 0.4, 4, 0.9, "keep", 0, after_switch=True)
    assert (s.lr, s.momentum, s.reset_momentum) == (0.1, 0.9, False)
    assert step_settings("asp", 0.4, 4, 0.9, "keep", 0, True, scale_lr=False).lr == 0.4
    zero = [step_settings("asp", 0.4, 4, 0.9, "zero", k, True) for k in (0, 1)]
    assert [z.reset_momentum for z in zero] == [True, False] and zero[1].momentum == 0.9
    ramp = [step_settings("asp", 0.4, 4, 0.9, "ramp", k, True)
            for k in (0, RAMP_STEPS // 2, RAMP_STEPS, 5 * RAMP_STEPS)]
    assert [r.momentum for r in ramp] == pytest.approx([0.0, 0.45, 0.9, 0.9])
    assert [r.reset_momentum for r in ramp] == [True, False, False, False]


def test_plan_phases_and_boundaries():
    plan = SwitchPlan.parse("bsp:0.1,asp")
    assert [(p.mode, p.share) for p in plan.phases] == [("bsp", 0.1), ("asp", pytest.approx(0.9))]
    assert plan.boundaries(200) == [20]
    assert [plan.phase_at(k, 200) for k in (0, 19, 20, 199)] == [0, 0, 1, 1]
    three = SwitchPlan.parse("asp:0.25, bsp:0.5, asp:0.25")
    assert three.boundaries(8) == [2, 6] and three.share_of("asp") == 0.5


@pytest.mark.parametrize("text, message", [
    ("", "empty plan"),
    ("bsp:0.1,ssp", "'ssp' is not a protocol"),
    ("bsp,asp:0.5", "only the last phase may omit"),
    ("bsp:1.5", "must be in"),
    ("bsp:0.5,asp:0.2", "must add up to 1"),
    ("bsp:x,asp", "must be in"),
])
def test_bad_plans_name_the_option(text, message):
    with pytest.raises(UserError, match=f"--switch-plan: .*{message}"):
        SwitchPlan.parse(text)


class InProcessClient:
    """The TrainedTensorClient interface over a DenseServer in this process (no RPC); the
    pushes numbered in `slow` take `slow_s` longer (a worker's first push after a switch
    waiting for the others, say)."""

    def __init__(self, server, slow=(), slow_s=0.0):
        self.server, self.slow, self.slow_s, self.pushes = server, slow, slow_s, 0

    def push(self, grad, push):
        if self.pushes in self.slow:
            time.sleep(self.slow_s)
        self.pushes += 1
        return self.server.push("dense", grad, push).wait()


def test_worker_hook_follows_global_progress_through_a_switch():
    from shadowsync.runners.protocol import ProtocolHook, ProtocolSettings

    settings = ProtocolSettings(SwitchPlan.parse("bsp:0.5,asp"), servers=1, numel=1,
                                optimizer="sgd", lr=1.0, momentum=0.5, momentum_policy="zero",
                                workers=1, scale_lr=True)
    hook = ProtocolHook(settings)
    server = DenseServer()
    server.init_trained("dense", torch.tensor([0.0]), "sgd", SwitchMachine(workers=1,
                        schedule=settings.schedule(4), budget=4))
    # the first push under ASP (the third) takes 50 ms more than the two BSP ones before it
    hook.client, hook.budget = InProcessClient(server, slow=(2,), slow_s=0.05), 4
    hook.mode, hook.next_phase = server.mode("dense")
    param = [torch.zeros(1)]
    outs = [hook.push(torch.tensor([1.0]), param).item() for _ in range(4)]
    # BSP: v = 1, w = -1; v = 1.5, w = -2.5. Switch with momentum zeroed: v = 1, w = -3.5;
    # v = 1.5, w = -5.0
    assert outs == [-1.0, -2.5, -3.5, -5.0]
    assert hook.finished()
    sw = hook.report()["switches"]
    assert [(s["from"], s["to"], s["step"], s["applied"]) for s in sw] == [("bsp", "asp", 2, 2)]
    # the switch's latency: its first push under ASP less a typical push before it
    assert sw[0]["first_push_s"] >= 0.05 > sw[0]["push_s_before"]
    assert sw[0]["cost_s"] == pytest.approx(sw[0]["first_push_s"] - sw[0]["push_s_before"])
    assert sw[0]["cost_s"] >= 0.05 - sw[0]["push_s_before"]
    assert hook.where() == " under ASP"


class Clock:
    """A scripted clock for the server: `now` seconds, moved by hand."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_the_time_a_switch_takes_the_job_is_decision_to_first_new_step_less_its_compute():
    """Two workers, BSP for 2 of 6 gradients, then ASP, then (`asp:..,bsp`) the other way.
    The switch's time is from the decision to the first step under the new protocol applied,
    less that step's pace (compute and the link part of the worker's previous round trip,
    `wait_s`): here the 30 ms a late worker took."""
    from shadowsync.runners.switch.schedule import Schedule

    clock = Clock()
    server = DenseServer()
    plan = SwitchPlan.parse("bsp:0.34,asp")
    server.init_trained("w", torch.tensor([0.0]), "sgd", SwitchMachine(
        workers=2, schedule=Schedule(plan, budget=6), budget=6, clock=clock))
    g = torch.tensor([1.0])
    server.push("w", g, Push("bsp", 0, 0, 0.1, 0.0, False, 0, 0.01))
    clock.now = 100.01
    server.push("w", g, Push("bsp", 0, 0, 0.1, 0.0, False, 1, 0.01)).wait()  # decided: ASP
    (sw,) = server.switches("w")
    assert (sw["from"], sw["to"], sw["decided_s"]) == ("bsp", "asp", 100.01)
    clock.now = 100.01 + 0.03 + 0.2 + 0.01  # 30 ms of switching, a step of 200 ms + 10 ms
    server.push("w", g, Push("asp", 1, 1, 0.05, 0.0, False, 0, 0.2, 0.01)).wait()
    assert server.switches("w")[0]["switch_s"] == pytest.approx(0.03)
    clock.now += 0.5  # a later step does not move it
    server.push("w", g, Push("asp", 1, 1, 0.05, 0.0, False, 1, 0.1)).wait()
    assert server.switches("w")[0]["switch_s"] == pytest.approx(0.03)

    # Into BSP: the first BSP step is applied when its last gradient arrives; its compute is
    # the longer of the two (worker 0's 0.3 s). Worker 1 first finished an ASP step (0.15 s)
    # then computed 0.2 s: the step came 0.05 s later than its longest compute alone.
    clock = Clock()
    server = DenseServer()
    plan = SwitchPlan.parse("asp:0.25,bsp")
    server.init_trained("w", torch.tensor([0.0]), "sgd", SwitchMachine(
        workers=2, schedule=Schedule(plan, budget=8), budget=8, clock=clock))
    server.push("w", g, Push("asp", 0, 0, 0.05, 0.0, False, 0, 0.1)).wait()
    clock.now = 100.05
    r = server.push("w", g, Push("asp", 0, 0, 0.05, 0.0, False, 1, 0.1)).wait()
    assert r.mode == "bsp"  # decided at 100.05
    clock.now = 100.05 + 0.3
    first = server.push("w", g, Push("bsp", 2, 1, 0.1, 0.0, False, 0, 0.3))
    clock.now = 100.05 + 0.15 + 0.2
    server.push("w", g, Push("bsp", 2, 1, 0.1, 0.0, False, 1, 0.2)).wait()
    assert first.done()
    assert server.switches("w")[0]["switch_s"] == pytest.approx(0.05)


def test_switch_overhead_is_the_summed_switch_time_over_the_run():
    from shadowsync.runners.switch.overhead import switch_overhead

    o = switch_overhead([{"switch_s": 0.03, "cost_s": 0.0}, {"switch_s": 0.12, "cost_s": 0.1},
                         {"cost_s": 0.2}], train_s=30.0)
    assert o["switch_s_total"] == pytest.approx(0.15)
    assert o["share_of_run"] == pytest.approx(0.005)
    assert o["latency_s"] == [0.0, 0.1, 0.2] and o["switches"] == 3


def test_a_slow_link_delays_each_push_both_ways_inside_its_round_trip_by_the_jobs_progress():
    """The hook asks the link for each push's delay with the job's progress (the servers'
    count against the budget) and sleeps half of it before the push leaves and half after
    the reply is back, inside the push's round trip, where the server and the detector see a
    slow link (`wait_s` of the next push)."""
    from shadowsync.runners.protocol import ProtocolHook, ProtocolSettings
    from shadowsync.spec.delay import LinkDelay

    asked = []

    class Link(LinkDelay):
        def request_s(self, trainer, at, rng=None):
            asked.append((trainer, at))
            return super().request_s(trainer, at, rng)

    settings = ProtocolSettings(SwitchPlan.single("asp"), servers=1, numel=1, optimizer="sgd",
                                lr=0.1, momentum=0.0, momentum_policy="keep", workers=1,
                                scale_lr=True)
    hook = ProtocolHook(settings)
    hook.link = Link((0,), ms=40.0, start=0.5, duration=0.25)  # half to three quarters
    server = DenseServer()
    server.init_trained("dense", torch.tensor([0.0]), "sgd", SwitchMachine(workers=1,
                        schedule=settings.schedule(4), budget=4))
    arrived = []

    class Recording(InProcessClient):
        def push(self, grad, push):
            arrived.append(time.perf_counter())
            return super().push(grad, push)

    hook.client, hook.budget = Recording(server), 4
    hook.mode, hook.next_phase = server.mode("dense")
    took, sent = [], []
    for _ in range(4):
        sent.append(time.perf_counter())
        hook.push(torch.tensor([1.0]), [torch.zeros(1)])
        took.append(hook._last_took)
    assert asked == [(0, 0.0), (0, 0.25), (0, 0.5), (0, 0.75)]
    assert took[2] >= 0.04  # only the push at half the job was delayed, 20 ms each way
    assert arrived[2] - sent[2] >= 0.02  # the request waited its half on the way out
    assert took[2] - (arrived[2] - sent[2]) >= 0.02  # and the reply the other half


def test_the_straggling_trainers_embedding_round_trips_cross_its_delayed_link():
    """`wrap_tables`: the delayed trainer's embedding client waits half the link's delay
    before each blocking exchange and half after it; another trainer's is not wrapped."""
    from shadowsync.runners.protocol import ProtocolHook, ProtocolSettings
    from shadowsync.spec.delay import LinkDelay
    from shadowsync.transport.delay import DelayedTables

    class Tables:
        def __init__(self):
            self.calls = []

        def lookup(self, ids):
            self.calls.append(("lookup", time.perf_counter()))
            return ids

        def update_and_lookup(self, ids, grads, next_ids, lr_scale=1.0):
            self.calls.append(("update", time.perf_counter()))
            return next_ids

    settings = ProtocolSettings(SwitchPlan.single("asp"), servers=1, numel=1, optimizer="sgd",
                                lr=0.1, momentum=0.0, momentum_policy="keep", workers=2,
                                scale_lr=True)
    hooks = [ProtocolHook(settings), ProtocolHook(settings)]
    for trainer, hook in enumerate(hooks):
        hook.trainer, hook.budget = trainer, 100
        hook.link = LinkDelay((1,), ms=60.0, of_job=False)
    plain = Tables()
    assert hooks[0].wrap_tables(plain) is plain
    tables = Tables()
    delayed = hooks[1].wrap_tables(tables)
    ids, nothing = torch.zeros(4, 2, dtype=torch.long), torch.zeros(4, 0, dtype=torch.long)
    t0 = time.perf_counter()
    assert delayed.update_and_lookup(ids, None, ids) is ids
    t1 = time.perf_counter()
    assert tables.calls[0][1] - t0 >= 0.03 and t1 - tables.calls[0][1] >= 0.03
    assert delayed.lookup(ids) is ids and time.perf_counter() - t1 >= 0.06
    assert delayed.calls is tables.calls  # the rest is the wrapped client's
    asked = []  # no categorical features: nothing crosses the link, no delay is asked for
    quiet = DelayedTables(tables, lambda: asked.append(1) or 0.0)
    quiet.update_and_lookup(nothing, None, nothing), quiet.lookup(nothing)
    assert asked == []
    quiet.lookup(ids)
    assert asked == [1]


def test_a_slow_link_under_asp_reaches_the_detector_through_the_pushes_wait():
    """Two trainers under ASP, the same compute; trainer 1's link adds 60 ms to each round
    trip. Nothing is fed by hand: each worker's hook sends its previous round trip as the
    next push's `wait_s`, the server's machine adds it to the compute, and the detector
    (windows of 3, m = 2) flags trainer 1 after its 6 pushes. Trainer 0 computes 5 ms a step
    so its pace is not zero; 60 ms is over 1.5x it even if a busy machine triples that."""
    from shadowsync.runners.protocol import ProtocolHook, ProtocolSettings
    from shadowsync.runners.switch.detector import DetectorConfig
    from shadowsync.spec.delay import LinkDelay

    settings = ProtocolSettings(SwitchPlan.single("asp"), servers=1, numel=1, optimizer="sgd",
                                lr=0.1, momentum=0.0, momentum_policy="keep", workers=2,
                                scale_lr=True, policy="greedy",
                                detector=DetectorConfig(k=1.5, m=2, window=3))
    machine = settings.machine(budget=1000)
    server = DenseServer()
    server.init_trained("dense", torch.tensor([0.0]), "sgd", machine)
    hooks = []
    for trainer in (0, 1):
        hook = ProtocolHook(settings)
        hook.trainer, hook.budget, hook.client = trainer, 1000, InProcessClient(server)
        hook.mode, hook.next_phase = server.mode("dense")
        hooks.append(hook)
    hooks[1].link = LinkDelay((1,), ms=60.0, of_job=False)
    for _ in range(6):
        time.sleep(0.005)
        hooks[0].push(torch.tensor([1.0]), [torch.zeros(1)])
    for _ in range(6):
        hooks[1].push(torch.tensor([1.0]), [torch.zeros(1)])
    assert machine.schedule.stragglers == [1]
