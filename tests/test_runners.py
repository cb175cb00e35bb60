"""The runner layer without processes: background pace, write-back, the foreground gate."""

import threading
import time

import pytest
import torch
import torch.multiprocessing as mp

from shadowsync.errors import UserError
from shadowsync.rules import make_rule
from shadowsync.runners.base import Runner, StepRunner
from shadowsync.runners.ddp import WorkerGroupHook, WorkerGroupRunner
from shadowsync.runners.foreground import StepGate
from shadowsync.runners.groups import ParamGroup, split_model
from shadowsync.runners.protocol import ProtocolRunner
from shadowsync.runners.rounds import GroupRunner
from shadowsync.runners.shadow import POLL_S, STALL_S, BackgroundSync, Pace, StepCounter
from shadowsync.spec.interval import SyncInterval


def test_fixed_pace_rests_what_is_left_of_the_interval():
    pace = Pace(SyncInterval(0.5), budget=0.03, cores=2)
    assert pace.rest_after(cpu_s=0.01, wall_s=0.2) == 0.3
    assert pace.rest_after(cpu_s=0.01, wall_s=0.9) == 0.0


def test_auto_pace_keeps_sync_within_its_cpu_budget():
    pace = Pace(SyncInterval(None), budget=0.05, cores=2)  # 0.1 cores
    # a round costing 10 ms of CPU may run every 100 ms: rest 100 ms minus its own wall time
    assert abs(pace.rest_after(cpu_s=0.01, wall_s=0.02) - 0.08) < 1e-12
    # the cost is smoothed: one slow round raises it by a fifth of the difference
    assert abs(pace.rest_after(cpu_s=0.06, wall_s=0.0) - 0.2) < 1e-12


def test_step_pace_waits_for_each_workers_steps_since_the_last_round_began():
    ctx = mp.get_context("spawn")
    pace = Pace(SyncInterval.parse("5steps"), budget=0.03, cores=2)
    counter = pace.worker_hook(ctx, workers=2)
    assert isinstance(counter, StepCounter) and pace.describe() == {"sync_interval": "5steps"}
    done = threading.Event()

    def steps(worker, n, every_s):
        counter.prepare(None, 0, worker)  # what each worker process does with its copy
        for _ in range(n):
            time.sleep(every_s)
            counter.counts[worker] += 1

    # 2 workers x 5 steps due: 6 each at 5 ms a step
    threads = [threading.Thread(target=steps, args=(w, 6, 0.005)) for w in (0, 1)]
    for t in threads:
        t.start()
    pace.rest(0.0, 0.0, done)
    seen = counter.total()
    for t in threads:
        t.join()
    assert 10 <= seen <= 12, seen
    # the next round is due 10 steps after `seen`: 2 more steps, then the workers stall
    t0 = time.perf_counter()
    steps(0, 2, 0.0)
    pace.rest(0.0, 0.0, done)
    assert STALL_S <= time.perf_counter() - t0 < STALL_S + 1.0
    done.set()  # the workers are done: no rest at all
    t0 = time.perf_counter()
    pace.rest(0.0, 0.0, done)
    assert time.perf_counter() - t0 < 0.05


def test_auto_pace_runs_a_round_at_least_every_share_of_the_pass():
    """MIN_ROUNDS = 40 and a pass of 400 steps a worker: a round at the latest 10 steps each
    after the last began, however long the CPU budget would rest; sooner if it rests less."""
    ctx = mp.get_context("spawn")
    pace = Pace(SyncInterval(None), budget=0.01, cores=1, min_rounds=40)
    counter = pace.worker_hook(ctx, workers=2)
    assert pace.describe()["sync_min_rounds"] == 40
    done = threading.Event()
    pace.rest(0.0, 0.0, done)  # before the workers say how long their pass is: budget alone
    for w in (0, 1):
        counter.prepare(None, 0, w, steps=400)

    def steps(worker, n):
        for _ in range(n):
            time.sleep(0.005)
            counter.counts[worker] += 1

    threads = [threading.Thread(target=steps, args=(w, 12)) for w in (0, 1)]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    pace.rest(cpu_s=1.0, wall_s=0.0, done=done)  # the budget alone: 100 s
    seen, waited = counter.total(), time.perf_counter() - t0
    for t in threads:
        t.join()
    assert 20 <= seen <= 24 and waited < 5, (seen, waited)
    # no step at all: the budget's rest (a 0.1 s round on the whole core: 0.1 s) ends it
    pace = Pace(SyncInterval(None), budget=1.0, cores=1, min_rounds=40)
    counter = pace.worker_hook(ctx, workers=1)
    counter.prepare(None, 0, 0, steps=400)
    t0 = time.perf_counter()
    pace.rest(cpu_s=0.1, wall_s=0.0, done=done)
    assert 0.09 <= time.perf_counter() - t0 < 1.0


class Looks(threading.Event):
    """A pace's `done` event that notes each rest between two looks at the step counts and
    ends the wait after `looks` of them; `steps` more steps are taken during the first."""

    def __init__(self, counter: StepCounter, looks: int = 1, steps: int = 0) -> None:
        super().__init__()
        self.counter, self.looks, self.steps = counter, looks, steps
        self.rests: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        if not self.rests:
            self.counter.counts[0] += self.steps
        self.rests.append(timeout)
        time.sleep(timeout)
        if len(self.rests) >= self.looks:
            self.set()
        return self.is_set()


def test_step_counter_rests_half_the_time_the_steps_left_take_at_the_pace_last_seen():
    counter = StepCounter(mp.get_context("spawn"), workers=2)
    # no pace seen yet: it looks every 4 x POLL_S[0] until a step comes
    done = Looks(counter, looks=2)
    counter.wait(5, done, timeout=1.0)
    assert done.rests == [4 * POLL_S[0]] * 2
    # a wait that saw steps keeps their pace: 20 steps in one rest of 4 x POLL_S[0] (or
    # longer, on a busy machine)
    t0 = time.perf_counter()
    counter.wait(5, Looks(counter, steps=20), timeout=1.0)
    assert 20 / (time.perf_counter() - t0) <= counter.rate <= 20 / (4 * POLL_S[0])
    # 2 workers x 5 steps due at 1,000 steps a second: the first look after 5 ms, not before
    counter.rate, counter._begun = 1000.0, counter.total()
    done = Looks(counter)
    counter.wait(5, done, timeout=1.0)
    assert done.rests == [pytest.approx(0.5 * 10 / 1000.0)]
    # the auto pace: due in 10 s at 1 step a second, a 50 ms budget rest is one look
    counter.rate, counter._begun = 1.0, counter.total()
    done = Looks(counter, looks=3)
    counter.wait(5, done, timeout=0.05)
    assert len(done.rests) == 1 and 0.03 < done.rests[0] <= 0.05


def test_sync_interval_reads_seconds_steps_and_auto():
    assert SyncInterval.parse("20steps").steps == 20
    assert SyncInterval.parse("0.25").seconds == 0.25
    assert SyncInterval.parse("auto") == SyncInterval(None)
    for bad in ("0steps", "-1", "fast"):
        with pytest.raises(UserError, match="--sync-interval"):
            SyncInterval.parse(bad)


class Fixed:
    """An Exchange whose mean is given."""

    def __init__(self, mean):
        self._mean = mean

    def mean(self, local):
        return self._mean.clone()


def test_write_back_delta_keeps_updates_made_during_the_round_overwrite_drops_them():
    class Racing(Fixed):
        def __init__(self, mean, param):
            super().__init__(mean)
            self.param = param

        def mean(self, local):  # a worker steps while the round is in flight
            self.param.add_(1.0)
            return super().mean(local)

    for mode, expected in (("delta", 5.0 + 1.0), ("overwrite", 5.0)):
        p = torch.tensor([1.0])
        group = ParamGroup("g", [p], make_rule("ma"), mode)
        group.sync_round(Racing(torch.tensor([5.0]), p))
        assert p.item() == expected, mode


def test_split_model_by_module_prefix():
    model = torch.nn.Sequential()
    model.add_module("bottom", torch.nn.Linear(2, 2))
    model.add_module("top", torch.nn.Linear(2, 1))
    groups = split_model(model, {"bottom": "bottom"})
    assert len(groups["bottom"]) == 2 and len(groups["*"]) == 2


def test_gate_holds_workers_until_the_round_is_released():
    ctx = mp.get_context("spawn")
    gate = StepGate(ctx, workers=2, every=1)
    waited = []

    def worker():
        waited.append(gate.step())
        gate.finish()

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    stop = threading.Event()
    assert gate.wait_for_round(stop) is False  # both arrived, both still training
    time.sleep(0.2)
    assert all(t.is_alive() for t in threads)  # held at the gate
    gate.release()
    for t in threads:
        t.join(timeout=5)
    assert len(waited) == 2 and min(waited) >= 0.15
    assert gate.wait_for_round(stop) is True  # nobody left


def test_step_runners_implement_the_runner_protocol_without_the_group_thread():
    for cls in (ProtocolRunner, WorkerGroupRunner):
        assert issubclass(cls, StepRunner) and not issubclass(cls, GroupRunner)
    assert issubclass(BackgroundSync, GroupRunner)
    # DDP's hook, never prepared: no worker joins its group here
    runner = WorkerGroupRunner(WorkerGroupHook("127.0.0.1", 1, "test", 1, 1), kind="ddp")
    assert isinstance(runner, Runner)
    background = BackgroundSync([], None, Pace(SyncInterval(0.1), 0.5, 1.0))  # type: ignore[arg-type]
    assert isinstance(background, Runner)
    runner.start()
    runner.stop()
    assert runner.state_dict() == {}
    assert runner.settings() == {"runner": "ddp", "period": 1, "groups": {}}
