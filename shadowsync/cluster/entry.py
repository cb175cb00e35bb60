"""The function the launcher starts in every process: it takes over SIGINT and SIGTERM
first, then runs the process's role. (A signal that arrives while the process is still
importing torch, before this runs, ends it with Python's default behaviour.)"""

from __future__ import annotations

from typing import Any

# After SIGINT / SIGTERM a process saves, shuts down and is gone within this many seconds.
STOP_GRACE_S = 8.0


def quiet_resource_tracker() -> None:
    """A process ended on purpose after a stop leaves its semaphores to multiprocessing's
    resource tracker (one per job, started by the launcher, shared by every process), which
    removes them; its warning about them would be noise after the one line a stop prints."""
    import os

    os.environ.setdefault("PYTHONWARNINGS",
                          "ignore::UserWarning:multiprocessing.resource_tracker")


def process_main(cfg: Any) -> None:
    from shadowsync.train.stop import STOP

    STOP.install(grace_s=STOP_GRACE_S)
    from shadowsync.cluster.roles import role_main

    role_main(cfg)
