"""Emulated hosts on one machine: Linux network namespaces joined by a bridge.

Topology: every host is a network namespace whose ``eth0`` is one end of a veth
pair; the other end is a port of a Linux bridge that lives in a dedicated
"switch" namespace. All interfaces are created inside namespaces we own, so the
root namespace's networking is never touched and interface names only need to
be unique within one namespace.

Namespace names are ``{prefix}-{pid}-{counter}-{role}`` so that parallel test
processes never collide and :func:`cleanup_stale` can tell which leftovers
belong to a process that no longer exists.
"""

from __future__ import annotations

import atexit
import ipaddress
import itertools
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = [
    "DEFAULT_PREFIX",
    "NetnsHosts",
    "cleanup_stale",
    "kill_group",
    "netem_available",
    "netns_unavailable_reason",
    "shaping_unavailable_reason",
]

DEFAULT_PREFIX = "ssync"

_HOST_IF = "eth0"
_BRIDGE = "br0"
_CMD_TIMEOUT_S = 30.0
_KILL_GRACE_S = 2.0

_counter = itertools.count()
_counter_lock = threading.Lock()
_PREFIX_RE = re.compile(r"^[A-Za-z0-9_]{1,32}$")


def _next_id() -> int:
    with _counter_lock:
        return next(_counter)


def _check_prefix(prefix: str) -> str:
    # Names become files under /run/netns and are parsed back by cleanup_stale,
    # so a dash or slash in the prefix would make that parsing ambiguous.
    if not _PREFIX_RE.match(prefix):
        raise ValueError(f"netns prefix must match {_PREFIX_RE.pattern!r}, got {prefix!r}")
    return prefix


def _cmd(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    """Run one ``ip``/``tc`` command; failures become a one-line RuntimeError."""
    argv = [str(a) for a in argv]
    try:
        res = subprocess.run(
            argv, capture_output=True, text=True, timeout=_CMD_TIMEOUT_S, check=False
        )
    except FileNotFoundError as exc:
        raise RuntimeError(f"command not found: {' '.join(argv)}: {exc}") from None
    except subprocess.TimeoutExpired:
        raise RuntimeError(
            f"command timed out after {_CMD_TIMEOUT_S:g}s: {' '.join(argv)}"
        ) from None
    if check and res.returncode != 0:
        err = " ".join((res.stderr or res.stdout or "").split()) or f"exit {res.returncode}"
        raise RuntimeError(f"command failed: {' '.join(argv)}: {err}")
    return res


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return _cmd(["ip", *args], check=check)


def _tc(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return _cmd(["tc", *args], check=check)


# --------------------------------------------------------------------- probing

_probe_lock = threading.Lock()
_probe_result: dict[str, object] | None = None


def _probe() -> dict[str, object]:
    """Try the real operations once per process in a throwaway namespace.

    Checking euid or capabilities is not enough: seccomp profiles, user
    namespaces and missing kernel modules all make the actual calls fail, so
    the only trustworthy answer is to attempt them.
    """
    global _probe_result
    with _probe_lock:
        if _probe_result is not None:
            return _probe_result
        result: dict[str, object] = {"netns": None, "shaping": None, "netem": False}
        if shutil.which("ip") is None:
            result["netns"] = "the 'ip' command (iproute2) is not installed"
        else:
            name = f"{DEFAULT_PREFIX}-{os.getpid()}-{_next_id()}-probe"
            created = False
            try:
                _ip("netns", "add", name)
                created = True
                _ip("-n", name, "link", "add", "pa", "type", "veth", "peer", "name", "pb")
            except RuntimeError as exc:
                result["netns"] = f"cannot create network namespaces/veth pairs: {exc}"
            if created and result["netns"] is None:
                if shutil.which("tc") is None:
                    result["shaping"] = "the 'tc' command (iproute2) is not installed"
                else:
                    try:
                        _tc("-n", name, "qdisc", "add", "dev", "pa", "root",
                            *_tbf_args(10.0))
                    except RuntimeError as exc:
                        result["shaping"] = f"tbf rate limiting unavailable: {exc}"
                    res = _tc("-n", name, "qdisc", "add", "dev", "pb", "root",
                              "netem", "delay", "1ms", check=False)
                    result["netem"] = res.returncode == 0
            if created:
                _ip("netns", "del", name, check=False)
        if result["netns"] is not None:
            result["shaping"] = result["netns"]
        _probe_result = result
        return result


def netns_unavailable_reason() -> str | None:
    """None if namespaces and veth pairs can be created here, else a one-line reason."""
    return _probe()["netns"]


def shaping_unavailable_reason() -> str | None:
    """None if ``tc`` tbf rate limiting works inside a namespace, else a one-line reason."""
    return _probe()["shaping"]


def netem_available() -> bool:
    """Whether the kernel offers the netem qdisc (needed for emulated delay)."""
    return bool(_probe()["netem"])


# -------------------------------------------------------------------- shaping


def _tbf_args(rate_mbit: float) -> list[str]:
    if not rate_mbit > 0:
        raise ValueError(f"rate_mbit must be > 0, got {rate_mbit!r}")
    rate_bytes = rate_mbit * 1e6 / 8
    # The bucket must hold several full-size packets or tbf stalls; beyond that
    # it is kept to a few ms of traffic so short transfers still see the limit.
    burst = max(32 * 1024, int(rate_bytes * 0.004))
    rate_kbit = max(1, round(rate_mbit * 1000))
    return ["tbf", "rate", f"{rate_kbit}kbit", "burst", str(burst), "latency", "50ms"]


# ---------------------------------------------------------------- processes


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _netns_pids(name: str) -> list[int]:
    res = _ip("netns", "pids", name, check=False)
    if res.returncode != 0:
        return []
    return [int(tok) for tok in res.stdout.split() if tok.isdigit()]


def _kill_netns_pids(names: Sequence[str]) -> None:
    # Anything still inside a namespace we created descends from a process we
    # started there (possibly one that left its process group); it would keep
    # the namespace alive after `ip netns del`, so it has to go.
    for name in names:
        for pid in _netns_pids(name):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


# ------------------------------------------------------------------- hosts


class NetnsHosts:
    """``n_hosts`` emulated hosts on one bridged subnet, optionally rate limited.

    Use as a context manager; :meth:`close` also runs at interpreter exit so an
    exception cannot leave namespaces behind.

    Attributes:
        hosts: namespace names, one per host.
        ips: IPv4 address of each host (host ``i`` gets the subnet's ``i+1``-th address).
        switch: name of the namespace that holds the bridge.
        iface: name of each host's network interface (the same in every host).
        prefixlen: prefix length of the hosts' subnet.
    """

    def __init__(
        self,
        n_hosts: int,
        rate_mbit: float | None = None,
        prefix: str | None = None,
        subnet: str = "10.231.0.0/24",
        delay_ms: float | None = None,
    ) -> None:
        if n_hosts < 1:
            raise ValueError(f"n_hosts must be >= 1, got {n_hosts}")
        self._prefix = _check_prefix(prefix or DEFAULT_PREFIX)
        # Each instance has its own bridge, so equal subnets in parallel
        # instances cannot see each other; only the size must fit.
        net = ipaddress.IPv4Network(subnet, strict=False)
        if net.num_addresses - 2 < n_hosts:
            raise ValueError(f"subnet {subnet} is too small for {n_hosts} hosts")
        reason = netns_unavailable_reason()
        if reason is not None:
            raise RuntimeError(reason)
        if rate_mbit is not None:
            _tbf_args(rate_mbit)  # validate before creating anything
            reason = shaping_unavailable_reason()
            if reason is not None:
                raise RuntimeError(reason)
        if delay_ms is not None:
            if not delay_ms >= 0:
                raise ValueError(f"delay_ms must be >= 0, got {delay_ms!r}")
            if not netem_available():
                raise RuntimeError(
                    "delay_ms needs the netem qdisc, which this kernel does not provide "
                    "(only rate limiting via tbf is available)"
                )

        base = f"{self._prefix}-{os.getpid()}-{_next_id()}"
        self.switch = f"{base}-sw"
        self.hosts: list[str] = [f"{base}-h{i}" for i in range(n_hosts)]
        self.ips: list[str] = [str(net.network_address + i + 1) for i in range(n_hosts)]
        self.prefixlen = net.prefixlen
        self.iface = _HOST_IF
        self.rate_mbit: float | None = None
        self.delay_ms = delay_ms
        self._procs: list[subprocess.Popen] = []
        self._procs_lock = threading.Lock()
        self._created: list[str] = []
        self._closed = False
        atexit.register(self.close)
        try:
            self._build()
            if rate_mbit is not None or delay_ms is not None:
                self.set_rate(rate_mbit)
        except BaseException:
            self.close()
            raise

    # -- setup

    def _build(self) -> None:
        _ip("netns", "add", self.switch)
        self._created.append(self.switch)
        _ip("-n", self.switch, "link", "add", _BRIDGE, "type", "bridge")
        _ip("-n", self.switch, "link", "set", _BRIDGE, "up")
        for i, (host, addr) in enumerate(zip(self.hosts, self.ips)):
            port = f"p{i}"
            _ip("netns", "add", host)
            self._created.append(host)
            _ip("-n", host, "link", "add", _HOST_IF, "type", "veth",
                "peer", "name", port, "netns", self.switch)
            _ip("-n", self.switch, "link", "set", port, "master", _BRIDGE)
            _ip("-n", self.switch, "link", "set", port, "up")
            _ip("-n", host, "link", "set", "lo", "up")
            _ip("-n", host, "addr", "add", f"{addr}/{self.prefixlen}", "dev", _HOST_IF)
            _ip("-n", host, "link", "set", _HOST_IF, "up")

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("NetnsHosts is closed")

    # -- shaping

    def set_rate(self, rate_mbit: float | None) -> None:
        """Limit every host's link to ``rate_mbit`` in both directions; None removes it.

        Traffic from host A to host B passes A's ``eth0`` egress and B's switch
        port egress, so shaping both ends of every link caps any pair.
        """
        self._check_open()
        if rate_mbit is not None:
            tbf = _tbf_args(rate_mbit)
            reason = shaping_unavailable_reason()
            if reason is not None:
                raise RuntimeError(reason)
        else:
            tbf = None
        for i, host in enumerate(self.hosts):
            self._apply(host, _HOST_IF, tbf, self.delay_ms)
            # Delay goes on one side only so it is the one-way host-to-host delay.
            self._apply(self.switch, f"p{i}", tbf, None)
        self.rate_mbit = rate_mbit

    @staticmethod
    def _apply(ns: str, dev: str, tbf: list[str] | None, delay_ms: float | None) -> None:
        # Deleting first lets the qdisc kind change (tbf <-> netem+tbf <-> none);
        # it fails harmlessly when only the default qdisc is present.
        _tc("-n", ns, "qdisc", "del", "dev", dev, "root", check=False)
        if delay_ms is not None:
            _tc("-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:",
                "netem", "delay", f"{delay_ms:g}ms")
            if tbf is not None:
                _tc("-n", ns, "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:",
                    *tbf)
        elif tbf is not None:
            _tc("-n", ns, "qdisc", "add", "dev", dev, "root", *tbf)

    def set_pair_rate(self, a: int, b: int, rate_mbit: float | None) -> None:
        """Limit only the traffic between hosts a and b (both directions); None removes it.

        An htb qdisc on each of the two hosts' ``eth0`` sends packets for the other host
        through a rate-limited class and everything else through an unlimited one, so a job
        can have one slow path (say, between two trainers) beside fast ones.
        """
        self._check_open()
        for src, dst in ((a, b), (b, a)):
            ns = self._host(src)
            _tc("-n", ns, "qdisc", "del", "dev", _HOST_IF, "root", check=False)
            if rate_mbit is None:
                continue
            if not rate_mbit > 0:
                raise ValueError(f"rate_mbit must be > 0, got {rate_mbit!r}")
            rate = f"{max(1, round(rate_mbit * 1000))}kbit"
            _tc("-n", ns, "qdisc", "add", "dev", _HOST_IF, "root", "handle", "1:", "htb",
                "default", "10")
            _tc("-n", ns, "class", "add", "dev", _HOST_IF, "parent", "1:", "classid", "1:10",
                "htb", "rate", "10gbit")
            _tc("-n", ns, "class", "add", "dev", _HOST_IF, "parent", "1:", "classid", "1:20",
                "htb", "rate", rate, "ceil", rate)
            _tc("-n", ns, "filter", "add", "dev", _HOST_IF, "protocol", "ip", "parent", "1:",
                "prio", "1", "u32", "match", "ip", "dst", f"{self.ips[dst]}/32",
                "flowid", "1:20")

    # -- processes

    def _host(self, host_index: int) -> str:
        if not 0 <= host_index < len(self.hosts):
            raise IndexError(f"host_index {host_index} out of range 0..{len(self.hosts) - 1}")
        return self.hosts[host_index]

    def popen(
        self,
        host_index: int,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        **popen_kwargs: object,
    ) -> subprocess.Popen:
        """Start ``argv`` inside host ``host_index`` in its own process group.

        ``env`` replaces the environment as in :class:`subprocess.Popen`; None
        inherits ours.
        """
        self._check_open()
        name = self._host(host_index)
        if isinstance(argv, (str, bytes)):
            raise TypeError("argv must be a sequence of arguments, not a string")
        popen_kwargs.pop("start_new_session", None)
        with self._procs_lock:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", name, *[str(a) for a in argv]],
                env=dict(env) if env is not None else None,
                start_new_session=True,
                **popen_kwargs,
            )
            self._procs.append(proc)
        return proc

    def run(
        self,
        host_index: int,
        argv: Sequence[str],
        timeout: float,
        env: Mapping[str, str] | None = None,
        input: str | None = None,
        check: bool = False,
    ) -> subprocess.CompletedProcess:
        """Run ``argv`` in host ``host_index`` to completion, capturing text output.

        On timeout the whole process group is killed and
        :class:`subprocess.TimeoutExpired` is raised.
        """
        proc = self.popen(
            host_index, argv, env=env, text=True,
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        try:
            out, err = proc.communicate(input=input, timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc, signal.SIGKILL)
            proc.communicate()
            raise
        res = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        if check:
            res.check_returncode()
        return res

    def _stop_processes(self) -> None:
        with self._procs_lock:
            procs = list(self._procs)
        # A leader that has not been reaped keeps its PID (and so its process
        # group id) reserved, which makes signalling the group safe; reaped
        # leaders are covered by the namespace sweep below instead.
        live = terminate_groups([p for p in procs if p.returncode is None])
        for p in live:
            kill_group(p, signal.SIGKILL)
        _kill_netns_pids(self._created)
        for p in live:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    # -- teardown

    def close(self) -> None:
        """Kill processes started here and delete the namespaces. Idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        errors: list[str] = []
        try:
            self._stop_processes()
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            # Still remove the namespaces; the error is reported below.
            errors.append(str(exc))
        # Hosts first: deleting a host namespace destroys its veth pair, so the
        # bridge is empty by the time the switch goes.
        for name in reversed(self._created):
            res = _ip("netns", "del", name, check=False)
            if res.returncode != 0 and os.path.exists(f"/run/netns/{name}"):
                errors.append(f"ip netns del {name}: {' '.join(res.stderr.split())}")
        self._created.clear()
        if errors:
            raise RuntimeError("NetnsHosts cleanup failed: " + "; ".join(errors))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return (
            f"NetnsHosts(hosts={self.hosts!r}, ips={self.ips!r}, "
            f"rate_mbit={self.rate_mbit!r}, {state})"
        )


def kill_group(proc: subprocess.Popen, sig: int) -> None:
    """Send `sig` to the process group `proc` leads, unless `proc` has been reaped (its
    group id may then be another's)."""
    if proc.returncode is not None:
        return
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def terminate_groups(procs: list[subprocess.Popen],
                     grace_s: float = _KILL_GRACE_S) -> list[subprocess.Popen]:
    """SIGTERM the groups `procs` lead and give them `grace_s` together to end; returns
    `procs` (the caller SIGKILLs what is left, after any sweep of its own)."""
    for p in procs:
        kill_group(p, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        while p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
    return procs


# ------------------------------------------------------------------ cleanup


def cleanup_stale(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Delete namespaces named with ``prefix`` whose creating process is dead.

    Returns the names removed. Namespaces of live processes (including this
    one) are left alone, so this is safe to call while other tests run.
    """
    _check_prefix(prefix)
    if shutil.which("ip") is None:
        return []
    pattern = re.compile(rf"^{re.escape(prefix)}-(\d+)-\d+-(?:sw|h\d+|probe)$")
    res = _ip("netns", "list", check=False)
    if res.returncode != 0:
        return []
    removed = []
    for line in res.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = pattern.match(name)
        if not m or _pid_alive(int(m.group(1))):
            continue
        _kill_netns_pids([name])
        if _ip("netns", "del", name, check=False).returncode == 0:
            removed.append(name)
    return removed
