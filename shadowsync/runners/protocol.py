"""Per-step protocols on dense parameter servers: `bsp`, `asp` and `switch` (Sync-Switch; Li,
Mangoubi, Xu, Guo, "Sync-Switch: Hybrid Parameter Synchronization for Distributed Deep
Learning", ICDCS 2021, arXiv 2104.08364).

Every worker process of every trainer is one parameter-server worker with a private replica of
the dense model: after each backward pass it pushes its gradient to the dense servers and
continues from the parameters they send back. The servers hold the parameters, the optimizer
state, a version and the count of gradients applied (`shadowsync.transport.servers.dense`).
The plan (`switch.plan`) names the protocol of each step from that count, the job's global
progress, and the configuration policy (`switch.configure`) its learning rate and momentum;
both are pure functions of what the servers replied, so workers agree without talking.

Guarantees: under BSP every worker holds the same parameters after each step, so the
parameters are identical on every trainer when a switch happens; a switch restarts nothing
and reloads nothing (parameters, optimizer state and version carry over); at the end every
trainer loads the servers' final parameters, so all trainers evaluate the same model.
Embeddings stay on the embedding servers, asynchronous, as in every other mode.
"""

from __future__ import annotations

import copy
import hashlib
import statistics
import time
import warnings
from collections import Counter
from typing import Any

import torch
from torch.nn.utils import parameters_to_vector

from shadowsync.runners.base import SyncRunner, WorkerHook
from shadowsync.runners.reports import WorkerReport
from shadowsync.runners.switch.configure import step_settings
from shadowsync.runners.switch.plan import SwitchPlan
from shadowsync.transport.servers.dense import Push, TrainedTensorClient

KEY = "dense"


def load_flat(vec: torch.Tensor, params: Any) -> None:
    """Copy a flat vector into parameters in place, so shared memory stays shared (torch's
    vector_to_parameters rebinds .data instead)."""
    offset = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            p.copy_(vec[offset:offset + n].view_as(p))
            offset += n


def params_digest(vec: torch.Tensor) -> str:
    """A short fingerprint of exact parameter values (equal iff bitwise equal, in practice)."""
    return hashlib.sha1(vec.detach().contiguous().numpy().tobytes()).hexdigest()[:16]


class ProtocolSettings:
    """What every worker needs to know to push its gradients; picklable."""

    def __init__(self, plan: SwitchPlan, servers: int, numel: int, optimizer: str, lr: float,
                 momentum: float, momentum_policy: str, workers: int, scale_lr: bool) -> None:
        self.plan = plan
        self.servers = servers
        self.numel = numel
        self.optimizer = optimizer
        self.lr = lr
        self.momentum = momentum
        self.momentum_policy = momentum_policy
        self.workers = workers  # every worker of every trainer: n of BSP
        self.scale_lr = scale_lr


class ServerStepper:
    """Stands in for the worker's optimizer: `step()` pushes the gradient and loads the
    parameters the servers send back. The worker's own optimizer only carries the learning
    rate schedule (warmup), which scales the servers' learning rate."""

    def __init__(self, hook: ProtocolHook, local: torch.optim.Optimizer) -> None:
        self.hook = hook
        self.local = local
        self.params = [p for g in local.param_groups for p in g["params"]]
        self.param_groups = local.param_groups  # what schedulers read and write

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        grad = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in self.params])
        group = self.local.param_groups[0]
        scale = group["lr"] / group.get("initial_lr", group["lr"])
        load_flat(self.hook.push(grad, self.params, scale), self.params)


class ProtocolHook(WorkerHook):
    """A worker's side of the protocol. Progress is global: the servers count the gradients
    they have applied, and the plan's phases and the end of training are fractions of the
    job's budget (every worker's planned steps together). Under BSP every worker gets the
    same reply, so all of them change phase at the same step; under ASP a fast worker takes
    more steps than a slow one (its data wraps around), so a straggler does not hold the job
    back, as in Sync-Switch's ASP."""

    endless_data = True

    def __init__(self, settings: ProtocolSettings) -> None:
        self.s = settings
        # per worker process (each has its own copy after pickling)
        self.budget = 0  # gradients the job applies in all
        self.applied = 0  # gradients applied on the servers, as of the last reply
        self.version = 0
        self.pushes = 0
        self.phase = 0
        self.phase_pushes = 0  # this worker's pushes in the current phase
        self.location = ""
        self.shared: list[torch.Tensor] | None = None
        self._blocked = 0.0
        self._staleness: Counter[int] = Counter()
        self._switches: list[dict[str, Any]] = []
        self._push_s: list[float] = []  # round trips of the current phase

    def prepare(self, model: Any, trainer: int, worker: int, steps: int = 0) -> Any:
        self.budget = steps * self.s.workers
        self.location = f"trainer {trainer} worker {worker}"
        # Worker 0 keeps the trainer's shared copy current, so evaluations during training
        # see what the servers hold.
        self.shared = list(model.parameters()) if worker == 0 else None
        replica = copy.deepcopy(model)  # a private replica: one parameter-server worker
        self.client = TrainedTensorClient(KEY, self.s.servers, self.s.numel)
        self.client.init(parameters_to_vector(replica.parameters()).detach(), self.s.optimizer,
                         self.s.workers)
        params, self.version, self.applied = self.client.params()
        self.phase = self.s.plan.phase_at(self.applied, self.budget)
        load_flat(params, replica.parameters())
        return replica

    def wrap_optimizer(self, optimizer: Any) -> Any:
        # The local optimizer never steps (the servers do), only its schedule advances.
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step",
                                category=UserWarning)
        return ServerStepper(self, optimizer)

    def finished(self) -> bool:
        return self.applied >= self.budget

    def push(self, grad: torch.Tensor, params: list[torch.Tensor],
             lr_scale: float = 1.0) -> torch.Tensor:
        s = self.s
        phase = s.plan.phase_at(self.applied, self.budget)
        if phase != self.phase:
            self._begin_switch(phase, params)
        mode = s.plan.phases[phase].mode
        cfg = step_settings(mode, s.lr * lr_scale, s.workers, s.momentum, s.momentum_policy,
                            self.phase_pushes, after_switch=phase > 0, scale_lr=s.scale_lr)
        t0 = time.perf_counter()
        reply = self.client.push(grad, Push(mode, self.version, phase, cfg.lr, cfg.momentum,
                                            cfg.reset_momentum))
        took = time.perf_counter() - t0
        if self.phase_pushes == 0 and self._switches:
            self._end_switch(took)
        self._push_s.append(took)
        self._blocked += took
        self._staleness[reply.staleness] += 1
        self.version, self.applied = reply.version, reply.applied
        if self.shared is not None:
            load_flat(reply.params, self.shared)
        self.pushes += 1
        self.phase_pushes += 1
        return reply.params

    def _begin_switch(self, phase: int, params: list[torch.Tensor]) -> None:
        plan = self.s.plan
        self._switches.append({
            "phase": phase, "from": plan.phases[self.phase].mode, "to": plan.phases[phase].mode,
            "step": self.pushes, "applied": self.applied, "wall_time": time.time(),
            "where": self.location,
            "params_digest": params_digest(parameters_to_vector(params)),
            "push_s_before": statistics.median(self._push_s) if self._push_s else 0.0,
        })
        self.phase, self.phase_pushes, self._push_s = phase, 0, []

    def _end_switch(self, first_push_s: float) -> None:
        sw = self._switches[-1]
        sw["first_push_s"] = first_push_s
        # What the switch cost this worker: how much longer its first step under the new
        # protocol waited than a typical step of the old one (BSP -> ASP: nothing).
        sw["cost_s"] = max(0.0, first_push_s - sw["push_s_before"])

    def step(self) -> float:
        blocked, self._blocked = self._blocked, 0.0
        return blocked

    def where(self) -> str:
        return f" under {self.s.plan.phases[self.phase].mode.upper()}"

    def report(self) -> dict[str, Any]:
        out = {"staleness": dict(self._staleness), "switches": self._switches,
               "pushes": self.pushes}
        self._staleness, self._switches = Counter(), []
        return out


class ProtocolRunner(SyncRunner):
    """The trainer side: nothing runs between steps; it collects what workers report and
    loads the servers' final parameters when training is over."""

    kind = "protocol"
    blocks_workers = True

    def __init__(self, settings: ProtocolSettings, model: torch.nn.Module, mode: str) -> None:
        super().__init__([], exchange=None)  # type: ignore[arg-type]
        self.spec = settings
        self.model = model
        self.mode = mode
        self.staleness: Counter[int] = Counter()
        self.switches: list[dict[str, Any]] = []
        self.server_switches: list[dict[str, Any]] = []

    def worker_hook(self, ctx: Any, workers: int) -> ProtocolHook:
        return ProtocolHook(self.spec)

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def stop(self) -> None:
        self._t_end = time.perf_counter()

    def observe(self, report: WorkerReport) -> None:
        self.staleness.update({int(k): v for k, v in report.sync.get("staleness", {}).items()})
        self.switches.extend(report.sync.get("switches", []))

    def after_training(self) -> None:
        client = TrainedTensorClient(KEY, self.spec.servers, self.spec.numel)
        params, _, _ = client.params()
        load_flat(params, self.model.parameters())
        self.server_switches = client.switches()

    def metrics(self) -> dict[str, Any]:
        return staleness_summary(self.staleness)

    def final_metrics(self) -> dict[str, Any]:
        return {**self.metrics(), "staleness_hist": dict(self.staleness),
                "switches": self.switches}

    def summarize(self, everyone: list[dict[str, Any]]) -> dict[str, Any]:
        hist: Counter[int] = Counter()
        switches: list[dict[str, Any]] = []
        for m in everyone:
            hist.update({int(k): v for k, v in m.get("staleness_hist", {}).items()})
            switches.extend(m.get("switches", []))
        return {"staleness": {**staleness_summary(hist), "hist": dict(sorted(hist.items()))},
                "switches": group_switches(switches, self.server_switches)}

    def describe(self) -> dict[str, Any]:
        s = self.spec
        return {"plan": str(s.plan), "optimizer": s.optimizer, "lr": s.lr,
                "momentum": s.momentum, "switch_momentum": s.momentum_policy,
                "scale_lr": s.scale_lr, "ps_workers": s.workers, "dense_servers": s.servers}


def staleness_summary(hist: Counter[int]) -> dict[str, Any]:
    n = sum(hist.values())
    if n == 0:
        return {}
    values = sorted(hist.elements())
    return {"staleness_mean": sum(k * v for k, v in hist.items()) / n,
            "staleness_p50": values[n // 2], "staleness_p90": values[min(n - 1, (9 * n) // 10)],
            "staleness_max": values[-1]}


def group_switches(events: list[dict[str, Any]],
                   server: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per switch: when, what it cost, and whether every worker held the same
    parameters when it happened."""
    out = []
    for phase in sorted({e["phase"] for e in events}):
        es = [e for e in events if e["phase"] == phase]
        srv = next((x for x in server if x["phase"] == phase), {})
        digests = sorted({e["params_digest"] for e in es})
        out.append({
            "phase": phase, "from": es[0]["from"], "to": es[0]["to"], "step": es[0]["step"],
            "wall_time": min(e["wall_time"] for e in es),
            "workers": len(es), "params_identical": len(digests) == 1,
            "params_digests": digests,
            "cost_s": max(e.get("cost_s", 0.0) for e in es) + srv.get("server_s", 0.0),
            "server_s": srv.get("server_s"),
        })
    return out


def protocol_runner(ctx: Any) -> ProtocolRunner:
    """The builder of the `bsp`, `asp` and `switch` modes."""
    cfg = ctx.cfg
    plan = SwitchPlan.parse(cfg.switch_plan) if cfg.sync == "switch" \
        else SwitchPlan.single(cfg.sync)
    numel = sum(p.numel() for p in ctx.model.parameters())
    settings = ProtocolSettings(plan, cfg.dense_servers or 0, numel, cfg.optimizer, cfg.lr,
                                cfg.momentum, cfg.switch_momentum,
                                cfg.trainers * cfg.workers, cfg.switch_scale_lr)
    return ProtocolRunner(settings, ctx.model, cfg.sync)
