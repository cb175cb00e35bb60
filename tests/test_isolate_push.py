"""`isolate` at the level of a worker's push (`runners.protocol.ProtocolHook.push`) against
two dense shards in this process: which protocol each trainer's worker pushes, at what rate,
with what momentum, and that the shard that does not decide follows shard 0. Closed forms on
one number per shard; the members' BSP pushes block, so they run in threads."""

import threading
import time

import pytest
import torch

from shadowsync.runners.protocol import ProtocolHook, ProtocolSettings
from shadowsync.runners.switch.detector import StragglerDetector
from shadowsync.spec.detector import DetectorConfig
from shadowsync.spec.plan import SwitchPlan
from shadowsync.transport.servers.dense import DenseServer, joined

LR, MOMENTUM, TRAINERS = 0.3, 0.5, 3
SETTINGS = ProtocolSettings(SwitchPlan.parse("bsp:0.5,asp"), servers=2, numel=2, optimizer="sgd",
                            lr=LR, momentum=MOMENTUM, momentum_policy="keep", workers=TRAINERS,
                            scale_lr=True, policy="isolate")


class Verdict:
    """The straggler detector's verdict, set by the test."""

    stragglers: list = []

    def observe(self, trainer, step_s):
        pass

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


class TwoShards:
    """What `TrainedTensorClient` does over RPC: a push goes to both shards, one element
    each, and their replies are joined; every push is recorded. `rpc_s`: what the network
    adds to each round trip, half each way."""

    def __init__(self, shards, rpc_s=0.0):
        self.shards = shards
        self.rpc_s = rpc_s
        self.pushes = []

    def push(self, grad, push):
        self.pushes.append(push)
        time.sleep(self.rpc_s / 2)
        futs = [s.push("dense", grad[i:i + 1], push) for i, s in enumerate(self.shards)]
        reply = joined([f.wait() for f in futs])
        time.sleep(self.rpc_s / 2)
        return reply


def cluster(detector=None, rpc_s=0.0, budget=100):
    """Three trainers' hooks on two shards, a BSP quota of half the budget of gradients;
    `detector`: the real one (else the test's verdict)."""
    machine, shards = two_shards(detector or Verdict(), budget)
    hooks = []
    for t in range(TRAINERS):
        hook = ProtocolHook(SETTINGS)
        hook.trainer, hook.budget, hook.client = t, budget, TwoShards(shards, rpc_s)
        hook.mode, hook.next_phase = shards[0].mode("dense")
        hook.phase = hook.next_phase
        hooks.append(hook)
    return machine, shards, hooks


def two_shards(detector, budget=100, saved=()):
    """Shard 0 with the deciding machine, shard 1 with its follower; `saved`: each shard's
    checkpoint to resume from."""
    machine = SETTINGS.machine(budget=budget)
    machine.schedule.detector = detector
    shards = [DenseServer(), DenseServer()]
    for shard, state in zip(shards, saved, strict=False):
        shard.load_state_dict(state)
    shards[0].init_trained("dense", torch.zeros(1), "sgd", machine)
    shards[1].init_trained("dense", torch.zeros(1), "sgd", machine.follower())
    return machine, shards


def push(hook, g):
    return hook.push(torch.full((2,), float(g)), [torch.zeros(2)])


def run_together(calls):
    """Each call in a thread of its own (a BSP step's pushes block until it is complete);
    their results, in order. A call still blocked after 10 s waited for a non-member."""
    out = {}
    threads = [threading.Thread(target=lambda i=i, c=c: out.__setitem__(i, c()), daemon=True)
               for i, c in enumerate(calls)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=10)
    assert len(out) == len(calls), "the BSP step waited for a trainer that is not a member"
    return [out[i] for i in range(len(calls))]


def bsp_step(hooks, grads):
    """Each hook pushes in a thread; the step must complete without anyone else."""
    replies = run_together([lambda h=h, g=g: push(h, g) for h, g in zip(hooks, grads,
                                                                         strict=True)])
    return {h.trainer: r for h, r in zip(hooks, replies, strict=True)}


def test_each_trainers_worker_pushes_its_mode_rate_and_momentum_under_isolate():
    """Step 1: BSP of 3 (mean of 1, 2, 3 = 2: v = 2, w = -0.6); trainer 2 is flagged and
    isolated at that step's end. Step 2: trainers 0 and 1 push BSP at L = 0.3 naming trainer 2
    isolated, and their step averages their 2 gradients (mean 2: v = 0.5 x 2 + 2 = 3,
    w = -1.5). Trainer 2 pushes ASP at L / n = 0.1 a gradient of 4 computed before that step
    (staleness 1), into a momentum buffer of its own (v' = 4, w = -1.9; with the BSP buffer
    it would be -2.05). Step 3 of the members (mean 1): v = 0.5 x 3 + 1 = 2.5, w = -2.65.
    Both shards hold the same number throughout: shard 1 follows shard 0's decision."""
    machine, shards, hooks = cluster()
    Verdict.stragglers = [2]
    step1 = bsp_step(hooks, [1, 2, 3])
    assert {t: r.tolist() for t, r in step1.items()} == {t: [pytest.approx(-0.6)] * 2
                                                         for t in range(3)}
    assert [h.mode for h in hooks] == ["bsp", "bsp", "asp"]

    step2 = bsp_step(hooks[:2], [1, 3])
    assert step2[0].tolist() == [pytest.approx(-1.5)] * 2
    member = hooks[0].client.pushes[-1]
    assert (member.mode, member.lr, member.isolated) == ("bsp", LR, (2,))

    straggler = push(hooks[2], 4)
    sent = hooks[2].client.pushes[-1]
    assert (sent.mode, sent.lr, sent.momentum, sent.isolated) == (
        "asp", pytest.approx(LR / TRAINERS), MOMENTUM, (2,))
    assert straggler.tolist() == [pytest.approx(-1.9)] * 2
    assert hooks[2].report()["staleness"] == {0: 1, 1: 1}  # step 1 fresh, this push 1 stale

    step3 = bsp_step(hooks[:2], [1, 1])
    assert step3[1].tolist() == [pytest.approx(-2.65)] * 2
    assert [s.trained["dense"].machine.bsp_applied for s in shards] == [3 + 2 + 2] * 2
    assert [s.trained["dense"].machine.applied for s in shards] == [3 + 2 + 1 + 2] * 2


def test_a_cleared_trainer_rejoins_the_bsp_steps_with_its_buffer_dropped():
    """Trainer 2 isolated, then cleared: the decision is taken at the members' next step end
    (not at trainer 2's own ASP push), trainer 2 hears it at its next push and joins the
    following step, which waits for all three again."""
    machine, shards, hooks = cluster()
    Verdict.stragglers = [2]
    bsp_step(hooks, [1, 1, 1])
    push(hooks[2], 1)
    Verdict.stragglers = []
    push(hooks[2], 1)  # its own push decides nothing: the members may be computing
    assert machine.isolated == (2,) and hooks[2].mode == "asp"
    bsp_step(hooks[:2], [1, 1])  # decided here
    assert machine.isolated == () and hooks[0].mode == "bsp"
    push(hooks[2], 1)  # in flight when it was cleared: still applied as ASP
    assert hooks[2].mode == "bsp" and hooks[2].isolated == ()
    bsp_step(hooks, [1, 1, 1])
    assert [2 in s.trained["dense"].own_momentum for s in shards] == [False, False]
    assert {tuple(h.client.pushes[-1].isolated) for h in hooks} == {()}


def test_a_recovered_isolated_trainer_is_judged_like_the_members_and_taken_back():
    """The real detector (k = 1.5, m = 2, windows of 3) on a network that adds 10 ms to every
    round trip. Trainer 2 computes 40 ms a step, the members 5 ms: it is flagged and isolated.
    Then it computes 5 ms too, pushing ASP in a thread of its own while the members run their
    BSP steps: its pace (compute + round trip) is the members' (compute + round trip less
    what the server held their gradient for the step), so it is cleared and rejoins BSP.
    A pace that counted the round trip under ASP only would keep it at about 3x the members'
    and never clear it."""
    machine, shards, hooks = cluster(StragglerDetector(DetectorConfig(k=1.5, m=2, window=3)),
                                     rpc_s=0.01, budget=10_000)
    members, straggler = hooks[:2], hooks[2]

    def computing(hook, seconds):
        return lambda: (time.sleep(seconds), push(hook, 1))

    for _ in range(30):  # BSP of all three, trainer 2 slow
        run_together([computing(h, 0.04 if h is straggler else 0.005) for h in hooks])
        if machine.isolated:
            break
    assert machine.isolated == (2,) and straggler.mode == "asp"

    def recovered():
        while straggler.mode == "asp":
            computing(straggler, 0.005)()

    thread = threading.Thread(target=recovered, daemon=True)
    thread.start()
    for _ in range(60):  # the members' steps, trainer 2 at their pace beside them
        run_together([computing(h, 0.005) for h in members])
        if not machine.isolated:
            break
    assert machine.isolated == () and machine.mode == "bsp"  # cleared, the quota not spent
    thread.join(timeout=10)
    assert not thread.is_alive() and straggler.mode == "bsp"
    run_together([computing(h, 0.005) for h in hooks])  # one step of all three again
    assert {h.client.pushes[-1].mode for h in hooks} == {"bsp"}


def test_a_checkpoint_keeps_who_is_isolated_and_their_own_momentum():
    """Saved after trainer 2's first isolated push (its buffer v' = 4, w = -1.9, as in the
    first test) and resumed: shard 0 still isolates trainer 2 and tells a resumed worker so
    (shard 1 follows what pushes name), and its next ASP push of 2 continues its own buffer
    on every shard: v' = 0.5 x 4 + 2 = 4, w = -1.9 - 0.1 x 4 = -2.3 (a fresh buffer would
    give -2.1, the BSP one -2.25)."""
    machine, shards, hooks = cluster()
    Verdict.stragglers = [2]
    bsp_step(hooks, [1, 2, 3])
    bsp_step(hooks[:2], [1, 3])
    push(hooks[2], 4)
    saved = [s.state_dict() for s in shards]
    resumed, again = two_shards(Verdict(), saved=saved)
    assert resumed.isolated == (2,) and again[0].isolated("dense") == (2,)  # shard 1 follows
    for s in again:
        assert s.trained["dense"].own_momentum[2].tolist() == [pytest.approx(4.0)]
    reply = joined([s.push("dense", torch.tensor([2.0]), hooks[2].client.pushes[-1]).wait()
                    for s in again])
    assert reply.params.tolist() == [pytest.approx(-2.3)] * 2
