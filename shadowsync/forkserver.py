"""The processes of a local job, and the Hogwild workers of its trainers, are forked from a
server that has imported torch once.

Why: a spawned process imports torch afresh, about a second and a half of CPU, and the
first torch optimizer it builds imports torch's compiler stack (`torch._dynamo`: another
second and a half, for `Optimizer.add_param_group`). On 2 busy cores, starting the 3
processes of the default job that way took 20-30 s before the first line of our code ran,
and as long again on every restart after a killed process. multiprocessing's "forkserver"
imports both once, in a fresh single-threaded process, and forks each process from it.
Forking the launcher or a trainer itself would be faster still but is not safe: a child
forked after its parent ran an OpenMP parallel op hangs in its own first one, and a trainer
has a process group whose threads a child would not have.

Who forks from it:
- the launcher, for the job's processes (torch's elastic launch with start method
  "forkserver"), and for the workers of a single local trainer (`worker_context`);
- each trainer of a local cluster, for its workers: the launcher tells the job's processes
  where its server listens (`job_environment`), and a process forked from that server
  already holds what multiprocessing sends along with a request (the pipe that keeps the
  server alive, the resource tracker). Where this Python's fork server works otherwise
  (a newer protocol), or the trainer was started by torchrun, workers are spawned.

Two things a forked process must not inherit from the server:
- its environment, which is the launcher's from when the server started: the launcher sends
  its current one along (`become_job_process`), and the process keeps over it what the
  launch agent set for its rank; a trainer sends its own to its workers (`run_worker`);
- its signals: the server ignores SIGINT and SIGTERM, because a Ctrl-C or a SIGTERM reaches
  the job's whole process group, and a server that died of it would take the launcher's
  view of the job's processes with it (the launcher would stop waiting for the final
  checkpoint). The job's processes take both signals back; a worker gets SIGTERM's default
  back and SIGINT blocked, as a spawned worker starts (see `Trainer.run`).
"""

from __future__ import annotations

import contextlib
import errno
import multiprocessing
import os
import signal
from collections.abc import Callable
from multiprocessing import forkserver, reduction, spawn
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess

from shadowsync.by_value import send_modules_by_value
from shadowsync.procfs import stat_fields

SERVER_ENV = "SHADOWSYNC_FORK_SERVER"
ADDRESS_ENV = "SHADOWSYNC_FORK_SERVER_ADDRESS"
PRELOAD = ["torch", "torch._dynamo"]

# The environment this module was imported in; in the fork server (which imports it first
# thing) and every process forked from it, the server's environment from its start.
ENVIRONMENT_AT_START = dict(os.environ)


def quiet_when_unsent(main: Callable[[int, int], int]) -> Callable[[int, int], int]:
    """multiprocessing's `spawn._main` for a child of the fork server, ending with exit code
    1 and no traceback when the request it was forked for never fully arrived: its sender
    was stopped (a Ctrl-C to the job) while it wrote the child's start, so the child reads
    EOF. Past that read, the process's own run catches what it raises, so an EOFError here
    is only ever that one. The child reads descriptors as multiprocessing does again."""

    def main_or_quiet(fd: int, parent_sentinel: int) -> int:
        reduction.recvfds = RECVFDS
        try:
            return main(fd, parent_sentinel)
        except EOFError:
            return 1

    return main_or_quiet


def aborted_when_cut_short(recvfds: Callable[..., list[int]]) -> Callable[..., list[int]]:
    """multiprocessing's `reduction.recvfds` for the fork server's own loop: a request whose
    sender was stopped before it sent its descriptors (EOF) raises the aborted connection
    that the loop passes over, where the EOFError ended the server with a traceback."""

    def recvfds_or_aborted(sock: object, size: int) -> list[int]:
        try:
            return recvfds(sock, size)
        except EOFError:
            raise ConnectionAbortedError(errno.ECONNABORTED, "fork request cut short") from None

    return recvfds_or_aborted


RECVFDS = reduction.recvfds

if os.environ.get(SERVER_ENV):  # the fork server, starting
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # both looked up in their modules at each request
    spawn._main = quiet_when_unsent(spawn._main)
    reduction.recvfds = aborted_when_cut_short(RECVFDS)


def _server() -> forkserver.ForkServer:
    return forkserver._forkserver


def start() -> None:
    """Start this process's fork server, with torch imported, unless it already runs. It
    returns at once: the server imports torch meanwhile, and the first fork waits for it."""
    # It starts multiprocessing's resource tracker too, shared by every process of the job.
    # A process ended on purpose after a stop leaves its semaphores to it, which removes
    # them; its warning about them would be noise after the one line a stop prints.
    os.environ.setdefault("PYTHONWARNINGS",
                          "ignore::UserWarning:multiprocessing.resource_tracker")
    multiprocessing.get_context("forkserver").set_forkserver_preload([__name__, *PRELOAD])
    os.environ[SERVER_ENV] = "1"
    try:
        forkserver.ensure_running()
    finally:
        os.environ.pop(SERVER_ENV, None)


def stop() -> None:
    """End this process's fork server now, if it runs: a run that failed or stopped leaves
    none behind, even one still importing torch (it would notice that its launcher is gone
    only once it has)."""
    server = _server()
    pid = getattr(server, "_forkserver_pid", None)
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    server._stop()  # closes its pipe, collects it, forgets it: the next run starts another


def job_environment() -> dict[str, str]:
    """The launcher's environment for the job's processes, with where its server listens."""
    address = _server()._forkserver_address
    return dict(os.environ, **({ADDRESS_ENV: address} if isinstance(address, str) else {}))


def worker_context() -> BaseContext:
    """The multiprocessing context a trainer starts its Hogwild workers with: forked from
    the launcher's server where there is one (see the module's docstring), else spawned."""
    server = _server()
    if server._forkserver_pid is not None:  # this process runs it: a single local trainer
        return multiprocessing.get_context("forkserver")
    address = os.environ.get(ADDRESS_ENV)
    if address and _can_attach(server):
        server._forkserver_address = address
        # The launcher keeps it running; starting one here would import torch again.
        server.ensure_running = lambda: None
        return multiprocessing.get_context("forkserver")
    return multiprocessing.get_context("spawn")


def _can_attach(server: forkserver.ForkServer) -> bool:
    """This process was forked by a fork server whose requests are the ones known here
    (Python 3.10-3.13: a connection, the pipes and fds, no handshake)."""
    return (getattr(server, "_forkserver_alive_fd", None) is not None
            and hasattr(server, "_forkserver_address")
            and not hasattr(forkserver, "_AUTHKEY_LEN"))


def become_job_process(launcher: dict[str, str]) -> None:
    """In a forked process, first: the default SIGINT and SIGTERM handling, and the
    launcher's environment with, over it, what the launch agent set for this process (its
    rank, the rendezvous, the restart count)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    agent = {k: v for k, v in os.environ.items() if ENVIRONMENT_AT_START.get(k) != v}
    os.environ.clear()
    os.environ.update(launcher)
    os.environ.update(agent)


def start_worker(context: BaseContext, target: Callable[..., None],
                 args: tuple[object, ...]) -> BaseProcess:
    """Start `target(*args)` in a daemon process of `context` (`worker_context`), with this
    process's environment. One request to a fork server carries at most about 250 file
    descriptors, one per shared tensor: a model with more parameters (and their optimizer
    state) than that is spawned instead."""
    send_modules_by_value(args)  # a model class from a notebook or a factory's body

    def process(ctx: BaseContext) -> BaseProcess:
        return ctx.Process(target=run_worker, args=(dict(os.environ), target, *args),
                           daemon=True)

    p = process(context)
    try:
        p.start()
    except ValueError:  # "too many fds"; anything else fails again, spawned
        if context.get_start_method() != "forkserver":
            raise
        p = process(multiprocessing.get_context("spawn"))
        p.start()
    return p


def run_worker(environment: dict[str, str], target: Callable[..., None], *args: object) -> None:
    """A worker process's entry: its trainer's environment and signals as a spawned worker
    starts with (SIGTERM ends it, SIGINT waits, blocked, until the worker takes it over),
    then `target(*args)`."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if os.environ != environment:
        os.environ.clear()
        os.environ.update(environment)
    target(*args)


def cpu_s() -> float:
    """CPU seconds of the fork server and of the processes it forked that have ended.
    They are its children, not the launcher's, so the launcher's own account of its
    finished children (`RUSAGE_CHILDREN`) leaves them out while the server runs."""
    pid = getattr(_server(), "_forkserver_pid", None)
    if pid is None:
        return 0.0
    fields = stat_fields(pid)
    if fields is None:
        return 0.0
    # from the state field on: utime, stime, cutime, cstime are the 12th to 15th
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
