"""The processes of a local job are forked from a server that has imported torch once.

Why: a spawned process imports torch afresh, about a second of CPU each. On 2 busy cores,
starting the 3 processes of the default job that way took 20-30 s before the first line of
our code ran, and as long again on every restart after a killed process. multiprocessing's
"forkserver" imports torch once, in a fresh single-threaded process, and forks each
process of the job from it: the same start took 7-10 s there. Forking the launcher itself
would be faster still but is not safe: a child forked after its parent ran an OpenMP
parallel op hangs in its own first one.

Two things a forked process must not inherit from the server:
- its environment, which is the launcher's from when the server started: the launcher sends
  its current one along (`become_job_process`), and the process keeps over it what the
  launch agent set for its rank;
- its signals: the server ignores SIGINT and SIGTERM, because a Ctrl-C or a SIGTERM reaches
  the job's whole process group, and a server that died of it would take the launcher's
  view of the job's processes with it (the launcher would stop waiting for the final
  checkpoint). The job's processes take both signals back.
"""

from __future__ import annotations

import multiprocessing
import os
import signal

from shadowsync.procfs import stat_fields

SERVER_ENV = "SHADOWSYNC_FORK_SERVER"

# The environment this module was imported in; in the fork server (which imports it first
# thing) and every process forked from it, the server's environment from its start.
ENVIRONMENT_AT_START = dict(os.environ)

if os.environ.get(SERVER_ENV):  # the fork server, starting
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def start() -> None:
    """Start this process's fork server, with torch imported, unless it already runs."""
    from multiprocessing import forkserver

    multiprocessing.get_context("forkserver").set_forkserver_preload([__name__, "torch"])
    os.environ[SERVER_ENV] = "1"
    try:
        forkserver.ensure_running()
    finally:
        os.environ.pop(SERVER_ENV, None)


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


def cpu_s() -> float:
    """CPU seconds of the fork server and of the job processes it forked that have ended.
    They are its children, not the launcher's, so the launcher's own account of its
    finished children (`RUSAGE_CHILDREN`) leaves them out while the server runs."""
    from multiprocessing import forkserver

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if pid is None:
        return 0.0
    fields = stat_fields(pid)
    if fields is None:
        return 0.0
    # from the state field on: utime, stime, cutime, cstime are the 12th to 15th
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
