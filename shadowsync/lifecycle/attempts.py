"""The attempts of one launch of a job (--max-restarts) and the examples each one lost.

When a process of the job dies, the elastic agent ends the others and starts the job again
(attempt 1, 2, ...); every process of a restarted attempt resumes from the run's newest
published checkpoint. What an attempt had trained past that checkpoint is lost: it is
trained again. To count it, every trainer notes its examples, from its workers' shared
step counts, in `OUT/.attempts/N-trainerT` (one small file, replaced in place) every
`trainer.TICK_S` and once more when its workers have stopped, and trainer 0 of every
restarted attempt notes where it resumed (`N-resumed`). Lost examples are then the sum
over failed attempts of what their trainers had reached, less where the next attempt
resumed: exact to the step, except for what a killed trainer trained in its last tick.

The same directory lists the job's processes (`pids`: attempt, name, PID; what the faults
bench kills, and what each trainer watches: `PeerWatch`) and holds `no-restart` once a
process failed in a way a restart would repeat. The local launcher makes the directory;
without it (torchrun) only that refusal is noted, as ``OUT/.no-restart`` on each host.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from shadowsync.lifecycle.exits import EXIT_USER
from shadowsync.procfs import stat_fields

ATTEMPTS_DIR = ".attempts"
REFUSED = "no-restart"
PIDS = "pids"  # "ATTEMPT NAME PID" a line, for whoever watches or kills the job's processes
PIDS_ENV = "SHADOWSYNC_PIDS_FILE"


RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"  # the agent's, or the job's agreed round


def attempt() -> int:
    """How many times the agent restarted this job before starting this process."""
    return int(os.environ.get(RESTART_COUNT, "0"))


def attempts_dir(out: Path) -> Path:
    return Path(out) / ATTEMPTS_DIR


def reset(out: Path) -> None:
    """A new launch: forget the attempts of earlier launches in this run directory."""
    shutil.rmtree(attempts_dir(out), ignore_errors=True)
    attempts_dir(out).mkdir(parents=True, exist_ok=True)


def note_process(name: str, out: Path | None = None) -> None:
    """Add this process to the launch's list of processes. `out` (a launched process) also
    names the list for the children it starts later (Hogwild workers inherit it)."""
    if out is not None and attempts_dir(out).is_dir():
        os.environ[PIDS_ENV] = str(attempts_dir(out) / PIDS)
    path = os.environ.get(PIDS_ENV)
    if path:
        with open(path, "a", encoding="ascii") as fh:
            fh.write(f"{attempt()} {name} {os.getpid()}\n")


def processes(out: Path) -> list[tuple[int, str, int]]:
    """(attempt, name, pid) of every process of the launch that noted itself."""
    try:
        lines = (attempts_dir(out) / PIDS).read_text(encoding="ascii").splitlines()
    except FileNotFoundError:
        return []
    return [(int(a), n, int(p)) for a, n, p in (ln.split() for ln in lines if ln.strip())]


def alive(pid: int) -> bool:
    """Whether process `pid` of this host runs (exists and is not a zombie)."""
    fields = stat_fields(pid)
    return bool(fields) and fields[0] != "Z"


class PeerWatch:
    """Which process of this attempt is gone, from the launch's list of processes (those of
    this host: a process on another host is the elastic agent's to notice). Only while the
    job trains: no process of a job ends before every trainer has finished its data."""

    def __init__(self, out: Path) -> None:
        self.out = Path(out)
        self.me = os.getpid()

    @classmethod
    def of_launch(cls, out: Path) -> PeerWatch | None:
        """One for a process the local launcher started (it lists its processes), else None."""
        return cls(out) if os.environ.get(PIDS_ENV) and attempts_dir(out).is_dir() else None

    def __call__(self) -> str | None:
        mine = attempt()
        return next((name for a, name, pid in processes(self.out)
                     if a == mine and pid != self.me and not alive(pid)), None)


def _refusal(out: Path) -> Path | None:
    """Where a refusal of restarts is noted: in the launch's directory, or under torchrun
    (which has none) beside it, in each host's --out (None: nowhere to note it)."""
    if attempts_dir(out).is_dir():
        return attempts_dir(out) / REFUSED
    return Path(out) / f".{REFUSED}" if Path(out).is_dir() else None


def refuse_restart(out: Path, status: int = EXIT_USER) -> None:
    """A process failed in a way a restart would repeat (bad input, divergence): the
    processes of a restarted attempt end at once, and the launcher reports the error.
    `status`: the process's exit status (`exits`), which says what kind of failure it was."""
    where = _refusal(out)
    if where is not None:
        where.write_text(str(status), encoding="ascii")


def forget_refusal(out: Path) -> None:
    """A new launch under torchrun (attempt 0): a refusal left by an earlier one is void."""
    if attempt() == 0 and not attempts_dir(out).is_dir():
        (Path(out) / f".{REFUSED}").unlink(missing_ok=True)


def restart_refused(out: Path) -> bool:
    where = _refusal(out)
    return where is not None and where.exists()


def refused_status(out: Path) -> int | None:
    """The exit status of the failure that refused restarts (None: none did)."""
    where = _refusal(out)
    try:
        return int(where.read_text(encoding="ascii") or EXIT_USER) if where else None
    except FileNotFoundError:
        return None


def _write(path: Path, value: int) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(str(value), encoding="ascii")
    os.replace(tmp, path)


def trained_name(attempt: int, trainer: int) -> str:
    """The note of a trainer's examples in one attempt."""
    return f"{attempt}-trainer{trainer}"


def resumed_name(attempt: int) -> str:
    """The note of where an attempt resumed (0: from the start)."""
    return f"{attempt}-resumed"


def noted(out: Path, name: str) -> int | None:
    """A count noted for the launch in `out` (`trained_name`, `resumed_name`); None when it
    has not been noted (yet)."""
    try:
        return int((attempts_dir(out) / name).read_text(encoding="ascii"))
    except (FileNotFoundError, ValueError):
        return None


class Progress:
    """A trainer's examples in this attempt, for `examples_lost` if the attempt fails."""

    def __init__(self, out: Path, trainer: int) -> None:
        self.out = Path(out)
        self.trainer = trainer
        self.enabled = attempts_dir(out).is_dir()  # the local launcher made it
        self.path = attempts_dir(out) / trained_name(attempt(), trainer)

    def started(self, resumed_examples: int) -> None:
        """Trainer 0: this attempt resumed at `resumed_examples` (0: from the start)."""
        if self.enabled:
            _write(attempts_dir(self.out) / resumed_name(attempt()), resumed_examples)

    def __call__(self, examples: int) -> None:
        if self.enabled:
            _write(self.path, examples)

    def others(self, trainers: int) -> int:
        """The other trainers' examples in this attempt, as they last noted them."""
        return sum(noted(self.out, trained_name(attempt(), t)) or 0 for t in range(trainers)
                   if t != self.trainer)


def trained(out: Path, attempt: int, trainers: int) -> int:
    """The examples every trainer of attempt `attempt` had noted, together."""
    return sum(noted(out, trained_name(attempt, t)) or 0 for t in range(trainers))


def examples_lost(out: Path, trainers: int) -> int:
    """Examples the failed attempts of this launch trained past where the next one resumed."""
    return sum(max(0, trained(out, k, trainers) - (noted(out, resumed_name(k + 1)) or 0))
               for k in range(attempt()))
