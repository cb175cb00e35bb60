"""What each launched process does, by its rank: serve embeddings, serve dense centres, or
train. `role_main` is the entry point of every process, under torchrun or the local launcher;
read it top to bottom: join the job, then run the role.

A trainer's role builds its parts in this order (`run_trainer`): the data, the dense model,
the embedding tables' client, the sync runner, the checkpointer (trainer 0), the trainer;
then it trains (`train.replica.run_replica`).
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
import warnings
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from shadowsync.cluster.failures import leave_now, report_error
from shadowsync.cluster.follow import follow_trainer0
from shadowsync.cluster.parts import (
    TableOptions,
    embedding_client,
    embedding_plan,
    layout_of,
    peer_shards,
    rpc_endpoint,
    trainers_here,
    worker_names,
)
from shadowsync.cluster.resume import agree_on_start, hosts_apart, own_shard, pushes_to_rewind
from shadowsync.cluster.shm_room import check_hosts
from shadowsync.config import (
    CheckpointConfig,
    ClusterConfig,
    DataConfig,
    OutputConfig,
    RunRecord,
    SwitchConfig,
    TrainConfig,
)
from shadowsync.errors import PeerLost, UserError, failure_line
from shadowsync.lifecycle import attempts
from shadowsync.lifecycle.exits import EXIT_FAILED, exit_status
from shadowsync.lifecycle.stop import JOB_PROCESS_ENV, STOP, STOP_GRACE_S, Interrupted
from shadowsync.logs import setup_logging
from shadowsync.runners.build import RunnerContext, build_runner
from shadowsync.train.replica import ReplicaOptions, build_replica, run_replica
from shadowsync.train.table_kinds.kind import table_builder
from shadowsync.train.tasks import build_dense_model, features_of, plan_data, task_of
from shadowsync.transport import rendezvous
from shadowsync.transport.layout import ClusterLayout
from shadowsync.transport.rpc import RpcEndpoint
from shadowsync.transport.servers.dense import SERVER as DENSE_SERVER
from shadowsync.transport.servers.embedding import server as embedding_servers

COLLECTIVE_TIMEOUT = timedelta(seconds=300)

log = logging.getLogger(__name__)


def role_main(cfg: TrainConfig) -> None:
    """Entry point of every launched process: join the job's process group, run this rank's
    role, leave. In an attempt the launcher restarted after a process died (--max-restarts),
    it resumes from the run's newest checkpoint, or ends at once if the failure was one a
    restart would repeat.

    The process ends with the exit status of `lifecycle.exits`: 2 for bad input or a lost
    peer, 3 (`EXIT_DIVERGED`) for a diverged training, 1 for anything unexpected."""
    layout = start_process(cfg.output, cfg.cluster)
    if layout is None:  # a restart refused
        return
    try:
        import_ahead(cfg.task, cfg.data, layout)
        rank, trainer_group = join_process_group(layout)
        if rank == 0 and not os.environ.get(JOB_PROCESS_ENV):  # torchrun: say where roles run
            log.info("%s placement on %d host(s): %s", layout.placement, layout.hosts,
                     layout.describe())
        # Before anything is trained or saved: one checkpoint storage, one starting checkpoint.
        resume = agree_on_start(cfg.checkpoint, cfg.output.dir, rank, gather_all, hosts_apart())
        if resume != cfg.checkpoint.resume:
            cfg = replace(cfg, resume=resume)
        check_hosts(cfg, layout)  # before anything is mapped: a full /dev/shm is a SIGBUS
        role, index = layout.role(rank)
        endpoint = rpc_endpoint(cfg.cluster.rpc_port)
        if cfg.output.dir and (role, index) != ("trainer", 0):
            follow_trainer0(Path(cfg.output.dir))
        if role == "embedding":
            serve_embeddings(cfg, layout, index, rank, endpoint)
        elif role == "dense":
            serve_dense(cfg.checkpoint, layout, index, rank, endpoint)
        else:
            try:
                run_trainer(cfg, cfg.switch, layout, index, trainer_group, endpoint,
                            cfg.recorded())
            except Interrupted:
                log.debug("stopped; leaving")
                dist.destroy_process_group()  # an orderly end: the job stopped as asked
                log.debug("done")
                raise
        log.debug("left the RPC world")
        dist.destroy_process_group()
        log.debug("done")
    except Interrupted as e:  # the launcher tells the user where the checkpoint is
        logging.shutdown()
        os._exit(e.exit_code)
    except UserError as e:
        report_error(cfg.output.dir, str(e))
        if not os.environ.get(JOB_PROCESS_ENV):  # torchrun: no launcher of ours to say it
            sys.stderr.write(f"shadowsync: error: {e}\n")  # one write: ranks share stderr
            sys.stderr.flush()
        # PeerLost: another process died, which a restart can cure; anything else would fail
        # the same way again.
        if cfg.output.dir and not isinstance(e, PeerLost):
            attempts.refuse_restart(Path(cfg.output.dir), exit_status(e))
        leave_now(exit_status(e))
    except BaseException as e:
        report_error(cfg.output.dir, f"rank {os.environ.get('RANK')}: {failure_line(e)}")
        traceback.print_exc()
        leave_now(EXIT_FAILED)


def start_process(output: OutputConfig, cluster: ClusterConfig) -> ClusterLayout | None:
    """This process's logging, signals and note of itself (--out), and the job's layout;
    None in a restarted attempt that a failure a restart would repeat has refused."""
    rendezvous.agree_on_attempt()  # before anything reads the attempt: one for all hosts
    out = Path(output.dir) if output.dir else None
    if out and not os.environ.get(JOB_PROCESS_ENV):  # torchrun
        attempts.forget_refusal(out)
    if attempts.attempt() > 0 and out and attempts.restart_refused(out):
        if not os.environ.get(JOB_PROCESS_ENV):  # torchrun's agent restarts until one fails
            leave_now(attempts.refused_status(out) or EXIT_FAILED)
        return None
    warnings.filterwarnings("ignore", message=".*ProcessGroupGloo.*")
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", 0))
    layout = layout_of(cluster)  # once: every part below is handed it
    try:
        role, index = layout.role(rank)
        name, short = f"{role} {index}, rank {rank}", f"{role}{index}".replace("embedding", "emb")
    except ValueError:  # a launcher of the wrong size; the role's start says so
        name, short = f"rank {rank}", f"rank{rank}"
    setup_logging(output.log_level, name)
    if not STOP.installed:  # started by torchrun through shadowsync.run
        STOP.install(grace_s=STOP_GRACE_S, exit_while_starting=True)
    if out:
        attempts.note_process(short, out)
    return layout


def import_ahead(task: str, data: DataConfig, layout: ClusterLayout) -> None:
    """Import now, while every process starts (seconds), what a role would otherwise import
    while the job waits on it."""
    if data.val_share > 0:
        # Each new best model is saved while the job waits: import the checkpoint writer now,
        # rather than in the first save, where it held up trainer 0's validation and, while
        # it validates, every worker of the job.
        import torch.distributed.checkpoint  # noqa: F401  (start-up cost, see above)
    if layout.role(int(os.environ["RANK"])) == ("trainer", 0):
        # Trainer 0 evaluates while its workers train on (and validates while they wait):
        # what the first evaluation imports (seconds) is imported now, while the others
        # start, or the workers train past the points due meanwhile and those are skipped.
        task_of(task).prepare_evaluation()


def join_process_group(layout: ClusterLayout) -> tuple[int, dist.ProcessGroup]:
    """Meet every process of this attempt; returns this rank and the trainers' group."""
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    if world != layout.world_size:
        raise UserError(f"the launcher started {world} processes but the job needs "
                        f"{layout.world_size} (embedding servers + dense servers + trainers)")
    # The job's keys of this attempt only: a restarted job meets afresh (see `rendezvous`).
    dist.init_process_group(
        "gloo", init_method=rendezvous.url(os.environ["MASTER_ADDR"],
                                           int(os.environ["MASTER_PORT"]),
                                           rendezvous.attempt(), rendezvous.agent_store()),
        rank=rank, world_size=world, timeout=COLLECTIVE_TIMEOUT)
    # Every rank must take part in creating a group, servers included.
    return rank, dist.new_group(layout.trainer_ranks, timeout=COLLECTIVE_TIMEOUT)


def gather_all(item: object) -> list[object]:
    """Every rank's `item`, in rank order (a collective: every rank calls it)."""
    everyone: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, item)
    return everyone


def serve_embeddings(cfg: TableOptions, layout: ClusterLayout, index: int, rank: int,
                     endpoint: RpcEndpoint) -> None:
    """Embedding server `index`: hold its shard of the tables until the job leaves RPC."""
    features = features_of(cfg)
    plan = embedding_plan(cfg.model, cfg.cluster, cfg.optim.batch_size, features)
    # dynamic tables: one pool, every row starting at --embedding-initial-accumulator
    multi_hot = () if plan.dynamic is not None else features.multi_hot
    # Clients: every trainer and each of its workers attach once.
    tables = embedding_servers.serve(plan, index, cfg.model.table_width(),
                                     cfg.optim.table_optimizer(multi_hot), cfg.seed,
                                     share=cfg.cluster.embedding_transport == "auto",
                                     clients=layout.trainers * (layout.workers + 1))
    # A warm start reads tables that resize (dynamic ones) as saved: the new budget may give
    # another pool size.
    own_shard(cfg.checkpoint, layout.embedding_name(index), tables, f"embedding server {index}",
              known=not (table_builder(cfg.model).resizes and cfg.checkpoint.warm_start
                         and not cfg.checkpoint.resume))
    log.debug("serving %d embedding rows", sum(plan.server_pieces(index)))
    try:
        endpoint.join(layout.embedding_name(index), rank, layout.rpc_world_size, threads=16)
        STOP.mark_running()
        RpcEndpoint.leave()
    finally:
        embedding_servers.release()


def serve_dense(checkpoint: CheckpointConfig, layout: ClusterLayout, index: int, rank: int,
                endpoint: RpcEndpoint) -> None:
    """Dense server `index`: hold its centre (or the protocol's parameters) until the end,
    from the checkpoint the job resumes from, if any."""
    own_shard(checkpoint, layout.dense_name(index), DENSE_SERVER, f"dense server {index}",
              known=False)
    if checkpoint.resume:
        DENSE_SERVER.rewind(pushes_to_rewind(checkpoint))
    endpoint.join(layout.dense_name(index), rank, layout.rpc_world_size, threads=8)
    STOP.mark_running()
    RpcEndpoint.leave()


def run_trainer(inputs: ReplicaOptions, switch: SwitchConfig, layout: ClusterLayout,
                index: int, group: dist.ProcessGroup, endpoint: RpcEndpoint,
                recorded: RunRecord) -> None:
    """Trainer `index`: build its parts in order, then train. What the run records of its
    options comes made, as `build_replica` takes it (`recorded`)."""
    plan = plan_data(inputs)
    model = build_dense_model(inputs, plan.features)
    tables = embedding_client(inputs, plan.features, layout, endpoint)
    runner = build_runner(RunnerContext(
        inputs.sync, switch, inputs.cluster, inputs.optim, inputs.testing.straggler, model,
        trainer_group=group,
        trainer_cores=len(os.sched_getaffinity(0)) / trainers_here(layout)))
    remote = peer_shards(layout)
    replica = build_replica(inputs, plan, tables, model, runner, recorded=recorded,
                            index=index, remote_shards=remote)

    def gather(item: object) -> list[object]:
        everyone = [None] * inputs.cluster.trainers
        dist.all_gather_object(everyone, item, group=group)
        return everyone

    run_replica(replica, gather=gather, remote_shards=remote, followers=worker_names(layout))
