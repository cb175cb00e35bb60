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
  What the next step's protocol is, and the progress, phases and switch log behind it, is the
  Sync-Switch state machine's (`runners.switch.machine`, built by the trainers' runner and
  sent with `init_trained`); this server stores, applies, holds and replies.
- `isolate`: only shard 0's machine decides who is isolated (the other shards get followers,
  `SwitchMachine.follower`); each push names the isolated trainers its worker heard from
  shard 0, and every shard forms a BSP step from the other trainers, by trainer id, when the
  step's first gradient arrives. An isolated trainer's pushes are ASP, applied on arrival
  with their staleness and a momentum buffer of that trainer's own, dropped when it pushes
  BSP again. A checkpoint keeps who is isolated and their buffers; a resumed worker asks
  shard 0 who is isolated (`isolated`) before its first push.

Both optimizers are elementwise, so sharding a tensor changes nothing in its arithmetic.
"""

from __future__ import annotations

import threading
import typing
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.distributed.rpc as rpc

from shadowsync.protocols import Protocol
from shadowsync.rules.asp import Asynchronous
from shadowsync.rules.bsp import BulkSynchronous
from shadowsync.rules.server_update import ServerState, apply_update, reset_momentum
from shadowsync.state_dicts import nest
from shadowsync.transport.layout import ClusterLayout

TRAINED = "trained/"  # checkpoint keys of parameters trained on the server
OWN_MOMENTUM = "own_momentum/"  # and of an isolated trainer's momentum buffer, by trainer


@dataclass(frozen=True)
class Push:
    """One worker's gradient and how the server should apply it."""

    mode: Protocol  # the protocol the server's last reply named
    grad_version: int  # the version of the parameters the gradient was computed on
    phase: int  # index of the protocol phase the worker is in; a higher one starts a switch
    lr: float
    momentum: float
    reset_momentum: bool  # at the first push of a new phase: forget the old momentum
    trainer: int = 0
    compute_s: float = 0.0  # the worker's time from its previous reply to this push
    # the round trip of its previous push less what the server held it for its BSP step:
    # the link and the server's work, the same under BSP and ASP (`Reply.held_s`)
    wait_s: float = 0.0
    isolated: tuple[int, ...] = ()  # the isolated trainers, as shard 0 last told this worker

    @property
    def from_isolated(self) -> bool:
        return self.trainer in self.isolated


@dataclass
class Reply:
    params: torch.Tensor
    version: int
    staleness: int
    applied: int  # gradients applied so far (BSP: n per step), the job's global progress
    mode: Protocol = Protocol.BSP  # the protocol of the worker's next step
    phase: int = 0  # and its phase index (one more at every switch)
    done: bool = False  # the budget is spent: the worker stops
    taken: bool = True  # False: released unapplied by a stop of the job
    isolated: tuple[int, ...] = ()  # trainers whose next steps are ASP while the rest run BSP
    held_s: float = 0.0  # how long the server held this gradient for its BSP step's others


@typing.runtime_checkable
class SwitchDecisions(typing.Protocol):
    """What the server asks of the Sync-Switch state machine of one trained tensor (progress,
    phases, the next protocol; `runners.switch.machine.SwitchMachine`, which the trainers'
    runner builds and sends with `init_trained`). The server calls it under its lock."""

    mode: Protocol  # of the next step
    decided_phase: int
    phase: int  # whose pushes are being applied
    applied: int
    isolated: tuple[int, ...]
    stopped: bool
    switches: list[dict[str, Any]]
    clock: Callable[[], float]

    @property
    def done(self) -> bool: ...
    @property
    def trainers(self) -> int: ...
    workers_per_trainer: int
    def start(self) -> None: ...
    def follower(self) -> SwitchDecisions: ...
    def observe(self, trainer: int, compute_s: float, wait_s: float) -> None: ...
    def enter_phase(self, phase: int, protocol: Protocol, version: int,
                    server_s: float) -> None: ...
    @staticmethod
    def pace(compute_s: float, wait_s: float) -> float: ...
    def bsp_gradient(self, pace_s: float) -> None: ...
    def asp_applied(self, phase: int, pace_s: float) -> None: ...
    def bsp_step_applied(self, gradients: int, phase: int) -> None: ...
    def decide(self, bsp_waiting: int) -> None: ...
    def rewind(self, gradients: int) -> None: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class TrainedTensor:
    """Parameters trained on the server, with their optimizer state, version, the BSP step
    being collected, and the state machine that decides the protocol."""

    state: ServerState
    optimizer: str
    machine: SwitchDecisions
    bsp: BulkSynchronous | None = None  # the step being collected; None between steps
    # the BSP step's held replies, each with when its gradient arrived (`Reply.held_s`)
    waiting: list[tuple[torch.futures.Future, float]] = field(default_factory=list)
    own_momentum: dict[int, torch.Tensor] = field(default_factory=dict)  # isolated trainers'
    lock: threading.Lock = field(default_factory=threading.Lock)

    # What a checkpoint keeps: parameters, optimizer state (momentum or Adagrad sums), version,
    # the isolated trainers' momentum buffers, and the machine's (progress, the protocol
    # decided and its phase, who is isolated, the schedule's state).
    def state_dict(self) -> dict[str, torch.Tensor]:
        with self.lock:
            out = {"params": self.state.params.clone(), "slot": self.state.slot.clone(),
                   "version": torch.tensor(self.state.version)}
            out.update({f"{OWN_MOMENTUM}{i}": buf.clone() for i, buf in self.own_momentum.items()})
            out.update({k: v if isinstance(v, torch.Tensor) else torch.tensor(v)
                        for k, v in self.machine.state_dict().items()})
            return out

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        with self.lock:
            with torch.no_grad():
                self.state.params.copy_(state["params"])
                self.state.slot.copy_(state["slot"])
            self.state.version = int(state["version"])
            self.own_momentum = {int(k.removeprefix(OWN_MOMENTUM)): v.clone()
                                 for k, v in state.items() if k.startswith(OWN_MOMENTUM)}
            self.machine.load_state_dict({k: v for k, v in state.items()
                                          if k not in ("params", "slot", "version")
                                          and not k.startswith(OWN_MOMENTUM)})

    def reply(self, staleness: int, taken: bool = True) -> Reply:
        m = self.machine
        return Reply(self.state.params.clone(), self.state.version, staleness, m.applied,
                     m.mode, m.decided_phase, m.done, taken, m.isolated)


class DenseServer:
    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self.locks: dict[str, threading.Lock] = {}
        self.trained: dict[str, TrainedTensor] = {}
        self._create = threading.Lock()
        self._restored: dict[str, dict[str, torch.Tensor]] = {}  # trained, from a checkpoint
        self._rewind_to: int | None = None  # the gradients the resumed workers' positions count

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
        are pushed again: the restored machines count progress from `gradients`."""
        self._rewind_to = gradients

    # -- parameters trained by protocol --
    def init_trained(self, key: str, value: torch.Tensor, optimizer: str,
                     machine: SwitchDecisions) -> None:
        """The first call creates the parameters with `machine` (a fresh one); later calls
        (every worker makes one) find them."""
        with self._create:
            if key not in self.trained:
                machine.start()
                t = TrainedTensor(ServerState(value.clone()), optimizer, machine)
                if key in self._restored:
                    t.load_state_dict(self._restored.pop(key))
                    if self._rewind_to is not None:
                        machine.rewind(self._rewind_to)
                self.trained[key] = t

    def params(self, key: str) -> tuple[torch.Tensor, int, int]:
        """Parameters, version and gradients applied."""
        t = self.trained[key]
        with t.lock:
            return t.state.params.clone(), t.state.version, t.machine.applied

    def mode(self, key: str) -> tuple[Protocol, int]:
        """The protocol of the next step and its phase index."""
        t = self.trained[key]
        with t.lock:
            return t.machine.mode, t.machine.decided_phase

    def isolated(self, key: str) -> tuple[int, ...]:
        """The trainers isolated now (`isolate`; a resumed job's, from its checkpoint)."""
        t = self.trained[key]
        with t.lock:
            return t.machine.isolated

    def push(self, key: str, grad: torch.Tensor, push: Push) -> torch.futures.Future:
        """Apply or hold `grad`; the Future completes with a `Reply`.

        Once the budget is spent every push, and every BSP push still held, is answered at
        once with the final parameters: a worker that entered a BSP step nobody else will
        join (the others saw the end first) is never left waiting."""
        t = self.trained[key]
        m = t.machine
        fut: torch.futures.Future = torch.futures.Future()
        release: list[torch.futures.Future] = []
        with t.lock:
            if m.done:
                fut.set_result(t.reply(0, taken=not m.stopped))
                return fut
            waiting = t.bsp.waiting if t.bsp is not None else 0
            m.observe(push.trainer, push.compute_s, push.wait_s)
            if push.phase > m.phase:
                self._enter_phase(t, push)
            if push.mode == Protocol.ASP:
                staleness = Asynchronous.staleness(t.state.version, push.grad_version)
                apply_update(t.state, grad, t.optimizer, push.lr, push.momentum,
                             self._own_momentum(t, push))
                m.asp_applied(push.phase, m.pace(push.compute_s, push.wait_s))
                m.decide(waiting)
                fut.set_result(t.reply(staleness))
                if m.done:
                    release, t.waiting = t.waiting, []
            elif push.mode == Protocol.BSP:
                t.own_momentum.pop(push.trainer, None)  # back in BSP: its buffer is the step's
                if t.bsp is None:  # the step's first gradient: its members
                    t.bsp = BulkSynchronous.of_trainers(m.trainers, m.workers_per_trainer,
                                                        push.isolated)
                mean = t.bsp.offer(grad, push.trainer)
                t.waiting.append((fut, m.clock()))
                m.bsp_gradient(m.pace(push.compute_s, push.wait_s))
                if mean is None:
                    return fut
                staleness = t.state.version - push.grad_version
                apply_update(t.state, mean, t.optimizer, push.lr, push.momentum)
                m.bsp_step_applied(t.bsp.workers, push.phase)
                t.bsp = None
                m.decide(0)
                reply = t.reply(staleness)
                release, t.waiting = t.waiting, []
            else:
                raise ValueError(f"unknown protocol {push.mode!r}")
            final = t.reply(0)
            released = m.clock()
        for f, arrived in release:
            f.set_result(replace(reply if push.mode == Protocol.BSP else final,
                                 held_s=released - arrived))
        return fut

    @staticmethod
    def _own_momentum(t: TrainedTensor, push: Push) -> torch.Tensor | None:
        """An isolated trainer's momentum buffer (SGD; fresh when it is first isolated)."""
        if not push.from_isolated or t.optimizer != "sgd":
            return None
        if push.trainer not in t.own_momentum:
            t.own_momentum[push.trainer] = torch.zeros_like(t.state.params)
        return t.own_momentum[push.trainer]

    @staticmethod
    def _enter_phase(t: TrainedTensor, push: Push) -> None:
        t0 = t.machine.clock()
        if push.reset_momentum and not push.from_isolated:  # its own buffer starts at zero
            reset_momentum(t.state, t.optimizer)
        server_s = t.machine.clock() - t0
        t.machine.enter_phase(push.phase, push.mode, t.state.version, server_s)

    def switches(self, key: str) -> list[dict[str, Any]]:
        return list(self.trained[key].machine.switches)

    def finish(self, key: str) -> None:
        """Stop the job: every push from now on, and every BSP push held, is answered as
        done and unapplied."""
        t = self.trained.get(key)
        if t is None:
            return
        with t.lock:
            t.machine.stopped = True
            release, t.waiting = t.waiting, []
            reply = t.reply(0, taken=False)
        for f, _ in release:
            f.set_result(reply)


# The server of this process; the RPC functions below run in dense-server processes.
SERVER = DenseServer()


def _init(key: str, value: torch.Tensor) -> None:
    SERVER.init(key, value)


def _get(key: str) -> torch.Tensor:
    return SERVER.get(key)


def _add(key: str, delta: torch.Tensor) -> None:
    SERVER.add(key, delta)


def _init_trained(key: str, value: torch.Tensor, optimizer: str,
                  machine: SwitchDecisions) -> None:
    SERVER.init_trained(key, value, optimizer, machine)


def _mode(key: str) -> tuple[Protocol, int]:
    return SERVER.mode(key)


def _isolated(key: str) -> tuple[int, ...]:
    return SERVER.isolated(key)


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


def joined(replies: list[Reply]) -> Reply:
    """One reply from every shard's, in shard order: shard 0 decides the protocol and who is
    isolated, and every worker follows it."""
    first = replies[0]
    return Reply(torch.cat([r.params for r in replies]), first.version,
                 max(r.staleness for r in replies), first.applied, first.mode, first.phase,
                 any(r.done for r in replies), all(r.taken for r in replies), first.isolated,
                 max(r.held_s for r in replies))  # the round trip waited for the last shard


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

    def init(self, value: torch.Tensor, optimizer: str, machine: SwitchDecisions) -> None:
        """Every worker may call it: the first call creates the parameters, the rest agree.
        Only shard 0's `machine` decides; the others get its followers and apply what the
        pushes name."""
        futs = [rpc.rpc_async(name, _init_trained,
                              args=(self.key, value[lo:hi], optimizer,
                                    machine if lo == 0 else machine.follower()))
                for name, lo, hi in self._pieces()]
        torch.futures.wait_all(futs)

    def mode(self) -> tuple[Protocol, int]:
        """The protocol of the next step and its phase index (decided on shard 0)."""
        return rpc.rpc_sync(ClusterLayout.dense_name(0), _mode, args=(self.key,))

    def isolated(self) -> tuple[int, ...]:
        """The trainers isolated now (decided on shard 0)."""
        return rpc.rpc_sync(ClusterLayout.dense_name(0), _isolated, args=(self.key,))

    def push(self, grad: torch.Tensor, push: Push) -> Reply:
        """Send a gradient; the parameters after it was applied (under BSP: after the step)."""
        return joined(self._call_all(_push, push, value=grad))

    def params(self) -> tuple[torch.Tensor, int, int]:
        """The current parameters, their version and the gradients applied (first shard)."""
        got = self._call_all(_params)
        return torch.cat([g[0] for g in got]), got[0][1], got[0][2]

    def switches(self) -> list[dict[str, Any]]:
        return self._call_all(_switches)[0]

    def finish(self) -> None:
        """Stop the job on every server (see `DenseServer.finish`)."""
        self._call_all(_finish)
