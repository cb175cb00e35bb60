"""Start a whole job on this machine through torch's programmatic elastic launch, the code
path torchrun uses, so a local run and a multi-host torchrun run are the same program."""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import uuid
import warnings
from pathlib import Path

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

import shadowsync.forkserver as forkserver
from shadowsync.checkpoint.store import checkpoints_at, published
from shadowsync.cluster.entry import JOB_PROCESS_ENV, process_main
from shadowsync.cluster.failures import first_error, job_error
from shadowsync.cluster.parts import layout_of
from shadowsync.config import CheckpointConfig, ClusterConfig, TrainConfig
from shadowsync.errors import UserError
from shadowsync.lifecycle import attempts
from shadowsync.lifecycle.stop import Interrupted
from shadowsync.transport import shm

log = logging.getLogger(__name__)


def free_port(addr: str) -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def check_port_free(addr: str, port: int, option: str) -> None:
    with socket.socket() as s:
        try:
            s.bind((addr, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise UserError(f"{option} {port}: port already in use on {addr}") from None
            raise UserError(f"{option} {port}: cannot bind on {addr}: {e.strerror}") from None


def choose_port(cluster: ClusterConfig) -> int:
    """The rendezvous port (a free one unless --port), checked free."""
    port = cluster.port or free_port(cluster.addr)
    check_port_free(cluster.addr, port, "--port")
    return port


def stop_checkpoint(checkpoint: CheckpointConfig, out_dir: str | None) -> str | None:
    """The newest checkpoint of a run (`out_dir`: its --out), if any."""
    found = published(checkpoints_at(checkpoint, out_dir))
    return str(found[-1]) if found else None


def _first_words(text: str) -> str:
    """The first line of an error report that says something (the agent's start with rules)."""
    return next((ln.strip() for ln in text.splitlines() if any(c.isalnum() for c in ln)),
                "no reason given")


def launch_local(cfg: TrainConfig) -> dict[str, object]:
    """Run every role of the job as local processes; returns the summary trainer 0 wrote.

    `cfg` is resolved, its output directory exists and its data is converted (every process
    opens it), and its port is chosen (`choose_port`).
    """
    out = Path(cfg.output.dir or ".")
    layout = layout_of(cfg.cluster)
    port = cfg.cluster.port
    log.info("starting %d processes: %d embedding server(s), %d dense server(s), "
             "%d trainer(s) of %d worker(s)", layout.world_size, layout.embedding_servers,
             layout.dense_servers, layout.trainers, layout.workers)
    # A restarted attempt resumes from the newest checkpoint, which only some modes can.
    restarts = cfg.checkpoint.max_restarts if cfg.sync.entry.resumable else 0
    attempts.reset(out)
    launch = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=layout.world_size,
        run_id=f"shadowsync-{uuid.uuid4().hex[:8]}", rdzv_backend="c10d",
        rdzv_endpoint=f"{cfg.cluster.addr}:{port}", max_restarts=restarts, monitor_interval=0.2,
        start_method="forkserver", local_addr=cfg.cluster.addr,
    )
    warnings.filterwarnings("ignore", message=".*ProcessGroupGloo.*")
    # The agent logs each step of a shutdown on SIGINT / SIGTERM; one line from us says it all.
    # Its failure reports repeat, with a traceback, what error.txt says in one line.
    for name in ("torch.distributed.elastic", "torch.distributed.elastic.agent.server.api",
                 "torch.distributed.elastic.multiprocessing.api", "torch.multiprocessing.spawn"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    forkserver.start()  # before the mark below: the fork server is no process of the job
    os.environ[JOB_PROCESS_ENV] = "1"  # the processes take over signals on import
    try:
        elastic_launch(launch, process_main)(cfg, forkserver.job_environment())
    except SignalException as e:  # the agent forwarded it; trainer 0 saved a final checkpoint
        raise Interrupted(int(e.sigval), stop_checkpoint(cfg.checkpoint, cfg.output.dir)) from None
    except ChildFailedError as e:  # say which role failed and why, as the type it was
        statuses = [f.exitcode for f in e.failures.values()]
        line = first_error(out, restarts) or f"the job failed: {_first_words(str(e))}"
        raise job_error(line, statuses) from None
    except Exception as e:  # the agent itself failed
        line = first_error(out, restarts)
        raise UserError(line or f"the job failed: {_first_words(str(e))}") from None
    finally:
        os.environ.pop(JOB_PROCESS_ENV, None)
        gone = [pid for _, _, pid in attempts.processes(out) if not attempts.alive(pid)]
        for path in shm.remove_left_by(gone):
            log.info("removed %s, left by a process of the job that was killed", path)
    if attempts.restart_refused(out):  # a restarted attempt ended at once: report why
        raise job_error(first_error(out, restarts), [attempts.refused_status(out)])
    return json.loads((out / "summary.json").read_text(encoding="utf-8"))
