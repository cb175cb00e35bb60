"""What each launched process does, by its rank: serve embeddings, serve dense centres, or
train. `role_main` is the entry point of every process, under torchrun or the local launcher.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
import traceback
import warnings
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from shadowsync.config import ClusterConfig, TrainConfig
from shadowsync.errors import PeerLost, UserError, failure_line
from shadowsync.logs import setup_logging
from shadowsync.train.stop import STOP, STOP_GRACE_S, Interrupted
from shadowsync.transport import rendezvous
from shadowsync.transport.layout import ClusterLayout
from shadowsync.transport.rpc import RpcEndpoint

ERROR_FILE = "error.txt"
COLLECTIVE_TIMEOUT = timedelta(seconds=300)

log = logging.getLogger(__name__)


def layout_of(cluster: ClusterConfig) -> ClusterLayout:
    return ClusterLayout(cluster.embedding_servers, cluster.dense_servers or 0,
                         cluster.trainers, cluster.workers)


def resolve(cfg: TrainConfig) -> TrainConfig:
    """Fill defaults that depend on other options (dense servers, embedding servers)."""
    from shadowsync.runners.build import needs_dense_servers
    from shadowsync.train.trainer import build_dense_model, features_of

    need = needs_dense_servers(cfg, build_dense_model(cfg, features_of(cfg)))
    dense = cfg.cluster.dense_servers if cfg.cluster.dense_servers is not None else int(need)
    if need and dense < 1:
        raise UserError(f"--sync {cfg.sync.mode} needs --dense-servers >= 1")
    emb = cfg.cluster.embedding_servers
    if cfg.distributed and emb < 1:
        raise UserError("--embedding-servers must be >= 1 for a cluster job (several trainers "
                        "or a --sync other than none): embeddings are shared, never averaged")
    return replace(cfg, dense_servers=dense)


def rpc_endpoint(cfg: TrainConfig) -> RpcEndpoint:
    """Where the RPC world meets. Under an elastic agent that shares its TCP store (torch's
    default), every process is a client of that store; otherwise RPC rank 0 hosts a store
    of its own on --rpc-port."""
    master_port = int(os.environ["MASTER_PORT"])
    agent = rendezvous.agent_store()
    port = master_port if agent else cfg.cluster.rpc_port or master_port + 1
    return RpcEndpoint(os.environ["MASTER_ADDR"], port, rendezvous.attempt(), agent)


def rpc_ranks(layout: ClusterLayout) -> dict[str, int]:
    ranks = {layout.trainer_name(t): layout.trainer_rank(t) for t in range(layout.trainers)}
    for t in range(layout.trainers):
        for k in range(layout.workers):
            ranks[layout.worker_name(t, k)] = layout.worker_rpc_rank(t, k)
    return ranks


def role_main(cfg: TrainConfig) -> None:
    """Entry point of every launched process. In an attempt the launcher restarted after a
    process died (--max-restarts), it resumes from the run's newest checkpoint, or ends at
    once if the failure was one a restart would repeat."""
    from shadowsync.train import attempts

    if attempts.attempt() > 0 and cfg.output.dir and attempts.restart_refused(Path(cfg.output.dir)):
        return
    cfg = attempts.after_restart(cfg)
    warnings.filterwarnings("ignore", message=".*ProcessGroupGloo.*")
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", 0))
    try:
        role, index = layout_of(cfg.cluster).role(rank)
        name, short = f"{role} {index}, rank {rank}", f"{role}{index}".replace("embedding", "emb")
    except ValueError:  # a launcher of the wrong size; _run_role says so
        name, short = f"rank {rank}", f"rank{rank}"
    setup_logging(cfg.output.log_level, name)
    if not STOP.installed:  # started by torchrun through shadowsync.run
        STOP.install(grace_s=STOP_GRACE_S, exit_while_starting=True)
    if cfg.output.dir:
        attempts.note_process(short, Path(cfg.output.dir))
    try:
        _run_role(cfg)
    except Interrupted as e:  # the launcher tells the user where the checkpoint is
        logging.shutdown()
        os._exit(e.exit_code)
    except UserError as e:
        _report_error(cfg, str(e))
        # PeerLost: another process died, which a restart can cure; anything else would fail
        # the same way again.
        if cfg.output.dir and not isinstance(e, PeerLost):
            attempts.refuse_restart(Path(cfg.output.dir))
        _leave_now(2)
    except BaseException as e:
        _report_error(cfg, f"rank {os.environ.get('RANK')}: {failure_line(e)}")
        traceback.print_exc()
        _leave_now(1)


def _leave_now(code: int) -> None:
    """End this failed process at once, and the Hogwild workers it started: they would wait
    for it in RPC's shutdown barrier (for an hour) and it for them at exit, and the job would
    hang instead of failing. The launcher then ends (or restarts) the job."""
    for child in multiprocessing.active_children():
        child.kill()
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


def error_file(out: Path, attempt: int) -> Path:
    """Where the processes of one attempt of the job write their errors, one line each."""
    return Path(out) / (ERROR_FILE if attempt == 0 else f"error-restart-{attempt}.txt")


def first_error(out: Path, attempts: int) -> str | None:
    """The first error of the last attempt that wrote one (of attempts 0..`attempts`)."""
    for k in range(attempts, -1, -1):
        path = error_file(out, k)
        if path.exists():
            lines = path.read_text(encoding="utf-8").strip().splitlines()
            if lines:
                return lines[0]
    return None


def _report_error(cfg: TrainConfig, message: str) -> None:
    from shadowsync.train.attempts import attempt

    if cfg.output.dir:
        with open(error_file(Path(cfg.output.dir), attempt()), "a", encoding="utf-8") as fh:
            fh.write(message + "\n")


def _run_role(cfg: TrainConfig) -> None:
    layout = layout_of(cfg.cluster)
    if cfg.data.val_share > 0:
        # Each new best model is saved while the job trains: import the checkpoint writer now,
        # while every process starts (seconds), rather than in the first save, where it held
        # up trainer 0's validations while the workers trained on.
        import torch.distributed.checkpoint  # noqa: F401
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
    trainer_group = dist.new_group(layout.trainer_ranks, timeout=COLLECTIVE_TIMEOUT)
    role, index = layout.role(rank)
    endpoint = rpc_endpoint(cfg)
    if cfg.output.dir and (role, index) != ("trainer", 0):
        follow_trainer0(Path(cfg.output.dir))
    if role == "embedding":
        from shadowsync.transport.servers.embedding.server import release, serve

        plan = embedding_plan(cfg)
        # Clients: every trainer and each of its workers attach once.
        tables = serve(plan, index, cfg.model.table_width(), cfg.optim.table_optimizer(), cfg.seed,
                       share=cfg.cluster.embedding_transport == "auto",
                       clients=layout.trainers * (layout.workers + 1))
        own_shard(cfg, layout.embedding_name(index), tables, f"embedding server {index}")
        log.debug("serving %d embedding rows", sum(plan.server_pieces(index)))
        try:
            endpoint.join(layout.embedding_name(index), rank, layout.rpc_world_size, threads=16)
            STOP.mark_running()
            RpcEndpoint.leave()
        finally:
            release()
    elif role == "dense":
        from shadowsync.transport.servers.dense import SERVER

        own_shard(cfg, layout.dense_name(index), SERVER, f"dense server {index}", known=False)
        if cfg.checkpoint.resume:
            from shadowsync.checkpoint.store import read_manifest

            # A checkpoint taken while training holds pushes past the workers' positions,
            # which the resumed workers push again: count them once.
            manifest = read_manifest(Path(cfg.checkpoint.resume), "--resume")
            positions = manifest.get("positions") or {}
            SERVER.rewind(sum(sum(p) for p in positions.values()))
        endpoint.join(layout.dense_name(index), rank, layout.rpc_world_size, threads=8)
        STOP.mark_running()
        RpcEndpoint.leave()
    else:
        try:
            run_trainer(cfg, layout, index, trainer_group, endpoint)
        except Interrupted:
            log.debug("stopped; leaving")
            dist.destroy_process_group()  # an orderly end: the job stopped as asked
            log.debug("done")
            raise
    log.debug("left the RPC world")
    dist.destroy_process_group()
    log.debug("done")


def follow_trainer0(out: Path) -> None:
    """After a stop request every process but trainer 0 waits for trainer 0, which saves the
    final checkpoint and then ends the job: the process stays while trainer 0 runs (however
    long a loaded machine makes the save, up to the stop's hard limit; its short grace would
    have ended it mid-save) and leaves as soon as trainer 0 is gone. If trainer 0 died instead
    (the launcher stops every process after one died), nobody will end the job: leaving at
    once lets a restarted attempt begin. (Processes of one host, launched locally; elsewhere
    trainer 0 extends the grace by RPC as its stop makes progress.)"""
    import threading
    import time

    from shadowsync.train import attempts

    def on_stop(signum: int) -> None:
        pid = next((p for a, n, p in attempts.processes(out)
                    if a == attempts.attempt() and n == "trainer0"), None)
        if pid is None:
            return

        def watch() -> None:
            while attempts.alive(pid):
                STOP.extend()
                time.sleep(0.1)
            logging.shutdown()
            os._exit(128 + signum)

        threading.Thread(target=watch, name="follow-trainer0", daemon=True).start()

    STOP.on_first_signal(on_stop)


def own_shard(cfg: TrainConfig, shard: str, part: Any, what: str, known: bool = True) -> None:
    """Register a server's state for checkpoints and, resuming, load it. `known`: the
    tensors exist already (else they are created from the checkpoint)."""
    from shadowsync.checkpoint import shards
    from shadowsync.checkpoint.store import load_all

    shards.register(shard, "state", part)
    if not cfg.checkpoint.resume:
        return
    if known:
        shards.load_here(Path(cfg.checkpoint.resume), shard, {"state": part}, what)
    else:
        saved = load_all(Path(cfg.checkpoint.resume) / shard, what)
        part.load_state_dict({k.removeprefix("state/"): v for k, v in saved.items()})


def embedding_plan(cfg: TrainConfig) -> Any:
    from shadowsync.train.trainer import features_of
    from shadowsync.transport.servers.embedding.plan import ShardingPlan

    return ShardingPlan(cfg.cluster.embedding_servers, features_of(cfg).table_rows,
                        cfg.cluster.row_split_limit)


def embedding_client(cfg: TrainConfig, layout: ClusterLayout, endpoint: RpcEndpoint) -> Any:
    """The client a trainer's processes reach the embedding servers with (in place on this
    host, RPC otherwise). With --embedding-transport unshared each trainer keeps a private
    copy of the tables instead (the ceiling the shared path is measured against; trainers then
    learn separate embeddings)."""
    from shadowsync.embeddings import EmbeddingTables
    from shadowsync.transport.servers.embedding.client import RemoteEmbeddings

    plan = embedding_plan(cfg)
    private = None
    if cfg.cluster.embedding_transport == "unshared":
        private = {s: EmbeddingTables(plan.server_pieces(s), cfg.model.table_width(),
                                      seed=cfg.seed * 7919 + s,
                                      **cfg.optim.table_optimizer()).share_memory_()
                   for s in range(plan.servers)}
    transport = "rpc" if cfg.cluster.embedding_transport == "rpc" else "auto"
    return RemoteEmbeddings(plan, layout, endpoint, cfg.model.table_width(), rpc_ranks(layout),
                            transport=transport, private=private)


def trainers_here(layout: ClusterLayout) -> int:
    """Trainers launched on this host (they share its cores)."""
    first = int(os.environ["RANK"]) - int(os.environ.get("LOCAL_RANK", 0))
    local = range(first, first + int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    return max(1, sum(1 for r in local if layout.role(r)[0] == "trainer"))


def run_trainer(cfg: TrainConfig, layout: ClusterLayout, index: int, group: Any,
                endpoint: RpcEndpoint) -> None:
    from shadowsync.runners.build import RunnerContext, build_runner
    from shadowsync.train.replica import run_replica
    from shadowsync.train.trainer import build_dense_model, plan_data

    plan = plan_data(cfg)
    model = build_dense_model(cfg, plan.features)
    tables = embedding_client(cfg, layout, endpoint)
    runner = build_runner(RunnerContext(
        cfg, model, trainer_group=group,
        trainer_cores=len(os.sched_getaffinity(0)) / trainers_here(layout)))

    def gather(item: Any) -> list[Any]:
        everyone = [None] * cfg.cluster.trainers
        dist.all_gather_object(everyone, item, group=group)
        return everyone

    others = ([layout.trainer_name(t) for t in range(1, layout.trainers)]
              + [layout.embedding_name(i) for i in range(layout.embedding_servers)]
              + [layout.dense_name(i) for i in range(layout.dense_servers)])
    workers = [layout.worker_name(t, k) for t in range(layout.trainers)
               for k in range(layout.workers)]
    run_replica(cfg, plan, tables, index=index, model=model, runner=runner, gather=gather,
                remote_shards=others, followers=workers)
