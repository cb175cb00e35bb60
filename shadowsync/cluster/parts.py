"""The parts a job's processes are built from, each from the options: the job's layout, the
options filled in from the model, where RPC meets, and the embedding tables' client."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Protocol

from shadowsync.config import ClusterConfig, ModelConfig, OptimConfig, TrainConfig
from shadowsync.embeddings import EmbeddingTables
from shadowsync.errors import UserError
from shadowsync.runners.build import needs_dense_servers
from shadowsync.runners.switch.search import resolve_share
from shadowsync.train.table_kinds.kind import table_builder
from shadowsync.train.tasks import Features, TaskInputs, build_dense_model, features_of
from shadowsync.transport import rendezvous
from shadowsync.transport.layout import PER_HOST, ClusterLayout
from shadowsync.transport.rpc import RpcEndpoint
from shadowsync.transport.servers.embedding.client import RemoteEmbeddings
from shadowsync.transport.servers.embedding.plan import ShardingPlan


class TableOptions(TaskInputs, Protocol):
    """What the embedding tables are built from, and what a host's processes share in
    /dev/shm is sized by: the task's inputs (the features, the dense model, the seed, a warm
    start), the optimizer (the tables' and the dense model's) and the cluster (servers,
    trainers, workers, the transport). A `TrainConfig` is one."""

    optim: OptimConfig
    cluster: ClusterConfig


def layout_of(cluster: ClusterConfig) -> ClusterLayout:
    """The job's roles by rank on the hosts the launcher started it on (`launcher_hosts`);
    a one-line UserError where --embedding-placement cannot be met there."""
    layout = ClusterLayout(cluster.embedding_servers, cluster.dense_servers or 0,
                           cluster.trainers, cluster.workers, launcher_hosts(),
                           cluster.embedding_placement)
    layout.check()
    if layout.placement == PER_HOST and layout.hosts > 1:
        world = int(os.environ.get("WORLD_SIZE", layout.world_size))
        here = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        if here * layout.hosts != world or world != layout.world_size:
            raise UserError(f"--embedding-placement per-host on {layout.hosts} hosts needs "
                            f"torchrun --nproc-per-node {layout.world_size // layout.hosts} on "
                            f"every host (this one runs {here} of the {world} processes)")
    return layout


def launcher_hosts() -> int:
    """Hosts (torchrun agents) the job runs on: GROUP_WORLD_SIZE, which torch's elastic agent
    sets in every process it starts; 1 outside one (a launcher about to start a local job)."""
    return int(os.environ.get("GROUP_WORLD_SIZE", 1))


def resolve(cfg: TrainConfig) -> TrainConfig:
    """Fill defaults that depend on other options (those --val-share adapts, dense servers,
    embedding servers) or on a file (`--switch-at auto`: the share a search stored, read here
    once)."""
    cfg = cfg.adapted()
    features = features_of(cfg)
    need = needs_dense_servers(cfg.sync, build_dense_model(cfg, features))
    # tables these holders cannot keep (a budget below one batch): refused before any process
    table_builder(cfg.model).sharding(cfg.model, cfg.optim.batch_size, features,
                                      max(1, cfg.cluster.embedding_servers),
                                      cfg.cluster.row_split_limit)
    dense = cfg.cluster.dense_servers if cfg.cluster.dense_servers is not None else int(need)
    if need and dense < 1:
        raise UserError(f"--sync {cfg.sync.mode} needs --dense-servers >= 1")
    emb = cfg.cluster.embedding_servers
    if cfg.distributed and emb < 1:
        raise UserError("--embedding-servers must be >= 1 for a cluster job (several trainers "
                        "or a --sync other than none): embeddings are shared, never averaged")
    at = cfg.switch.at
    if at is not None and cfg.sync.entry.can_switch:
        at = resolve_share(at, cfg.switch.job_name)
    resolved = replace(cfg, dense_servers=dense, switch_at=at)
    layout_of(resolved.cluster)  # a placement these hosts cannot meet: refused here
    return resolved


def rpc_endpoint(rpc_port: int | None) -> RpcEndpoint:
    """Where the RPC world meets. Under an elastic agent that shares its TCP store (torch's
    default), every process is a client of that store; otherwise RPC rank 0 hosts a store
    of its own on `rpc_port` (--rpc-port)."""
    master_port = int(os.environ["MASTER_PORT"])
    agent = rendezvous.agent_store()
    port = master_port if agent else rpc_port or master_port + 1
    return RpcEndpoint(os.environ["MASTER_ADDR"], port, rendezvous.attempt(), agent)


def rpc_ranks(layout: ClusterLayout) -> dict[str, int]:
    ranks = {layout.trainer_name(t): layout.trainer_rank(t) for t in range(layout.trainers)}
    for t in range(layout.trainers):
        for k in range(layout.workers):
            ranks[layout.worker_name(t, k)] = layout.worker_rpc_rank(t, k)
    return ranks


def local_ranks() -> range:
    """The ranks the launcher started on this host (torchrun gives each host's agent
    consecutive ranks)."""
    first = int(os.environ["RANK"]) - int(os.environ.get("LOCAL_RANK", 0))
    return range(first, first + int(os.environ.get("LOCAL_WORLD_SIZE", 1)))


def trainers_here(layout: ClusterLayout) -> int:
    """Trainers launched on this host (they share its cores)."""
    return max(1, sum(1 for r in local_ranks() if layout.role(r)[0] == "trainer"))


def embedding_plan(model: ModelConfig, cluster: ClusterConfig, batch_size: int,
                   features: Features) -> ShardingPlan:
    """Which server holds which rows of the tables, as the run's --tables kind places them
    (with --tables dynamic, how each server keeps its share of the id maps, sized by
    `batch_size`: --batch-size)."""
    return table_builder(model).sharding(model, batch_size, features,
                                         cluster.embedding_servers, cluster.row_split_limit)


def embedding_client(options: TableOptions, features: Features, layout: ClusterLayout,
                     endpoint: RpcEndpoint) -> RemoteEmbeddings:
    """The client a trainer's processes reach the embedding servers with (in place on this
    host, RPC otherwise). With --embedding-transport unshared each trainer keeps a private
    copy of the tables instead (the ceiling the shared path is measured against; trainers then
    learn separate embeddings)."""
    model, cluster, optim = options.model, options.cluster, options.optim
    plan = embedding_plan(model, cluster, optim.batch_size, features)
    private = None
    if cluster.embedding_transport == "unshared":
        optimizer = optim.table_optimizer(features.multi_hot)
        private = {s: EmbeddingTables(plan.server_pieces(s), model.table_width(),
                                      seed=options.seed * 7919 + s,
                                      **plan.server_optimizer(s, optimizer)).share_memory_()
                   for s in range(plan.servers)}
    transport = "rpc" if cluster.embedding_transport == "rpc" else "auto"
    return RemoteEmbeddings(plan, layout, endpoint, model.table_width(), rpc_ranks(layout),
                            transport=transport, private=private, prefetch=cluster.prefetch)


def peer_shards(layout: ClusterLayout) -> list[str]:
    """RPC names of the processes besides trainer 0 that save a checkpoint shard."""
    return ([layout.trainer_name(t) for t in range(1, layout.trainers)]
            + [layout.embedding_name(i) for i in range(layout.embedding_servers)]
            + [layout.dense_name(i) for i in range(layout.dense_servers)])


def worker_names(layout: ClusterLayout) -> list[str]:
    """RPC names of the job's Hogwild workers."""
    return [layout.worker_name(t, k) for t in range(layout.trainers)
            for k in range(layout.workers)]
