"""What a trainer keeps in shared memory so that it can checkpoint its Hogwild workers while
they train: their dense optimizer state and how far each has read its shard.

Each worker owns an optimizer (Adagrad's accumulators are per worker, as in the Hogwild
setting) and a data position. Both live in tensors made here with `share_memory_()` before
the workers start: a worker's optimizer updates its accumulators in place in that memory and
the worker writes its position after each step, so the trainer can save both at any moment
without stopping anyone.

A position is the number of steps whose effects are certainly in the model and in the
embedding servers. Gradient pushes to the servers are asynchronous (at most a few in flight),
so while training a worker reports `steps - LAG`; a checkpoint therefore never counts a step
as trained that its state may not hold (no example is skipped on resume) and at most
`LAG` steps per worker, plus the steps taken while a save runs, are trained twice. At the end
of its data (or on a stop request) a worker flushes its pushes and reports every step.
"""

from __future__ import annotations

import torch

# Steps a published position trails the steps taken: covers the pushes in flight
# (RemoteEmbeddings.MAX_PENDING_PUSHES per server; one server's pushes ride with the lookups).
LAG = 4


class WorkerSlots:
    """Per worker: optimizer accumulators like each dense parameter, and data positions."""

    def __init__(self, params: list[torch.Tensor], workers: int, optimizer: str,
                 start: list[int] | None = None) -> None:
        self.workers = workers
        self.optimizer = optimizer
        self.sums = ([[torch.zeros_like(p).share_memory_() for p in params]
                      for _ in range(workers)] if optimizer == "adagrad" else [])
        self.positions = torch.tensor(start or [0] * workers, dtype=torch.long).share_memory_()
        self.steps = self.positions.clone().share_memory_()  # steps taken, ahead of positions
        # Where workers train private replicas (ddp, torch-fr-ma): the newest step whose dense
        # update the shared model holds (a replica copied back); positions never pass it.
        # -1: the workers train the shared model itself.
        self.held = torch.tensor([-1], dtype=torch.long).share_memory_()
        self._marked: torch.Tensor | None = None

    def start_steps(self) -> list[int]:
        return [int(v) for v in self.positions]

    # -- in the worker --
    def attach_optimizer(self, worker: int, optimizer: torch.optim.Optimizer) -> None:
        """Make `optimizer` keep its state in this worker's shared accumulators."""
        if not self.sums:
            return
        params = [p for g in optimizer.param_groups for p in g["params"]]
        for p, shared in zip(params, self.sums[worker], strict=True):
            state = optimizer.state[p]
            if "sum" in state:
                state["sum"] = shared  # Adagrad updates it in place

    def advance(self, worker: int, steps: int, settled: bool = False) -> None:
        self.steps[worker] = steps
        floor = int(self.positions[worker])
        if settled:
            self.positions[worker] = steps
            return
        held = int(self.held[0])
        ahead = steps - LAG if held < 0 else min(steps - LAG, held)
        self.positions[worker] = max(floor, ahead)

    def align(self, position: int) -> None:
        """Every worker at `position` (workers in lockstep resume at one step)."""
        with torch.no_grad():
            self.positions.fill_(position)
            self.steps.fill_(position)

    # -- in the trainer --
    def mark(self) -> None:
        self._marked = self.positions.clone()

    def state_dict(self) -> dict[str, torch.Tensor]:
        positions = self._marked if self._marked is not None else self.positions.clone()
        out: dict[str, torch.Tensor] = {"positions": positions}
        for w, sums in enumerate(self.sums):
            for i, s in enumerate(sums):
                out[f"worker{w}.adagrad.{i}"] = s
        return out

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            self.positions.copy_(state["positions"])
            self.steps.copy_(state["positions"])
            for w, sums in enumerate(self.sums):
                for i, s in enumerate(sums):
                    s.copy_(state[f"worker{w}.adagrad.{i}"])

    def info(self) -> dict[str, object]:
        marked = self._marked if self._marked is not None else self.positions
        self._marked = None
        return {"positions": [int(v) for v in marked], "steps": [int(v) for v in self.steps]}


class DenseModelState:
    """A trainer's shared dense model as checkpoint entries: a copy taken at once (Hogwild
    workers train on while a save writes it; the dense model is small), so what is checked
    for NaN is what is written."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for key, value in self.model.state_dict().items():
                value.copy_(state[key])


class RngState:
    """This process's torch random state (a tensor already)."""

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"torch": torch.get_rng_state()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        torch.set_rng_state(state["torch"])


def examples_in(steps: int, shard: int, num_shards: int, start: int, stop: int,
                batch_size: int) -> int:
    """Rows read by a shard's first `steps` batches of [start, stop) (the last may be short).
    Batch k of the shard starts at start + (shard + k * num_shards) * batch_size. In closed
    form: trainers count their examples with it every tick."""
    stride = num_shards * batch_size
    first = start + shard * batch_size
    if steps <= 0 or first >= stop:
        return 0
    batches = min(steps, -(-(stop - first) // stride))  # those that start before `stop`
    last = first + (batches - 1) * stride
    return (batches - 1) * batch_size + min(batch_size, stop - last)
