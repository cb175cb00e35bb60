"""How a failed process of the job ends and how the launcher learns why.

Every process writes its error as one line to the attempt's error file and ends with the
exit status that says what kind of failure it was (`lifecycle.exits`); the launcher turns
the first line and the statuses back into the matching exception (`job_error`).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from shadowsync.errors import UserError
from shadowsync.lifecycle.attempts import attempt
from shadowsync.lifecycle.exits import EXIT_DIVERGED, TrainingDiverged

ERROR_FILE = "error.txt"


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


def report_error(out: str | None, message: str) -> None:
    """Add this process's error line to the attempt's error file (none without --out)."""
    if out:
        with open(error_file(Path(out), attempt()), "a", encoding="utf-8") as fh:
            fh.write(message + "\n")


def leave_now(code: int) -> None:
    """End this failed process at once, and the Hogwild workers it started: they would wait
    for it in RPC's shutdown barrier (for an hour) and it for them at exit, and the job would
    hang instead of failing. The launcher then ends (or restarts) the job."""
    for child in multiprocessing.active_children():
        child.kill()
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


def job_error(line: str | None, statuses: Iterable[int | None]) -> UserError:
    """The exception a failed job raises in the launcher: `line`, its first error, as
    `TrainingDiverged` when a process ended with `EXIT_DIVERGED` (a typed signal for
    --on-divergence rollback), else as a plain `UserError`."""
    kind = TrainingDiverged if EXIT_DIVERGED in set(statuses) else UserError
    return kind(line or "the job failed")
