"""`torchft-ma`: torchft's LocalSGD (fault-tolerant periodic model averaging) as a baseline.

Every worker process is one torchft replica group of one rank with a private copy of the
dense model; LocalSGD averages the replicas' parameters in the foreground every
`--sync-every` optimizer steps, after a quorum from torchft's lighthouse (which worker 0 of
trainer 0 hosts on the job's address). Embeddings stay where they are. Needs the optional
`peers` extra (torchft). torchft 0.2's per-replica manager server listens on every interface
(`[::]`, not configurable), so the bench runs this mode only inside a private network
namespace that has nothing but loopback.
"""

from __future__ import annotations

import copy
import time
from datetime import timedelta
from typing import Any

import torch

from shadowsync.errors import UserError
from shadowsync.runners.base import WorkerHook
from shadowsync.runners.ddp import AveragingClock, WorkerGroupRunner, agent_store

LIGHTHOUSE_KEY = "torchft/lighthouse"
DONE_KEY = "torchft/done"
TIMEOUT = timedelta(seconds=120)


class TorchftLocalSGDHook(WorkerHook):
    def __init__(self, store_addr: str, store_port: int, replicas: int, period: int) -> None:
        self.store_addr = store_addr
        self.store_port = store_port
        self.replicas = replicas
        self.period = period
        self.clock = AveragingClock()

    def prepare(self, model: Any, trainer: int, worker: int, steps: int = 0) -> Any:
        from torch.distributed import TCPStore
        from torchft import Manager, ProcessGroupGloo

        self.job_store = TCPStore(self.store_addr, self.store_port, is_master=False,
                                  timeout=TIMEOUT)
        self.lighthouse = None
        if trainer == 0 and worker == 0:
            from torchft.coordination import LighthouseServer

            self.lighthouse = LighthouseServer(bind=f"{self.store_addr}:0",
                                               min_replicas=self.replicas)
            self.job_store.set(LIGHTHOUSE_KEY, self.lighthouse.address())
        lighthouse = self.job_store.get(LIGHTHOUSE_KEY).decode()
        # The replica group's own store (one rank), on the job's address.
        self.group_store = TCPStore(self.store_addr, 0, is_master=True, wait_for_workers=False)
        self.model = copy.deepcopy(model)  # a private replica, averaged by LocalSGD
        self.manager = Manager(
            pg=ProcessGroupGloo(timeout=TIMEOUT), min_replica_size=self.replicas,
            load_state_dict=self.model.load_state_dict, state_dict=self.model.state_dict,
            store_addr=self.store_addr, store_port=self.group_store.port,
            lighthouse_addr=lighthouse, replica_id=f"trainer{trainer}-worker{worker}",
            rank=0, world_size=1, hostname=self.store_addr, timeout=TIMEOUT,
            quorum_timeout=TIMEOUT)
        return self.model

    def wrap_optimizer(self, optimizer: Any) -> Any:
        from torchft.local_sgd import LocalSGD

        self.local = LocalSGD(self.manager, self.model, optimizer, sync_every=self.period)
        self.local.__enter__()
        # LocalSGD averages inside step() on every period-th call and then restarts its count.
        optimizer.step = self.clock.timed(optimizer.step, lambda: self.local._local_step == 0)
        return optimizer

    def step(self) -> float:
        return self.clock.take()

    def finish(self, shared_model: Any, trained: Any) -> None:
        # Every replica took the same steps (lockstep); one last average, then replica
        # (trainer, 0) hands its copy back for evaluation.
        self.local.sync()
        self.local.__exit__(None, None, None)
        with torch.no_grad():
            for dst, src in zip(shared_model.parameters(), self.model.parameters()):
                dst.copy_(src)
        self.manager.shutdown(wait=False)
        self.job_store.add(DONE_KEY, 1)
        if self.lighthouse is not None:
            deadline = time.monotonic() + TIMEOUT.total_seconds()
            while (self.job_store.add(DONE_KEY, 0) < self.replicas
                   and time.monotonic() < deadline):
                time.sleep(0.05)
            self.lighthouse.shutdown()


def torchft_runner(ctx: Any) -> WorkerGroupRunner:
    """The builder of the `torchft-ma` mode."""
    import importlib.util

    if importlib.util.find_spec("torchft") is None:
        raise UserError("--sync torchft-ma needs torchft (the optional peers extra; see the "
                        "README's 'Peers' section)")
    cfg = ctx.cfg
    addr, port = ctx.store or agent_store()
    hook = TorchftLocalSGDHook(addr, port, cfg.trainers * cfg.workers, cfg.sync_every)
    return WorkerGroupRunner(hook, "torchft-ma")  # type: ignore[arg-type]
