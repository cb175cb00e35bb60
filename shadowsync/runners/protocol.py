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
import logging
import random
import statistics
import time
import warnings
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict
from multiprocessing.context import BaseContext

import torch
from torch import nn
from torch.nn.utils import parameters_to_vector
from torch.optim import Optimizer

from shadowsync.embeddings.client import EmbeddingClient
from shadowsync.protocols import Protocol
from shadowsync.runners.base import HookDefaults, RunnerContext, StepRunner
from shadowsync.runners.reports import WorkerReport
from shadowsync.runners.switch.configure import step_settings
from shadowsync.runners.switch.detector import DetectorConfig
from shadowsync.runners.switch.machine import SwitchMachine
from shadowsync.runners.switch.schedule import Schedule
from shadowsync.spec.delay import LinkDelay
from shadowsync.spec.plan import SwitchPlan
from shadowsync.transport.delay import DelayedTables, sleep
from shadowsync.transport.servers.dense import Push, TrainedTensorClient

KEY = "dense"
log = logging.getLogger(__name__)


def load_flat(vec: torch.Tensor, params: Iterable[torch.Tensor]) -> None:
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
                 momentum: float, momentum_policy: str, workers: int, scale_lr: bool,
                 compensate: bool = False, policy: str = "plan",
                 detector: DetectorConfig | None = None,
                 patience_s: float | None = None, workers_per_trainer: int = 1,
                 link: LinkDelay | None = None) -> None:
        self.plan = plan
        self.servers = servers
        self.numel = numel
        self.optimizer = optimizer
        self.lr = lr
        self.momentum = momentum
        self.momentum_policy = momentum_policy
        self.workers = workers  # every worker of every trainer: n of BSP
        self.scale_lr = scale_lr
        self.compensate = compensate  # ASP momentum lowered by asynchrony's implicit share
        self.policy = policy  # plan | greedy | elastic | isolate
        self.detector = detector or DetectorConfig()
        self.patience_s = patience_s
        self.workers_per_trainer = workers_per_trainer
        self.link = link  # a network straggler (`--straggler kind=delay|jitter`)

    def schedule(self, budget: int) -> Schedule:
        return Schedule(self.plan, budget, self.policy, self.detector, self.patience_s,
                        self.workers // self.workers_per_trainer)

    def machine(self, budget: int) -> SwitchMachine:
        """The state machine shard 0 drives (the other shards get its followers)."""
        return SwitchMachine(self.workers, budget, self.schedule(budget),
                             self.workers_per_trainer)


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


class ProtocolHook(HookDefaults):
    """A worker's side of the protocol. The dense server holding shard 0 decides which
    protocol runs (`switch.schedule`: the offline plan from global progress, or an online
    policy from every trainer's pace) and names it in every reply, so all workers of a BSP
    step change protocol on the same step. Progress is global: the servers count the
    gradients they have applied against the job's budget (every worker's planned steps
    together) and say when it is spent. Under ASP a fast worker takes more steps than a slow
    one (its data wraps around), so a straggler does not hold the job back."""

    endless_data = True

    def __init__(self, settings: ProtocolSettings) -> None:
        self.s = settings
        self.link = settings.link  # an emulated slow link: a sleep before each push
        # per worker process (each has its own copy after pickling)
        self.budget = 0  # gradients the job applies in all
        self.applied = 0  # gradients applied on the servers, as of the last reply
        self.version = 0
        self.pushes = 0
        self.mode = settings.plan.phases[0].mode  # of the next push, as the servers said
        self._last_mode = self.mode  # of the last push
        self.next_phase = 0
        self.phase = 0  # of the last push
        self.phase_pushes = 0  # this worker's pushes in the current phase
        self.done = False
        self.taken = True  # the last push was applied (not released by a stop)
        self.isolated: tuple[int, ...] = ()  # `isolate`: as shard 0 last said
        self.trainer = 0
        self.location = ""
        self.shared: list[torch.Tensor] | None = None
        self._blocked = 0.0
        self._last_reply = 0.0
        self._last_took = 0.0  # the previous push's round trip
        self._last_link_s = 0.0  # and that less what the server held it (`Reply.held_s`)
        self._started = 0.0  # this worker's first push
        self._rng = random.Random(0)  # a jittered link's draws (seeded by worker in prepare)
        self._staleness: Counter[int] = Counter()
        self._switches: list[dict[str, object]] = []
        self._push_s: list[float] = []  # round trips of the current phase
        self._compute_s: list[float] = []

    def prepare(self, model: nn.Module, trainer: int, worker: int,
                steps: int = 0) -> nn.Module:
        self.budget = steps * self.s.workers
        self.trainer = trainer
        self.location = f"trainer {trainer} worker {worker}"
        self._rng = random.Random(1000 * trainer + worker)  # a jittered link's draws
        # Worker 0 keeps the trainer's shared copy current, so evaluations during training
        # see what the servers hold.
        self.shared = list(model.parameters()) if worker == 0 else None
        replica = copy.deepcopy(model)  # a private replica: one parameter-server worker
        self.client = TrainedTensorClient(KEY, self.s.servers, self.s.numel)
        self.client.init(parameters_to_vector(replica.parameters()).detach(), self.s.optimizer,
                         self.s.machine(self.budget))
        params, self.version, self.applied = self.client.params()
        mode, self.next_phase = self.client.mode()
        self._follow(mode, self.client.isolated())  # a resumed job may have isolated some
        self.phase, self._last_mode = self.next_phase, self.mode
        load_flat(params, replica.parameters())
        return replica

    def one_way_s(self) -> float:
        """Half the round-trip delay the link adds now (0 without a delayed link)."""
        if self.link is None:
            return 0.0
        now = time.perf_counter()
        self._started = self._started or now
        at = self.progress(0.0) if self.link.of_job else now - self._started
        return self.link.request_s(self.trainer, at, self._rng)

    def wrap_tables(self, tables: EmbeddingClient) -> EmbeddingClient:
        """The straggler's embedding round trips cross its delayed link too."""
        if self.link is None or self.trainer not in self.link.trainers:
            return tables
        return DelayedTables(tables, self.one_way_s)

    def wrap_optimizer(self, optimizer: Optimizer) -> ServerStepper:
        # The local optimizer never steps (the servers do), only its schedule advances.
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step",
                                category=UserWarning)
        return ServerStepper(self, optimizer)

    def finished(self) -> bool:
        return self.done

    def step_taken(self) -> bool:
        return self.taken

    def progress(self, own: float) -> float:
        return self.applied / self.budget if self.budget else own  # the servers' count

    def push(self, grad: torch.Tensor, params: list[torch.Tensor],
             lr_scale: float = 1.0) -> torch.Tensor:
        s = self.s
        t0 = time.perf_counter()
        compute = t0 - self._last_reply if self._last_reply else 0.0
        if self.next_phase != self.phase:
            self._begin_switch(params)
        mode = self.mode
        cfg = step_settings(mode, s.lr * lr_scale, s.workers, s.momentum, s.momentum_policy,
                            self.phase_pushes, after_switch=self.phase > 0, scale_lr=s.scale_lr,
                            compensate=s.compensate)
        one_way = sleep(self.one_way_s())  # the link, both ways inside the round trip
        reply = self.client.push(grad, Push(mode, self.version, self.phase, cfg.lr, cfg.momentum,
                                            cfg.reset_momentum, self.trainer, compute,
                                            self._last_link_s, self.isolated))
        sleep(one_way)
        self._last_reply = time.perf_counter()
        took = self._last_took = self._last_reply - t0
        self._last_link_s = max(0.0, took - reply.held_s)
        if self.phase_pushes == 0 and self._switches:
            self._end_switch(took, reply.params)
        self._push_s.append(took)
        if compute:
            self._compute_s.append(compute)
        self._blocked += took
        self._staleness[reply.staleness] += 1
        self.version, self.applied, self.done = reply.version, reply.applied, reply.done
        self.taken = reply.taken
        self._last_mode = mode
        self._follow(reply.mode, reply.isolated)
        self.next_phase = reply.phase
        if self.shared is not None:
            load_flat(reply.params, self.shared)
        self.pushes += 1
        self.phase_pushes += 1
        return reply.params

    def _follow(self, mode: Protocol, isolated: tuple[int, ...]) -> None:
        """Shard 0's decision: `mode`, except that an isolated trainer's steps are ASP while
        the others keep BSP (`isolate`)."""
        self.isolated = tuple(isolated)
        self.mode = Protocol.ASP if self.trainer in self.isolated else Protocol(mode)

    def _begin_switch(self, params: list[torch.Tensor]) -> None:
        self._switches.append({
            "phase": self.next_phase, "from": Protocol(self._last_mode).value,
            "to": Protocol(self.mode).value,
            "step": self.pushes, "applied": self.applied,
            "wall_time": time.time(), "where": self.location,
            "params_digest": params_digest(parameters_to_vector(params)),  # at the decision
            "push_s_before": statistics.median(self._push_s) if self._push_s else 0.0,
        })
        self.phase, self.phase_pushes, self._push_s = self.next_phase, 0, []

    def _end_switch(self, first_push_s: float, params: torch.Tensor) -> None:
        sw = self._switches[-1]
        sw["first_push_s"] = first_push_s
        # What the switch cost this worker: how much longer its first step under the new
        # protocol waited than a typical step of the old one (BSP -> ASP: nothing; ASP -> BSP:
        # the wait for the slowest worker to join the first BSP step).
        sw["cost_s"] = max(0.0, first_push_s - sw["push_s_before"])
        sw["digest_before"] = sw["params_digest"]
        if sw["to"] == Protocol.BSP:  # the workers agree once the first BSP step is done
            sw["params_digest"] = params_digest(params)

    def step(self) -> float:
        blocked, self._blocked = self._blocked, 0.0
        return blocked

    def where(self) -> str:
        return f" under {self.mode.upper()}"

    def report(self) -> dict[str, object]:
        out = {"staleness": dict(self._staleness), "switches": self._switches,
               "pushes": self.pushes, "compute_s": self._compute_s}
        self._staleness, self._compute_s = Counter(), []
        # a switch is reported once its first step is done (cost and digest known)
        self._switches = [sw for sw in self._switches if "cost_s" not in sw]
        out["switches"] = [sw for sw in out["switches"] if "cost_s" in sw]
        return out


class ProtocolRunner(StepRunner):
    """The trainer side: nothing runs between steps; it collects what workers report and
    loads the servers' final parameters when training is over."""

    kind = "protocol"

    def __init__(self, settings: ProtocolSettings, model: torch.nn.Module, mode: str) -> None:
        super().__init__()
        self.spec = settings
        self.model = model
        self.mode = mode
        self.staleness: Counter[int] = Counter()
        self.switches: list[dict[str, object]] = []
        self.server_switches: list[dict[str, object]] = []

    def worker_hook(self, ctx: BaseContext, workers: int) -> ProtocolHook:
        return ProtocolHook(self.spec)

    def observe(self, report: WorkerReport) -> None:
        self.staleness.update({int(k): v for k, v in report.sync.get("staleness", {}).items()})
        self.switches.extend(report.sync.get("switches", []))

    def on_stop(self) -> None:
        """Every worker's next reply says the job is done (a BSP step half collected is
        released unapplied), so all stop on the same step and the servers hold a state that
        no worker's position overstates."""
        try:
            TrainedTensorClient(KEY, self.spec.servers, self.spec.numel).finish()
        except Exception as e:  # noqa: BLE001 - a server already gone: the stop goes on
            log.debug("could not stop the dense servers: %s", e)

    def after_training(self) -> None:
        client = TrainedTensorClient(KEY, self.spec.servers, self.spec.numel)
        params, _, _ = client.params()
        load_flat(params, self.model.parameters())
        self.server_switches = client.switches()

    def metrics(self) -> dict[str, object]:
        return staleness_summary(self.staleness)

    def final_metrics(self) -> dict[str, object]:
        return {**self.metrics(), "staleness_hist": dict(self.staleness),
                "switches": self.switches}

    def summarize(self, everyone: list[dict[str, object]]) -> dict[str, object]:
        hist: Counter[int] = Counter()
        switches: list[dict[str, object]] = []
        for m in everyone:
            hist.update({int(k): v for k, v in m.get("staleness_hist", {}).items()})
            switches.extend(m.get("switches", []))
        grouped = group_switches(switches, self.server_switches)
        for s in grouped:
            why = f", stragglers {s['stragglers']}" if s["stragglers"] else ""
            at = time.strftime("%H:%M:%S", time.localtime(s["wall_time"]))
            log.info("switch %d: %s -> %s at step %d (%s.%03d), cost %.4fs, parameters %s%s",
                     s["phase"], s["from"].upper(), s["to"].upper(), s["step"], at,
                     int(s["wall_time"] % 1 * 1000), s["cost_s"],
                     "identical" if s["params_identical"] else "DIFFER", why)
        return {"staleness": {**staleness_summary(hist), "hist": dict(sorted(hist.items()))},
                "switches": grouped}

    def describe(self) -> dict[str, object]:
        s = self.spec
        return {"plan": str(s.plan), "optimizer": s.optimizer, "lr": s.lr,
                "momentum": s.momentum, "switch_momentum": s.momentum_policy,
                "scale_lr": s.scale_lr, "compensate_momentum": s.compensate,
                "policy": s.policy, "detector": asdict(s.detector),
                "patience_s": s.patience_s, "ps_workers": s.workers, "dense_servers": s.servers}


def staleness_summary(hist: Counter[int]) -> dict[str, object]:
    n = sum(hist.values())
    if n == 0:
        return {}
    values = sorted(hist.elements())
    return {"staleness_mean": sum(k * v for k, v in hist.items()) / n,
            "staleness_p50": values[n // 2], "staleness_p90": values[min(n - 1, (9 * n) // 10)],
            "staleness_max": values[-1]}


def group_switches(events: list[dict[str, object]],
                   server: list[dict[str, object]]) -> list[dict[str, object]]:
    """One entry per switch: when, what it cost, and whether every worker held the same
    parameters when it happened."""
    out = []
    for phase in sorted({e["phase"] for e in events}):
        es = [e for e in events if e["phase"] == phase]
        srv = next((x for x in server if x["phase"] == phase), {})
        digests = sorted({e["params_digest"] for e in es})
        # Workers that left BSP held the step's parameters at the decision; workers that
        # (re)join BSP hold the same after its first step (with `isolate` a switch may do both)
        before = {e.get("digest_before", e["params_digest"]) for e in es
                  if e["from"] == Protocol.BSP}
        after = {e["params_digest"] for e in es if e["to"] == Protocol.BSP}
        out.append({
            "phase": phase, "from": es[0]["from"], "to": es[0]["to"], "step": es[0]["step"],
            "applied": srv.get("applied"),
            "wall_time": min(e["wall_time"] for e in es),
            "workers": len(es),
            "params_identical": len(before) <= 1 and len(after) <= 1 and bool(before or after),
            "params_digests": digests,
            "cost_s": max(e.get("cost_s", 0.0) for e in es) + srv.get("server_s", 0.0),
            "server_s": srv.get("server_s"), "decided_at": srv.get("wall_time"),
            "switch_s": srv.get("switch_s"),
            "stragglers": srv.get("stragglers", []), "isolated": srv.get("isolated", []),
        })
    return out


def protocol_runner(ctx: RunnerContext) -> ProtocolRunner:
    """The builder of the `bsp`, `asp` and `switch` modes."""
    mode = ctx.sync.entry
    if not mode.can_switch:
        plan = SwitchPlan.single(mode.protocols[0])
    else:
        plan = ctx.switch.protocol_plan()
    numel = sum(p.numel() for p in ctx.model.parameters())
    settings = ProtocolSettings(plan, ctx.cluster.dense_servers or 0, numel, ctx.optim.optimizer,
                                ctx.optim.lr,
                                ctx.optim.momentum, ctx.switch.momentum,
                                ctx.cluster.trainers * ctx.cluster.workers, ctx.switch.scale_lr,
                                compensate=ctx.switch.compensate_momentum,
                                policy=ctx.switch.policy if mode.can_switch else "plan",
                                detector=ctx.switch.detector,
                                patience_s=ctx.switch.patience,
                                workers_per_trainer=ctx.cluster.workers,
                                link=ctx.straggler.link() if ctx.straggler
                                else None)
    return ProtocolRunner(settings, ctx.model, ctx.sync.mode)
