"""What a trainer asks of its synchronization runner (`Runner`), and what a runner hands each
worker process (`WorkerHook`).

Two kinds of runner implement `Runner`: the threaded group runner of the background and
foreground rules (`rounds.GroupRunner`), and runners whose workers synchronize inside their own
steps, with nothing to run between them (`StepRunner`: the per-step protocols, DDP, post-local
SGD, torchft).
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from multiprocessing.context import BaseContext
from typing import Protocol, runtime_checkable

import torch
from torch import nn
from torch.distributed import ProcessGroup
from torch.optim import Optimizer

from shadowsync.config import ClusterConfig, OptimConfig, SwitchConfig, SyncConfig
from shadowsync.embeddings.client import EmbeddingClient
from shadowsync.runners.reports import WorkerReport
from shadowsync.spec.straggler import Straggler


@runtime_checkable
class Runner(Protocol):
    """The trainer's side of a sync mode, in the order a run calls it: `worker_hook` (before
    the workers start), `load_state_dict` (resuming), `start`, `observe` (every worker report),
    `on_stop` (the job was asked to stop), `stop` (this trainer's workers finished),
    `final_metrics`, `after_training`, `summarize` (trainer 0, over every trainer's
    `final_metrics`); `state_dict` for checkpoints and `settings` for the run's summary."""

    kind: str
    blocks_workers: bool  # workers wait on synchronization inside their steps
    measures_blocking: bool  # False where waiting cannot be told apart from compute

    def worker_hook(self, ctx: BaseContext, workers: int) -> WorkerHook | None: ...
    def start(self) -> None: ...
    def observe(self, report: WorkerReport) -> None: ...
    def on_stop(self) -> None: ...
    def stop(self) -> None: ...
    def after_training(self) -> None: ...
    def state_dict(self) -> dict[str, object]: ...
    def load_state_dict(self, state: dict[str, object]) -> None: ...
    def metrics(self) -> dict[str, object]: ...
    def final_metrics(self) -> dict[str, object]: ...
    def summarize(self, everyone: list[dict[str, object]]) -> dict[str, object]: ...
    def describe(self) -> dict[str, object]: ...
    def settings(self) -> dict[str, object]: ...
    def held(self) -> AbstractContextManager[None]: ...


class RunnerDefaults:
    """`Runner`'s calls doing nothing, or only timing the run: what a runner does not
    override."""

    kind = "abstract"
    blocks_workers = False
    measures_blocking = True  # False where waiting cannot be told apart from compute

    def __init__(self) -> None:
        self._t0 = 0.0
        self._t_end: float | None = None

    def worker_hook(self, ctx: BaseContext, workers: int) -> WorkerHook | None:
        return None

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def observe(self, report: WorkerReport) -> None:
        pass

    def on_stop(self) -> None:
        pass

    def stop(self) -> None:
        self._t_end = time.perf_counter()

    def after_training(self) -> None:
        pass

    def state_dict(self) -> dict[str, object]:
        return {}

    def load_state_dict(self, state: dict[str, object]) -> None:
        pass

    def metrics(self) -> dict[str, object]:
        return {}

    def final_metrics(self) -> dict[str, object]:
        return self.metrics()

    def summarize(self, everyone: list[dict[str, object]]) -> dict[str, object]:
        return {}

    def describe(self) -> dict[str, object]:
        return {}

    def settings(self) -> dict[str, object]:
        return {"runner": self.kind, **self.describe(), "groups": {}}

    def held(self) -> AbstractContextManager[None]:
        """No round of this runner starts inside (trainer 0 validating): nothing to hold
        where the workers synchronize inside their steps."""
        return nullcontext()


class StepRunner(RunnerDefaults):
    """A `Runner` whose workers synchronize inside their steps (their `WorkerHook` does): the
    trainer side only times the run, collects reports and keeps no state of its own."""

    kind = "step"
    blocks_workers = True


@dataclass
class RunnerContext:
    """What a mode's builder may use: the options of the sync, the switch, the job's shape and
    the optimizer, the trainer's model, its peers and its host share."""

    sync: SyncConfig
    switch: SwitchConfig
    cluster: ClusterConfig
    optim: OptimConfig
    straggler: Straggler | None  # --straggler: its link delays a protocol's pushes
    model: torch.nn.Module
    trainer_group: ProcessGroup | None = None  # the process group of the trainers
    trainer_cores: float = 1.0  # this trainer's share of its host's cores (the auto pace)
    store: tuple[str, int] | None = None  # the launcher's TCP store (worker groups)


class Steps(Protocol):
    """What a worker calls on the optimizer its hook hands it (`wrap_optimizer`): a torch
    optimizer, or a stand-in that steps elsewhere (a protocol's push to the servers)."""

    def zero_grad(self, set_to_none: bool = True) -> None: ...

    def step(self) -> object: ...


class HeldSteps(Protocol):
    """The part of a trainer's shared worker slots a hook writes: `held[0]`, the step the
    shared model holds (a hook whose worker trains a private replica says it there)."""

    held: torch.Tensor


@runtime_checkable
class WorkerHook(Protocol):
    """What a runner does inside each worker process, in the order a worker calls it:
    `prepare` and `attach_slots` (before training), `wrap_optimizer`; then after every step
    `agree_stop`, `finished`, `step_taken`, `step`, `progress`, and with each report
    `report`; `where` in error messages; `finish` at the end. `HookDefaults` does nothing
    at each call."""

    endless_data: bool  # True: the worker's data wraps around until `finished()`

    def prepare(self, model: nn.Module, trainer: int, worker: int,
                steps: int = 0) -> nn.Module: ...
    def wrap_optimizer(self, optimizer: Optimizer) -> Steps: ...
    def wrap_tables(self, tables: EmbeddingClient) -> EmbeddingClient: ...
    def attach_slots(self, slots: HeldSteps, start_step: int) -> None: ...
    def agree_stop(self, requested: bool) -> bool: ...
    def step(self) -> float: ...
    def finished(self) -> bool: ...
    def step_taken(self) -> bool: ...
    def progress(self, own: float) -> float: ...
    def report(self) -> dict[str, object]: ...
    def where(self) -> str: ...
    def finish(self, shared_model: nn.Module, trained: nn.Module) -> None: ...


class HookDefaults:
    """`WorkerHook`'s calls doing nothing: what a hook does not override."""

    endless_data = False

    def prepare(self, model: nn.Module, trainer: int, worker: int,
                steps: int = 0) -> nn.Module:
        """Returns the module the worker trains (the shared one unless overridden). `steps`:
        how many steps this worker will take."""
        return model

    def wrap_optimizer(self, optimizer: Optimizer) -> Steps:
        return optimizer

    def wrap_tables(self, tables: EmbeddingClient) -> EmbeddingClient:
        """The embedding client the worker trains with (a slow link may delay it)."""
        return tables

    def attach_slots(self, slots: HeldSteps, start_step: int) -> None:
        """Before training: the trainer's shared slots (a hook whose worker trains a private
        replica says there which step the shared model holds) and the step it resumes at."""

    def agree_stop(self, requested: bool) -> bool:
        """After each optimizer step: whether to stop now, given whether this worker was asked
        to (workers whose collectives run in lockstep must agree on the step)."""
        return requested

    def step(self) -> float:
        """After each step; returns seconds spent waiting on synchronization."""
        return 0.0

    def finished(self) -> bool:
        """True when the worker should stop before its data runs out."""
        return False

    def step_taken(self) -> bool:
        """False when the step just taken did not count (a protocol's push released unapplied
        by a stop): the worker's position does not advance."""
        return True

    def progress(self, own: float) -> float:
        """The fraction of the job done, given this worker's own (its steps against its
        planned steps); a hook that hears the job's count says that instead."""
        return own

    def report(self) -> dict[str, object]:
        """Counters since the previous call, carried by the next `WorkerReport`."""
        return {}

    def where(self) -> str:
        """Where in its synchronization schedule the worker is, for error messages."""
        return ""

    def finish(self, shared_model: nn.Module, trained: nn.Module) -> None:
        pass
