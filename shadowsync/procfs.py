"""One process's line of `/proc/PID/stat`, read by the code that watches the job's processes
(is it alive, which process is it, how much CPU has it used)."""

from __future__ import annotations


def stat_fields(pid: int) -> list[str] | None:
    """The fields of `/proc/PID/stat` after the command name (state first, then the parent's
    PID, ...; utime is [11]), or None if there is no such process. The name is skipped by the
    last ")", since it may hold spaces and parentheses itself."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_time(pid: int) -> int | None:
    """When process `pid` started, in clock ticks after boot, or None if there is no such
    process: with the PID, which process it is (a PID is reused once its process is gone)."""
    fields = stat_fields(pid)
    return int(fields[19]) if fields else None
