"""The function the launcher starts in every process: it takes over SIGINT and SIGTERM
first (normally already done when the process imported shadowsync: `JOB_PROCESS_ENV`), then
runs the process's role."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shadowsync.forkserver import become_job_process
from shadowsync.lifecycle.stop import (
    JOB_PROCESS_ENV,
    STOP,
    STOP_GRACE_S,
    install_in_job_process,
)

if TYPE_CHECKING:
    from shadowsync.config import TrainConfig

__all__ = ["JOB_PROCESS_ENV", "STOP_GRACE_S", "process_main"]


def process_main(cfg: TrainConfig, environment: dict[str, str] | None = None) -> None:
    """`environment`: the launcher's, for a process forked from the fork server."""
    if environment is not None:
        become_job_process(environment)
        install_in_job_process()  # the environment says so only now
    STOP.install(grace_s=STOP_GRACE_S, exit_while_starting=True)  # done on import, normally
    # Start-up cost: the launcher imports this module but never runs a role; the process
    # imports the roles (RPC, servers, the trainer) only after it has taken over signals.
    from shadowsync.cluster.roles import role_main

    role_main(cfg)
    # The launch agent collects the result after the others finish; a stop meanwhile (the
    # agent then never collects it) should not wait out the stop's grace.
    STOP.mark_done()
