"""Per-step and periodic synchronization the way PyTorch users do it today: the baselines.

- `ddp`: DistributedDataParallel (Li et al., "PyTorch Distributed", VLDB 2020): every worker
  process is a rank with its own copy of the dense model, gradients are AllReduced inside
  every backward pass (bulk-synchronous).
- `torch-fr-ma`: PyTorch's post-local SGD (`PostLocalSGDOptimizer` with a
  `PeriodicModelAverager`, Lin et al., "Don't Use Large Mini-Batches, Use Local SGD", ICLR
  2020): local steps, parameters averaged in the foreground every `period` steps.

Embeddings stay where they are (tables or servers); only the dense part is replicated here.
Worker processes are not launcher ranks, so they form their own gloo group through the job's
TCP store.

Checkpoints: after every step on which the replicas are identical (every DDP step, every
averaging step of post-local SGD), worker 0 of each trainer copies its replica into the
trainer's shared model and says so in the shared slots; the workers' positions never pass
that step, so a checkpoint holds the dense model of the steps it counts. The workers' Adagrad
state lives in the slots already. A stop is agreed by all workers (one small AllReduce on
some of those steps), so every worker stops, and resumes, at the same step.
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.context import BaseContext

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer

from shadowsync.runners.base import HeldSteps, HookDefaults, RunnerContext, StepRunner
from shadowsync.transport.rendezvous import attempt


class WorkerGroupHook(HookDefaults):
    """Puts every worker of every trainer in one process group, each with a private model."""

    period = 1  # the replicas are identical after every step (DDP)
    STOP_EVERY = 8  # look for a stop request on every 8th of those steps at least

    def __init__(self, store_addr: str, store_port: int, prefix: str, trainers: int,
                 workers: int) -> None:
        self.store_addr = store_addr
        self.store_port = store_port
        self.prefix = prefix
        self.trainers = trainers
        self.workers = workers
        self.slots: HeldSteps | None = None
        self.steps = 0

    def prepare(self, model: nn.Module, trainer: int, worker: int, steps: int = 0) -> nn.Module:
        store = dist.TCPStore(self.store_addr, self.store_port, is_master=False,
                              timeout=timedelta(seconds=120))
        dist.init_process_group("gloo", store=dist.PrefixStore(self.prefix, store),
                                rank=trainer * self.workers + worker,
                                world_size=self.trainers * self.workers)
        self.rank = dist.get_rank()
        self.shared = model
        self.replica = copy.deepcopy(model)  # a private replica: no Hogwild sharing under DDP
        return self.replica

    def attach_slots(self, slots: HeldSteps, start_step: int) -> None:
        self.slots, self.steps = slots, start_step
        if self.rank % self.workers == 0:
            slots.held[0] = start_step

    def identical_after(self, step: int) -> bool:
        """Whether every replica is the same after the job's step `step` (1-based)."""
        return (step - 1) % self.period == 0

    def agree_stop(self, requested: bool) -> bool:
        step = self.steps + 1  # the step just taken (`step` counts it next)
        every = max(1, self.STOP_EVERY // self.period)
        if not self.identical_after(step) or ((step - 1) // self.period) % every:
            return False
        flag = torch.tensor([1.0 if requested else 0.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def step(self) -> float:
        self.steps += 1
        if (self.slots is not None and self.rank % self.workers == 0
                and self.identical_after(self.steps)):
            with torch.no_grad():
                for dst, src in zip(self.shared.parameters(), self.replica.parameters(),
                                    strict=True):
                    dst.copy_(src)
            self.slots.held[0] = self.steps
        return 0.0

    def finish(self, shared_model: nn.Module, trained: nn.Module) -> None:
        # Replicas are identical (DDP) or averaged on the last period; rank 0 of each trainer
        # hands its copy back for evaluation.
        module = getattr(trained, "module", trained)
        if self.rank % self.workers == 0:
            with torch.no_grad():
                for dst, src in zip(shared_model.parameters(), module.parameters()):
                    dst.copy_(src)
        dist.barrier()
        dist.destroy_process_group()


class DDPHook(WorkerGroupHook):
    def prepare(self, model: nn.Module, trainer: int, worker: int, steps: int = 0) -> nn.Module:
        return DistributedDataParallel(super().prepare(model, trainer, worker, steps))


class AveragingClock:
    """The seconds a worker spent in the optimizer steps that also averaged the replicas.
    The libraries' optimizers average inside `step()`, so those calls are the worker's time
    blocked on sync, which its hook hands to the runner (`WorkerHook.step`)."""

    def __init__(self) -> None:
        self._blocked = 0.0

    def timed(self, step: Callable[..., object],
              averaged: Callable[[], bool]) -> Callable[..., object]:
        """`step`, timed on the calls after which `averaged()` says that call averaged."""

        def timed_step(*a: object, **kw: object) -> object:
            t0 = time.perf_counter()
            out = step(*a, **kw)
            if averaged():
                self._blocked += time.perf_counter() - t0
            return out

        return timed_step

    def take(self) -> float:
        blocked, self._blocked = self._blocked, 0.0
        return blocked


class TorchPeriodicAveragingHook(WorkerGroupHook):
    def __init__(self, store_addr: str, store_port: int, prefix: str, trainers: int,
                 workers: int, *, period: int) -> None:
        super().__init__(store_addr, store_port, prefix, trainers, workers)
        self.period = period
        self.clock = AveragingClock()

    def wrap_optimizer(self, optimizer: Optimizer) -> Optimizer:
        # Here, not at the top: importing torch.distributed.optim takes about 3 s (measured
        # on these machines), paid only by the worker processes of this mode.
        from torch.distributed.optim import PostLocalSGDOptimizer

        opt = PostLocalSGDOptimizer(
            optim=optimizer,
            averager=PeriodicModelAverager(period=self.period, warmup_steps=0),
        )
        # A resumed worker averages on the same steps as one that never stopped.
        opt.averager.step = self.steps
        # The averager counts a step after averaging on it (no warm-up here): the call just
        # made averaged when the step it counted was a multiple of the period.
        opt.step = self.clock.timed(opt.step, lambda: (opt.averager.step - 1) % self.period == 0)
        return opt

    def step(self) -> float:
        super().step()
        return self.clock.take()


class WorkerGroupRunner(StepRunner):
    """The trainer side of `ddp` / `torch-fr-ma`: nothing to run, the workers sync."""

    def __init__(self, hook: WorkerGroupHook, kind: str) -> None:
        super().__init__()
        self.hook = hook
        self.kind = kind

    def worker_hook(self, ctx: BaseContext, workers: int) -> WorkerGroupHook:
        return self.hook

    def describe(self) -> dict[str, object]:
        return {"period": self.hook.period}


def _hook_args(ctx: RunnerContext) -> tuple[str, int, str, int, int]:
    addr, port = ctx.store or agent_store()
    return addr, port, group_prefix(ctx.sync.mode), ctx.cluster.trainers, ctx.cluster.workers


def ddp_runner(ctx: RunnerContext) -> WorkerGroupRunner:
    """The builder of the `ddp` mode."""
    runner = WorkerGroupRunner(DDPHook(*_hook_args(ctx)), ctx.sync.mode)
    runner.measures_blocking = False  # DDP waits inside backward(), not separable
    return runner


def periodic_averaging_runner(ctx: RunnerContext) -> WorkerGroupRunner:
    """The builder of the `torch-fr-ma` mode (post-local SGD)."""
    hook = TorchPeriodicAveragingHook(*_hook_args(ctx), period=ctx.sync.every)
    return WorkerGroupRunner(hook, ctx.sync.mode)


def group_prefix(mode: str) -> str:
    """The job-store keys of one attempt's worker group: the store outlives a restart
    (--max-restarts), and each attempt's workers meet afresh."""
    return f"workers/{mode}/attempt-{attempt()}"


def agent_store() -> tuple[str, int]:
    """The launcher's TCP store (torchrun or the in-process elastic agent)."""
    return os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
