"""`torchft-ma`: torchft's LocalSGD (fault-tolerant periodic model averaging) as a baseline.

Every worker process is one torchft replica group of one rank with a private copy of the
dense model; LocalSGD averages the replicas' parameters in the foreground every
`--sync-every` optimizer steps, after a quorum from torchft's lighthouse (which worker 0 of
trainer 0 hosts on the job's address). Embeddings stay where they are. Needs the optional
`peers` extra (torchft). torchft 0.2's per-replica manager server listens on every interface
(`[::]`, not configurable), so the bench runs this mode only inside a private network
namespace that has nothing but loopback.

Checkpoints, stops and restarts work as for `torch-fr-ma` (`WorkerGroupHook`): the replicas
are identical after every averaging step, worker 0 of each trainer copies its replica into the
shared model there, and a stop is agreed on those steps through a small gloo group of the
workers beside torchft's own (torchft's collectives belong to its quorum steps). A resumed
replica restarts LocalSGD's count where it was, so it averages on the same steps as one that
never stopped; torchft's quorum and its step number start afresh, which changes nothing the
training depends on.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import time
import warnings
from datetime import timedelta
from urllib.parse import urlparse

from torch import nn
from torch.distributed import TCPStore
from torch.optim import Optimizer

from shadowsync.errors import UserError
from shadowsync.runners.base import RunnerContext
from shadowsync.runners.ddp import (
    AveragingClock,
    WorkerGroupHook,
    WorkerGroupRunner,
    agent_store,
    group_prefix,
)
from shadowsync.transport.rendezvous import local_address

TIMEOUT = timedelta(seconds=120)


class TorchftLocalSGDHook(WorkerGroupHook):
    def __init__(self, store_addr: str, store_port: int, prefix: str, trainers: int,
                 workers: int, period: int) -> None:
        super().__init__(store_addr, store_port, prefix, trainers, workers)
        self.period = period
        self.clock = AveragingClock()

    def prepare(self, model: nn.Module, trainer: int, worker: int, steps: int = 0) -> nn.Module:
        # torchft logs every quorum step (its Rust side at INFO: a user's RUST_LOG wins) and
        # warns that this CPU build has no NCCL flight recorder.
        os.environ.setdefault("RUST_LOG", "error")
        logging.getLogger("torchft").setLevel(logging.ERROR)
        # LocalSGD and the averaging clock wrap `optimizer.step` after the warm-up schedule
        # was made; the schedule still steps after it, as it should.
        warnings.filterwarnings("ignore", message=re.escape("Seems like `optimizer.step()`"))
        # torchft is an optional dependency (the peers extra): imported where it is used.
        from torchft import Manager, ProcessGroupGloo

        replica = super().prepare(model, trainer, worker, steps)
        self.job_store = TCPStore(self.store_addr, self.store_port, is_master=False,
                                  timeout=TIMEOUT)
        # Servers of this process (the lighthouse, the replica group's store, the manager)
        # bind and advertise this host's address toward the job's store: across hosts the
        # store's address is another host's.
        here = local_address(self.store_addr)
        self.lighthouse = None
        if trainer == 0 and worker == 0:
            from torchft.coordination import LighthouseServer  # optional (peers extra)

            self.lighthouse = LighthouseServer(bind=f"{here}:0", min_replicas=self.replicas)
            # Its own address() names the host by its hostname, which other hosts may not
            # resolve to this one.
            port = urlparse(self.lighthouse.address()).port
            self.job_store.set(self._key("lighthouse"), f"http://{here}:{port}")
        lighthouse = self.job_store.get(self._key("lighthouse")).decode()
        self.group_store = TCPStore(here, 0, is_master=True, wait_for_workers=False)
        self.manager = Manager(
            pg=ProcessGroupGloo(timeout=TIMEOUT), min_replica_size=self.replicas,
            load_state_dict=replica.load_state_dict, state_dict=replica.state_dict,
            store_addr=here, store_port=self.group_store.port,
            lighthouse_addr=lighthouse, replica_id=f"trainer{trainer}-worker{worker}",
            rank=0, world_size=1, hostname=here, timeout=TIMEOUT,
            quorum_timeout=TIMEOUT,
            # Every replica starts from one model (built from the job's seed, or loaded from
            # one checkpoint): fetching a primary's copy at step 0 would copy equal values.
            init_sync=False)
        return replica

    @property
    def replicas(self) -> int:
        return self.trainers * self.workers  # one replica group per worker

    def _key(self, name: str) -> str:
        return f"{self.prefix}/torchft/{name}"  # an attempt's own (the store outlives it)

    def identical_after(self, step: int) -> bool:
        # LocalSGD averages inside every period-th step() and then restarts its count.
        return step % self.period == 0

    def wrap_optimizer(self, optimizer: Optimizer) -> Optimizer:
        from torchft.local_sgd import LocalSGD  # optional dependency (the peers extra)

        self.local = LocalSGD(self.manager, self.replica, optimizer, sync_every=self.period)
        self.local.__enter__()
        self.local._local_step = self.steps % self.period  # a resumed worker: where it was
        optimizer.step = self.clock.timed(optimizer.step, lambda: self.local._local_step == 0)
        return optimizer

    def step(self) -> float:
        super().step()
        return self.clock.take()

    def finish(self, shared_model: nn.Module, trained: nn.Module) -> None:
        # Every replica took the same steps (lockstep); one last average, then replica
        # (trainer, 0) hands its copy back for evaluation.
        self.local.sync()
        self.local.__exit__(None, None, None)
        super().finish(shared_model, trained)
        self.manager.shutdown(wait=False)
        done = self._key("done")
        self.job_store.add(done, 1)
        if self.lighthouse is not None:
            deadline = time.monotonic() + TIMEOUT.total_seconds()
            while self.job_store.add(done, 0) < self.replicas and time.monotonic() < deadline:
                time.sleep(0.05)
            self.lighthouse.shutdown()


def torchft_runner(ctx: RunnerContext) -> WorkerGroupRunner:
    """The builder of the `torchft-ma` mode."""
    if importlib.util.find_spec("torchft") is None:
        raise UserError(f"--sync {ctx.sync.mode} needs torchft (the optional peers extra; see the "
                        "README's 'Peers' section)")
    addr, port = ctx.store or agent_store()
    hook = TorchftLocalSGDHook(addr, port, group_prefix(ctx.sync.mode), ctx.cluster.trainers,
                               ctx.cluster.workers, ctx.sync.every)
    return WorkerGroupRunner(hook, ctx.sync.mode)
