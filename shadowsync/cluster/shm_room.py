"""Room in /dev/shm: what a host's processes of a job will put there, checked before any of
them maps a byte.

Embedding servers keep their tables in files under /dev/shm that the trainers of their host
map (`transport.servers.embedding.server`); a trainer shares its dense model, its workers'
optimizer state and its sync slots with its Hogwild workers the same way (`share_memory_()`,
`HostSum`). A tmpfs too small for a mapping ends the process with SIGBUS at the first page
that does not fit, not with an error where the mapping is made. So each process adds up
what the ranks of its host will place there, from the plan (nothing is allocated), and
compares it with what /dev/shm has free. Every rank then learns every host's answer (one
gather over the job, which no rank passes before each has looked, so none has mapped
anything yet) and, if a host lacks room, every process of the job ends with the same line.
"""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist

from shadowsync.cluster.parts import TableOptions, embedding_plan, layout_of, local_ranks
from shadowsync.config import ClusterConfig, ModelConfig, OptimConfig
from shadowsync.errors import UserError
from shadowsync.train.table_kinds.kind import table_builder
from shadowsync.train.tasks import Features, build_dense_model, features_of
from shadowsync.transport import shm
from shadowsync.transport.host_sum import HostSum
from shadowsync.transport.layout import ClusterLayout
from shadowsync.transport.servers.embedding import server as embedding_server
from shadowsync.transport.servers.embedding.plan import ShardingPlan

PAGE = os.sysconf("SC_PAGE_SIZE")
# Besides its tables and model, each process of a job shares small things: semaphores, its
# workers' step counts, what torch's queues pass. Measured: 60-100 KiB a trainer.
PER_PROCESS = 256 * 1024


def pages(nbytes: int) -> int:
    """What a shared tensor of `nbytes` takes in the tmpfs: whole pages."""
    return -(-nbytes // PAGE) * PAGE


def trainer_bytes(model: torch.nn.Module, optim: OptimConfig, cluster: ClusterConfig) -> int:
    """A trainer's shared memory besides tables: its dense `model` (parameters and buffers),
    its workers' Adagrad sums (`WorkerSlots`) and, with several trainers, the two slots of
    every AllReduce of a round (`HostSum`, at most one per parameter tensor)."""
    params = list(model.parameters())
    param_bytes = sum(pages(p.nbytes) for p in params)
    total = param_bytes + sum(pages(b.nbytes) for b in model.buffers())
    if optim.optimizer == "adagrad":
        total += cluster.workers * param_bytes
    if cluster.trainers > 1:
        total += pages(HostSum.file_bytes(sum(p.numel() for p in params) + len(params)))
    return total


def tables_bytes(model: ModelConfig, optim: OptimConfig, features: Features,
                 plan: ShardingPlan, server: int) -> int:
    """What embedding server `server` of `plan` (or a trainer holding its tables) shares."""
    return pages(embedding_server.shared_bytes(plan, server, model.table_width(),
                                               optim.table_optimizer(features.multi_hot)))


def host_bytes(options: TableOptions, layout: ClusterLayout, ranks: range) -> int:
    """The bytes the job's ranks `ranks` (those of one host) put in /dev/shm."""
    model, optim, cluster = options.model, options.optim, options.cluster
    features = features_of(options)
    plan = embedding_plan(model, cluster, optim.batch_size, features)
    transport = cluster.embedding_transport
    roles = [layout.role(rank) for rank in ranks]
    trainers = sum(role == "trainer" for role, _ in roles)
    total = len(roles) * PER_PROCESS
    total += sum(tables_bytes(model, optim, features, plan, index)
                 for role, index in roles if role == "embedding" and transport == "auto")
    if trainers:  # every trainer shares the same: one model built to count it
        per_trainer = trainer_bytes(build_dense_model(options, features), optim, cluster)
        if transport == "unshared":  # a private copy of every server's tables
            per_trainer += sum(tables_bytes(model, optim, features, plan, s)
                               for s in range(plan.servers))
        total += trainers * per_trainer
    return total


def local_bytes(cfg: TableOptions) -> int:
    """The bytes a one-process run (`train.local`: its tables and its trainer) shares."""
    features = features_of(cfg)
    plan = table_builder(cfg.model).sharding(cfg.model, cfg.optim.batch_size, features, 1,
                                             cfg.cluster.row_split_limit)
    return (PER_PROCESS + tables_bytes(cfg.model, cfg.optim, features, plan, 0)
            + trainer_bytes(build_dense_model(cfg, features), cfg.optim, cfg.cluster))


def needed_here(options: TableOptions, distributed: bool) -> int:
    """The bytes a run on this machine shares: every rank of a local launch (`distributed`:
    a job of several processes), or the one process of a run without any."""
    if distributed:
        layout = layout_of(options.cluster)
        return host_bytes(options, layout, range(layout.world_size))
    return local_bytes(options)


def check_here(options: TableOptions, distributed: bool) -> None:
    """Before a run on this machine starts a process: refuse it in one line if /dev/shm
    cannot hold what all of it will share (`distributed`: a job of several processes)."""
    line = (shm.shortfall(needed_here(options, distributed), socket.gethostname())
            if shm.available() else None)
    if line:
        raise UserError(line)


def check_hosts(options: TableOptions, layout: ClusterLayout) -> None:
    """Every process of the job, once it has joined the job's process group and before it
    maps anything: raise the same one-line `UserError` on every rank if some host's /dev/shm
    cannot hold what the job's ranks there will put in it (a collective)."""
    line = None
    if shm.available():
        line = shm.shortfall(host_bytes(options, layout, local_ranks()), socket.gethostname())
    everyone: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, line)
    first = next((found for found in everyone if found), None)
    if first:
        raise UserError(first)
