"""The function the launcher starts in every process: it takes over SIGINT and SIGTERM
first (normally already done when the process imported shadowsync: `JOB_PROCESS_ENV`), then
runs the process's role."""

from __future__ import annotations

from typing import Any

from shadowsync.train.stop import JOB_PROCESS_ENV, STOP_GRACE_S

__all__ = ["JOB_PROCESS_ENV", "STOP_GRACE_S", "process_main"]


def process_main(cfg: Any, environment: dict[str, str] | None = None) -> None:
    """`environment`: the launcher's, for a process forked from the fork server."""
    from shadowsync.train.stop import STOP, install_in_job_process

    if environment is not None:
        from shadowsync.forkserver import become_job_process

        become_job_process(environment)
        install_in_job_process()  # the environment says so only now
    STOP.install(grace_s=STOP_GRACE_S, exit_while_starting=True)  # done on import, normally
    from shadowsync.cluster.roles import role_main

    role_main(cfg)
    # The launch agent collects the result after the others finish; a stop meanwhile (the
    # agent then never collects it) should not wait out the stop's grace.
    STOP.mark_done()
