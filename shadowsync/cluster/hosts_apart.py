"""Emulated hosts that share no /dev/shm and no disk: one mount and UTS namespace each.

A real cluster's hosts (Kubernetes pods, SLURM nodes with node-local scratch) each have their
own host name, their own tmpfs on /dev/shm (64 MiB by default under Docker and Kubernetes)
and their own disk. Each host here is a process tree in a mount and UTS namespace of its
own (`unshare -m -u`): its host name, a tmpfs of a given size on /dev/shm, and, over each
path the caller names, a directory of its own. A hosts file bound over /etc/hosts makes
every host's name resolve. The hosts share the machine's loopback, each with an address of
its own (127.0.1.N: the whole of 127/8 is loopback), or, given `NetnsHosts`, each sits in
one of their network namespaces.

A host is held open by a small process (`sh`, then `cat` on a pipe from us) whose namespaces
every process of the host enters (`nsenter`); when the pipe closes (we exit, even killed) the
holder ends. `close` kills every process left in a host's mount namespace, found through
/proc, since torchrun starts its workers in sessions of their own.
"""

from __future__ import annotations

import atexit
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from shadowsync.cluster.netns import NetnsHosts, kill_group, terminate_groups

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["DOCKER_SHM", "ApartHosts", "apart_unavailable_reason"]

DOCKER_SHM = 64 * 2**20  # Docker's and Kubernetes' default /dev/shm
_READY_S = 20.0

_probe_lock = threading.Lock()
_probe: list[str | None] = []


def apart_unavailable_reason() -> str | None:
    """None where mount and UTS namespaces, a tmpfs and a bind mount can be made here, else
    a one-line reason (tried once per process: seccomp and capabilities decide, not euid)."""
    with _probe_lock:
        if not _probe:
            _probe.append(_try_namespaces())
        return _probe[0]


def _try_namespaces() -> str | None:
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        return "the unshare and nsenter commands (util-linux) are not installed"
    script = ("hostname ssync-probe && mount -t tmpfs -o size=1m tmpfs /dev/shm && "
              "mount --bind /dev/null /etc/hosts")
    try:
        res = subprocess.run(["unshare", "-m", "-u", "--propagation", "private", "sh", "-c",
                              script], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot create mount and UTS namespaces: {exc}"
    if res.returncode != 0:
        err = " ".join((res.stderr or "").split()) or f"exit {res.returncode}"
        return f"cannot create mount and UTS namespaces: {err}"
    return None


def _mount_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


class ApartHosts:
    """`n_hosts` emulated hosts, apart but for the network. Use as a context manager.

    Attributes:
        names: each host's name (what `hostname` says there, and what resolves to it).
        addrs: each host's address (on loopback, or its `NetnsHosts` address).
        root: a directory of ours: the hosts file and each host's own directories.
    """

    def __init__(self, n_hosts: int, shm_bytes: int | Sequence[int] = DOCKER_SHM,
                 own: Sequence[str | Path] = (), net: NetnsHosts | None = None,
                 prefix: str = "ssync-h") -> None:
        """`shm_bytes`: the size of every host's /dev/shm, or of each. `own`: paths (absolute)
        over which each host binds a directory of its own (`own_dir`), so that what one
        host writes there the others do not see. `net`: hosts in its network namespaces
        (one per host), else on this machine's loopback."""
        reason = apart_unavailable_reason()
        if reason is not None:
            raise RuntimeError(reason)
        sizes = [shm_bytes] * n_hosts if isinstance(shm_bytes, int) else list(shm_bytes)
        if n_hosts < 1 or len(sizes) != n_hosts:
            raise ValueError(f"{n_hosts} hosts with {len(sizes)} /dev/shm sizes")
        if net is not None and len(net.hosts) != n_hosts:
            raise ValueError(f"{n_hosts} hosts in {len(net.hosts)} network namespaces")
        self.names = [f"{prefix}{i}" for i in range(n_hosts)]  # sorted as torchrun ranks them
        self.addrs = list(net.ips) if net is not None else [f"127.0.1.{i + 1}"
                                                            for i in range(n_hosts)]
        self.net = net
        self.own = [Path(p) for p in own]
        if any(not p.is_absolute() for p in self.own):
            raise ValueError(f"own paths must be absolute: {[str(p) for p in self.own]}")
        self.root = Path(tempfile.mkdtemp(prefix="ssync-hosts-"))
        self._holders: list[subprocess.Popen] = []
        self._namespaces: list[str] = []
        self._procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()
        self._closed = False
        atexit.register(self.close)
        try:
            hosts_file = self.root / "hosts"
            hosts_file.write_text("127.0.0.1 localhost\n::1 localhost\n" + "".join(
                f"{a} {n}\n" for a, n in zip(self.addrs, self.names)), encoding="ascii")
            for i, size in enumerate(sizes):
                self._start_host(i, size, hosts_file)
        except BaseException:
            self.close()
            raise

    def own_dir(self, host: int, path: str | Path) -> Path:
        """Where host `host`'s own directory at `path` (one of `own`) lies on this machine."""
        return self.root / f"host{host}" / str(Path(path)).strip("/").replace("/", "_")

    def _start_host(self, i: int, size: int, hosts_file: Path) -> None:
        steps = [f"hostname {self.names[i]}",
                 f"mount -t tmpfs -o size={size},mode=1777 tmpfs /dev/shm",
                 f"mount --bind {shlex.quote(str(hosts_file))} /etc/hosts"]
        for path in self.own:
            mine = self.own_dir(i, path)
            mine.mkdir(parents=True)
            path.mkdir(parents=True, exist_ok=True)
            steps.append(f"mount --bind {shlex.quote(str(mine))} {shlex.quote(str(path))}")
        steps += ["echo ready", "exec cat >/dev/null"]  # until our end of the pipe closes
        argv = ["unshare", "-m", "-u", "--propagation", "private", "sh", "-ec",
                "; ".join(steps)]
        if self.net is not None:
            argv = ["ip", "netns", "exec", self.net.hosts[i], *argv]
        holder = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, start_new_session=True)
        self._holders.append(holder)
        ready = [""]
        reader = threading.Thread(target=lambda: ready.__setitem__(0, holder.stdout.readline()),
                                  daemon=True)
        reader.start()
        reader.join(_READY_S)
        if ready[0].strip() != "ready":
            holder.kill()
            err = " ".join(holder.stderr.read().split()) if holder.wait(5) is not None else ""
            raise RuntimeError(f"host {self.names[i]} did not start: {err or 'no answer'}")
        ns = _mount_namespace(holder.pid)
        if ns is None or ns == _mount_namespace(os.getpid()):
            raise RuntimeError(f"host {self.names[i]}: no mount namespace of its own")
        self._namespaces.append(ns)

    def popen(self, host: int, argv: Sequence[str], env: Mapping[str, str] | None = None,
              **popen_kwargs: object) -> subprocess.Popen:
        """Start `argv` on host `host`, in a process group of its own. `env` replaces the
        environment (None: ours)."""
        if self._closed:
            raise RuntimeError("ApartHosts is closed")
        if not 0 <= host < len(self._holders):
            raise IndexError(f"host {host} out of range 0..{len(self._holders) - 1}")
        popen_kwargs.pop("start_new_session", None)
        enter = ["nsenter", "-t", str(self._holders[host].pid), "-m", "-u",
                 *(["-n"] if self.net is not None else [])]
        with self._lock:
            proc = subprocess.Popen([*enter, "--", *map(str, argv)],
                                    env=dict(env) if env is not None else None,
                                    start_new_session=True, **popen_kwargs)
            self._procs.append(proc)
        return proc

    def run(self, host: int, argv: Sequence[str], timeout: float,
            env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
        """Run `argv` on host `host` to its end, its output as text; on a timeout its process
        group is killed and `subprocess.TimeoutExpired` raised."""
        proc = self.popen(host, argv, env=env, text=True, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc, signal.SIGKILL)
            proc.communicate()
            raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def processes(self, host: int) -> list[int]:
        """Every process on host `host` but its holder (those in its mount namespace)."""
        ns, holder = self._namespaces[host], self._holders[host].pid
        return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != holder
                and _mount_namespace(int(p)) == ns]

    def close(self) -> None:
        """Kill every process on the hosts, end the holders, remove `root`. Idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        with self._lock:
            live = [p for p in self._procs if p.poll() is None]
        terminate_groups(live)
        for host in range(len(self._namespaces)):
            for pid in self.processes(host):  # workers in sessions of their own, orphans
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in live:
            kill_group(p, signal.SIGKILL)
            p.wait(timeout=10)
        for holder in self._holders:
            holder.stdin.close()  # its `cat` ends
            try:
                holder.wait(timeout=5)
            except subprocess.TimeoutExpired:
                holder.kill()
                holder.wait()
            holder.stdout.close()
            holder.stderr.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
