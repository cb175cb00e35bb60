"""Dense parameter servers: named flat tensors sharded in contiguous pieces over D servers.

A `DenseServer` (one per server process) holds two kinds of state:
- plain tensors, such as the centre variable of elastic averaging (EASGD), created by the
  first trainer that asks (all trainers start from the same weights, so whichever arrives
  first is right) and updated by adding deltas under a lock per tensor;
- parameters trained on the server by the Sync-Switch protocols (Li, Mangoubi, Xu, Guo,
  ICDCS 2021, arXiv 2104.08364), with their optimizer state and a version. A worker pushes a
  gradient and gets the new parameters back. Under BSP the reply is a Future held until the
  n-th gradient of the step has arrived (`@rpc.functions.async_execution`), so BSP needs no
  separate barrier; under ASP the reply is immediate. Which one applies is named by each push,
  so a switch is only a change in what workers push: nothing restarts, nothing reloads.

Both optimizers are elementwise, so sharding a tensor changes nothing in its arithmetic.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed.rpc as rpc

from shadowsync.rules.asp import Asynchronous
from shadowsync.rules.bsp import BulkSynchronous
from shadowsync.rules.server_update import ServerState, apply_update, reset_momentum
from shadowsync.state_dicts import nest, part
from shadowsync.transport.layout import ClusterLayout

TRAINED = "trained/"  # checkpoint keys of parameters trained on the server


@dataclass(frozen=True)
class Push:
    """One worker's gradient and how the server should apply it."""

    mode: str  # "bsp" or "asp": the protocol the server's last reply named
    grad_version: int  # the version of the parameters the gradient was computed on
    phase: int  # index of the protocol phase the worker is in; a higher one starts a switch
    lr: float
    momentum: float
    reset_momentum: bool  # at the first push of a new phase: forget the old momentum
    trainer: int = 0
    compute_s: float = 0.0  # the worker's time from its previous reply to this push
    wait_s: float = 0.0  # the round trip of its previous push (the network and the server)


@dataclass
class Reply:
    params: torch.Tensor
    version: int
    staleness: int
    applied: int  # gradients applied so far (BSP: n per step), the job's global progress
    mode: str = "bsp"  # the protocol of the worker's next step
    phase: int = 0  # and its phase index (one more at every switch)
    done: bool = False  # the budget is spent: the worker stops
    taken: bool = True  # False: released unapplied by a stop of the job
    isolated: tuple[int, ...] = ()  # trainers whose next steps are ASP while the rest run BSP


@dataclass
class TrainedTensor:
    """Parameters trained on the server, with everything a protocol needs."""

    state: ServerState
    optimizer: str
    bsp: BulkSynchronous
    schedule: Any = None  # decides the next protocol (`runners.switch.schedule.Schedule`)
    budget: int = 0  # gradients the job applies in all; 0: no end known here
    applied: int = 0
    bsp_applied: int = 0
    phase: int = 0  # the phase whose pushes are being applied (momentum reset on entry)
    mode: str = "bsp"  # the decision: the protocol of the next step, and its phase
    decided_phase: int = 0
    bsp_at_switch: int = 0  # bsp_applied when the last switch was decided
    waiting: list[torch.futures.Future] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    switches: list[dict[str, Any]] = field(default_factory=list)
    stopped: bool = False  # the job was stopped: nothing more is applied
    step_first: float = 0.0  # when the current BSP step's first gradient arrived
    step_compute: float = 0.0  # the longest compute among the current BSP step's gradients
    clock: Any = time.perf_counter  # seconds; a test may script it
    isolated: tuple[int, ...] = ()  # `isolate`: trainers pushing ASP while the rest run BSP
    workers: int = 0  # every worker of the job (BSP's n with nobody isolated)

    @property
    def done(self) -> bool:
        return self.stopped or (self.budget > 0 and self.applied >= self.budget)

    # What a checkpoint keeps: parameters, optimizer state (momentum or Adagrad sums), version,
    # progress, the protocol decided and its phase, and the schedule's own state. The budget
    # and the schedule's settings come again from the workers of the resumed run.
    COUNTERS = ("applied", "bsp_applied", "phase", "decided_phase", "bsp_at_switch")

    def state_dict(self) -> dict[str, torch.Tensor]:
        with self.lock:
            out = {"params": self.state.params.clone(), "slot": self.state.slot.clone(),
                   "version": torch.tensor(self.state.version),
                   "asp": torch.tensor(int(self.mode == "asp"))}
            out.update({name: torch.tensor(getattr(self, name)) for name in self.COUNTERS})
            if self.schedule is not None:
                out.update(nest("schedule.", self.schedule.state_dict()))
            return out

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        with self.lock:
            with torch.no_grad():
                self.state.params.copy_(state["params"])
                self.state.slot.copy_(state["slot"])
            self.state.version = int(state["version"])
            self.mode = "asp" if int(state["asp"]) else "bsp"
            for name in self.COUNTERS:
                setattr(self, name, int(state[name]))
            if self.schedule is not None:
                self.schedule.load_state_dict(part(state, "schedule."))

    def reply(self, staleness: int, taken: bool = True) -> Reply:
        return Reply(self.state.params.clone(), self.state.version, staleness, self.applied,
                     self.mode, self.decided_phase, self.done, taken, self.isolated)


class DenseServer:
    def __init__(self, clock: Any = time.perf_counter) -> None:
        self.clock = clock
        self.tensors: dict[str, torch.Tensor] = {}
        self.locks: dict[str, threading.Lock] = {}
        self.trained: dict[str, TrainedTensor] = {}
        self._create = threading.Lock()
        self._restored: dict[str, dict[str, torch.Tensor]] = {}  # trained, from a checkpoint

    # -- plain tensors (the EASGD centre) --
    def init(self, key: str, value: torch.Tensor) -> None:
        with self._create:
            if key not in self.tensors:
                self.tensors[key] = value.clone()
                self.locks[key] = threading.Lock()

    def get(self, key: str) -> torch.Tensor:
        return self.tensors[key]

    def add(self, key: str, delta: torch.Tensor) -> None:
        with self.locks[key]:
            self.tensors[key].add_(delta)

    # -- checkpoints: the plain tensors (the EASGD centre) and the trained parameters --
    def state_dict(self) -> dict[str, torch.Tensor]:
        out = {key: value.clone() for key, value in self.tensors.items()}
        for key, t in list(self.trained.items()):
            out.update(nest(f"{TRAINED}{key}/", t.state_dict()))
        return out

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Before any trainer connects: `init` then keeps these values, and `init_trained`
        continues from the saved training state."""
        for key, value in state.items():
            if key.startswith(TRAINED):
                name, _, item = key.removeprefix(TRAINED).partition("/")
                self._restored.setdefault(name, {})[item] = value
            else:
                self.init(key, value)

    def rewind(self, gradients: int) -> None:
        """Resuming (before any trainer connects): the job's workers had taken `gradients`
        steps in all at the checkpoint, which may have been saved with a few more of their
        pushes applied (a save while training; positions trail by `state.LAG` steps). Those
        are pushed again: count progress from `gradients`, so the job still applies exactly
        its budget (and a BSP phase its share)."""
        for state in self._restored.values():
            extra = int(state["applied"]) - gradients
            if extra > 0:
                state["applied"] = torch.tensor(gradients)
                if not int(state["asp"]):
                    state["bsp_applied"] = torch.tensor(max(0, int(state["bsp_applied"]) - extra))

    # -- parameters trained by protocol --
    def init_trained(self, key: str, value: torch.Tensor, optimizer: str, workers: int,
                     schedule: Any = None, budget: int = 0) -> None:
        with self._create:
            if key not in self.trained:
                t = TrainedTensor(ServerState(value.clone()), optimizer,
                                  BulkSynchronous(workers), schedule, budget, clock=self.clock,
                                  workers=workers)
                if schedule is not None:
                    t.mode = schedule.first_mode()
                if key in self._restored:
                    t.load_state_dict(self._restored.pop(key))
                self.trained[key] = t

    def params(self, key: str) -> tuple[torch.Tensor, int, int]:
        """Parameters, version and gradients applied."""
        t = self.trained[key]
        with t.lock:
            return t.state.params.clone(), t.state.version, t.applied

    def mode(self, key: str) -> tuple[str, int]:
        """The protocol of the next step and its phase index."""
        t = self.trained[key]
        with t.lock:
            return t.mode, t.decided_phase

    def push(self, key: str, grad: torch.Tensor, push: Push) -> torch.futures.Future:
        """Apply or hold `grad`; the Future completes with a `Reply`.

        Once the budget is spent every push, and every BSP push still held, is answered at
        once with the final parameters: a worker that entered a BSP step nobody else will
        join (the others saw the end first) is never left waiting."""
        t = self.trained[key]
        fut: torch.futures.Future = torch.futures.Future()
        release: list[torch.futures.Future] = []
        with t.lock:
            if t.done:
                fut.set_result(t.reply(0, taken=not t.stopped))
                return fut
            if t.schedule is not None:
                t.schedule.observe(push.trainer, self._pace(t, push))
            if push.phase > t.phase:
                self._enter_phase(t, push)
            if push.mode == "asp":
                staleness = Asynchronous.staleness(t.state.version, push.grad_version)
                apply_update(t.state, grad, t.optimizer, push.lr, push.momentum)
                t.applied += 1
                self._first_step_done(t, push.phase, push.compute_s)
                self._decide(t)
                fut.set_result(t.reply(staleness))
                if t.done:
                    release, t.waiting = t.waiting, []
            elif push.mode == "bsp":
                t.waiting.append(fut)
                t.step_compute = max(t.step_compute, push.compute_s)
                mean = t.bsp.offer(grad)
                if mean is None:
                    return fut
                staleness = t.state.version - push.grad_version
                apply_update(t.state, mean, t.optimizer, push.lr, push.momentum)
                t.applied += t.bsp.workers
                t.bsp_applied += t.bsp.workers
                self._first_step_done(t, push.phase, t.step_compute)
                t.step_compute = 0.0
                self._decide(t)
                reply = t.reply(staleness)
                release, t.waiting = t.waiting, []
            else:
                raise ValueError(f"unknown protocol {push.mode!r}")
            final = t.reply(0)
        for f in release:
            f.set_result(reply if push.mode == "bsp" else final)
        return fut

    @staticmethod
    def _pace(t: TrainedTensor, push: Push) -> float:
        """A worker's step as the job feels it, for the straggler detector: its compute,
        plus, under ASP, its previous round trip, and under BSP (where every round trip holds
        the wait for the slowest) how late its gradient came after the step's first. A slow
        link to this server shows in the second part, slow compute in both."""
        if push.mode != "bsp":
            return push.compute_s + push.wait_s
        now = t.clock()
        if t.bsp.waiting == 0:  # the step's first gradient
            t.step_first = now
        return push.compute_s + (now - t.step_first)

    @staticmethod
    def _decide(t: TrainedTensor) -> None:
        """Between steps only: never while a BSP step is half collected, and not again after
        a switch to BSP until its first step is done (a worker already told to join it
        would otherwise wait for others told to stay in ASP)."""
        if t.schedule is None or t.bsp.waiting or t.done:
            return
        if t.mode == "bsp" and t.bsp_applied == t.bsp_at_switch and t.decided_phase > 0:
            return
        mode = t.schedule.decide(t.applied, t.bsp_applied)
        isolated = tuple(getattr(t.schedule, "isolated", ()))
        if mode != t.mode or isolated != t.isolated:
            t.bsp_at_switch = t.bsp_applied
            t.switches.append({"phase": t.decided_phase + 1, "from": t.mode, "to": mode,
                               "applied": t.applied, "wall_time": time.time(),
                               "decided_s": t.clock(), "stragglers": t.schedule.stragglers,
                               "isolated": list(isolated)})
            if isolated != t.isolated:  # BSP steps among the others (none half collected)
                per_trainer = getattr(t.schedule, "workers_per_trainer", 1)
                t.bsp = BulkSynchronous(t.workers - len(isolated) * per_trainer)
                t.isolated = isolated
            t.mode, t.decided_phase = mode, t.decided_phase + 1

    @staticmethod
    def _first_step_done(t: TrainedTensor, phase: int, compute_s: float) -> None:
        """The time a switch took the job, as the paper counts its overhead (summed into a
        share of the training time, "as low as 1.7%" with its checkpoint and restart): from
        the decision to the first step under the new protocol applied, less that step's own
        compute (training, not switching; the longest of a BSP step's gradients). What is
        left is the reply carrying the decision, a momentum reset, and into BSP the wait for
        the workers still finishing an ASP step. Every gradient of that step was computed
        after its worker heard the decision, so the difference is not negative."""
        entry = next((sw for sw in reversed(t.switches) if sw["phase"] == phase), None)
        if entry is None or "decided_s" not in entry or "switch_s" in entry:
            return
        entry["switch_s"] = t.clock() - entry["decided_s"] - compute_s

    @staticmethod
    def _enter_phase(t: TrainedTensor, push: Push) -> None:
        t0 = t.clock()
        t.phase = push.phase
        if push.reset_momentum:
            reset_momentum(t.state, t.optimizer)
        server_s = t.clock() - t0
        entry = next((sw for sw in t.switches if sw["phase"] == push.phase), None)
        if entry is None:  # decided elsewhere (a shard other than 0, or no schedule)
            entry = {"phase": push.phase, "to": push.mode, "wall_time": time.time()}
            t.switches.append(entry)
        entry.update(version=t.state.version, server_s=server_s)

    def switches(self, key: str) -> list[dict[str, Any]]:
        return list(self.trained[key].switches)

    def finish(self, key: str) -> None:
        """Stop the job: every push from now on, and every BSP push held, is answered as
        done and unapplied."""
        t = self.trained.get(key)
        if t is None:
            return
        with t.lock:
            t.stopped = True
            release, t.waiting = t.waiting, []
            reply = t.reply(0, taken=False)
        for f in release:
            f.set_result(reply)


# The server of this process; the RPC functions below run in dense-server processes.
SERVER = DenseServer()


def _init(key: str, value: torch.Tensor) -> None:
    SERVER.init(key, value)


def _get(key: str) -> torch.Tensor:
    return SERVER.get(key)


def _add(key: str, delta: torch.Tensor) -> None:
    SERVER.add(key, delta)


def _init_trained(key: str, value: torch.Tensor, optimizer: str, workers: int,
                  schedule: Any = None, budget: int = 0) -> None:
    SERVER.init_trained(key, value, optimizer, workers, schedule, budget)


def _mode(key: str) -> tuple[str, int]:
    return SERVER.mode(key)


def _params(key: str) -> tuple[torch.Tensor, int, int]:
    return SERVER.params(key)


def _switches(key: str) -> list[dict[str, Any]]:
    return SERVER.switches(key)


def _finish(key: str) -> None:
    SERVER.finish(key)


@rpc.functions.async_execution
def _push(key: str, grad: torch.Tensor, push: Push) -> torch.futures.Future:
    return SERVER.push(key, grad, push)


def shard_bounds(numel: int, servers: int) -> list[tuple[int, int]]:
    step = -(-numel // servers)
    return [(min(i * step, numel), min((i + 1) * step, numel)) for i in range(servers)]


class _Sharded:
    def __init__(self, key: str, servers: int, what: str) -> None:
        if servers < 1:
            raise ValueError(f"{what} needs at least one dense server (--dense-servers)")
        self.key = key
        self.servers = servers
        self.numel = 0

    def _pieces(self) -> list[tuple[str, int, int]]:
        return [(ClusterLayout.dense_name(s), lo, hi)
                for s, (lo, hi) in enumerate(shard_bounds(self.numel, self.servers)) if hi > lo]

    def _call_all(self, fn: Any, *args: Any, value: torch.Tensor | None = None) -> list[Any]:
        futs = [rpc.rpc_async(name, fn, args=(self.key, *((value[lo:hi],) if value is not None
                                                          else ()), *args))
                for name, lo, hi in self._pieces()]
        return torch.futures.wait_all(futs)


class DenseServerClient(_Sharded):
    """One named flat tensor spread over the dense servers (the EASGD centre)."""

    def __init__(self, key: str, servers: int) -> None:
        super().__init__(key, servers, "elastic averaging")

    def init(self, value: torch.Tensor) -> None:
        self.numel = value.numel()
        self._call_all(_init, value=value)

    def get(self) -> torch.Tensor:
        return torch.cat(self._call_all(_get))

    def add(self, delta: torch.Tensor) -> None:
        self._call_all(_add, value=delta)


class TrainedTensorClient(_Sharded):
    """A worker's handle on parameters trained on the dense servers by BSP / ASP."""

    def __init__(self, key: str, servers: int, numel: int) -> None:
        super().__init__(key, servers, "--sync bsp / asp / switch")
        self.numel = numel

    def init(self, value: torch.Tensor, optimizer: str, workers: int, schedule: Any = None,
             budget: int = 0) -> None:
        """Every worker may call it: the first call creates the parameters, the rest agree.
        Only shard 0's `schedule` decides; the others apply what the pushes name."""
        self._call_all(_init_trained, optimizer, workers, schedule, budget, value=value)

    def mode(self) -> tuple[str, int]:
        """The protocol of the next step and its phase index (decided on shard 0)."""
        return rpc.rpc_sync(ClusterLayout.dense_name(0), _mode, args=(self.key,))

    def push(self, grad: torch.Tensor, push: Push) -> Reply:
        """Send a gradient; the parameters after it was applied (under BSP: after the step)."""
        replies = self._call_all(_push, push, value=grad)
        first = replies[0]  # shard 0 decides the protocol
        return Reply(torch.cat([r.params for r in replies]), first.version,
                     max(r.staleness for r in replies), first.applied, first.mode,
                     first.phase, any(r.done for r in replies),
                     all(r.taken for r in replies), first.isolated)

    def params(self) -> tuple[torch.Tensor, int, int]:
        """The current parameters, their version and the gradients applied (first shard)."""
        got = self._call_all(_params)
        return torch.cat([g[0] for g in got]), got[0][1], got[0][2]

    def switches(self) -> list[dict[str, Any]]:
        return self._call_all(_switches)[0]

    def finish(self) -> None:
        """Stop the job on every server (see `DenseServer.finish`)."""
        self._call_all(_finish)
