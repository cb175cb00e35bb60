"""The function the launcher starts in every process: it takes over SIGINT and SIGTERM
first (normally already done when the process imported shadowsync: `JOB_PROCESS_ENV`), then
runs the process's role."""

from __future__ import annotations

from typing import Any

from shadowsync.train.stop import JOB_PROCESS_ENV, STOP_GRACE_S

__all__ = ["JOB_PROCESS_ENV", "STOP_GRACE_S", "process_main", "quiet_resource_tracker"]


def quiet_resource_tracker() -> None:
    """A process ended on purpose after a stop leaves its semaphores to multiprocessing's
    resource tracker (one per job, started by the launcher, shared by every process), which
    removes them; its warning about them would be noise after the one line a stop prints."""
    import os

    os.environ.setdefault("PYTHONWARNINGS",
                          "ignore::UserWarning:multiprocessing.resource_tracker")


def process_main(cfg: Any, environment: dict[str, str] | None = None) -> None:
    """`environment`: the launcher's, for a process forked from the fork server."""
    from shadowsync.train.stop import STOP, install_in_job_process

    if environment is not None:
        from shadowsync.cluster.forkserver import become_job_process

        become_job_process(environment)
        install_in_job_process()  # the environment says so only now
    STOP.install(grace_s=STOP_GRACE_S, exit_while_starting=True)  # done on import, normally
    from shadowsync.cluster.roles import role_main

    role_main(cfg)
