"""Emulated hosts in network namespaces: reachability, rate limiting, cleanup."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from shadowsync.cluster.netns import (
    NetnsHosts,
    cleanup_stale,
    netem_available,
    netns_unavailable_reason,
    shaping_unavailable_reason,
)

PORT = 5201

# Receives `nbytes`, then acknowledges with one byte so the sender's clock
# covers delivery, not just handing data to its own socket buffer.
SINK = r"""
import socket, sys
ip, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((ip, port))
srv.listen(1)
print("ready", flush=True)
conn, _ = srv.accept()
got = 0
while got < n:
    chunk = conn.recv(1 << 16)
    if not chunk:
        break
    got += len(chunk)
conn.sendall(b"k" if got == n else b"x")
conn.close()
"""

SOURCE = r"""
import socket, sys, time
ip, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
deadline = time.monotonic() + 10
while True:
    try:
        s = socket.create_connection((ip, port), timeout=5)
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.05)
s.settimeout(30)
payload = b"\0" * n
t0 = time.perf_counter()
s.sendall(payload)
ack = s.recv(1)
dt = time.perf_counter() - t0
assert ack == b"k", ack
print(dt)
"""

ECHO_SERVER = r"""
import socket, sys
srv = socket.socket()
srv.bind((sys.argv[1], int(sys.argv[2])))
srv.listen(1)
print("ready", flush=True)
conn, peer = srv.accept()
conn.sendall(conn.recv(100).upper() + b" from " + peer[0].encode())
conn.close()
"""

# Starts a sleeper in a new session (so outside our process group) with its
# output detached, so the caller's communicate() is not held open by it.
ESCAPER = r"""
import subprocess
p = subprocess.Popen(["sleep", "300"], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
print(p.pid)
"""

ECHO_CLIENT = r"""
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
s.sendall(b"hello")
print(s.recv(100).decode())
"""


@pytest.fixture
def netns_ok():
    reason = netns_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture
def shaping_ok(netns_ok):
    reason = shaping_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); only a running process counts here.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_ready(proc: subprocess.Popen) -> None:
    line = proc.stdout.readline()
    assert line.strip() == "ready", (line, proc.stderr.read() if proc.poll() is not None else "")


def _transfer_mbit(hosts: NetnsHosts, nbytes: int, src: int = 0, dst: int = 1) -> float:
    """Send `nbytes` from host `src` to host `dst` over TCP; returns the achieved Mbit/s."""
    sink = hosts.popen(
        dst, [sys.executable, "-c", SINK, hosts.ips[dst], str(PORT), str(nbytes)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        _wait_ready(sink)
        res = hosts.run(
            src, [sys.executable, "-c", SOURCE, hosts.ips[dst], str(PORT), str(nbytes)],
            timeout=40
        )
        assert res.returncode == 0, res.stderr
        assert sink.wait(timeout=10) == 0, sink.stderr.read()
    finally:
        sink.kill()
        sink.wait()
        sink.stdout.close()
        sink.stderr.close()
    return nbytes * 8 / float(res.stdout.strip()) / 1e6


@pytest.mark.timeout(60)
def test_unavailable_reason_is_none_or_one_line():
    reason = netns_unavailable_reason()
    assert reason is None or (isinstance(reason, str) and reason and "\n" not in reason)
    assert netns_unavailable_reason() == reason  # cached, same answer


@pytest.mark.timeout(60)
def test_tcp_crosses_link_and_close_removes_everything(netns_ok):
    with NetnsHosts(2) as hosts:
        names = list(hosts.hosts) + [hosts.switch]
        assert len(set(names)) == 3
        assert set(names) <= _namespaces()
        assert hosts.ips == ["10.231.0.1", "10.231.0.2"]
        server = hosts.popen(
            1, [sys.executable, "-c", ECHO_SERVER, hosts.ips[1], str(PORT)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        _wait_ready(server)
        res = hosts.run(
            0, [sys.executable, "-c", ECHO_CLIENT, hosts.ips[1], str(PORT)], timeout=20
        )
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == f"HELLO from {hosts.ips[0]}"
        assert server.wait(timeout=10) == 0
        server.stdout.close()
        server.stderr.close()
    assert not set(names) & _namespaces()
    hosts.close()  # idempotent


@pytest.mark.timeout(60)
def test_close_kills_started_processes(netns_ok):
    hosts = NetnsHosts(2)
    sleeper = hosts.popen(0, ["sleep", "300"])
    # A grandchild that leaves the process group is still inside the namespace.
    escaper = hosts.run(
        1,
        [sys.executable, "-c", ESCAPER],
        timeout=20,
    )
    grandchild = int(escaper.stdout.strip())
    assert _alive(sleeper.pid) and _alive(grandchild)
    assert os.getpgid(sleeper.pid) == sleeper.pid  # own group, killable by PID
    hosts.close()
    assert sleeper.poll() is not None
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)
    assert not set(hosts.hosts) & _namespaces()
    with pytest.raises(RuntimeError, match="closed"):
        hosts.popen(0, ["true"])


@pytest.mark.timeout(60)
def test_rate_limit_slows_transfer(shaping_ok):
    rate = 20.0
    with NetnsHosts(2) as hosts:
        free = _transfer_mbit(hosts, 4_000_000)
        hosts.set_rate(rate)
        limited = _transfer_mbit(hosts, 4_000_000)
        hosts.set_rate(None)
        free_again = _transfer_mbit(hosts, 4_000_000)
    print(f"unlimited {free:.0f} Mbit/s, limited {limited:.1f} Mbit/s, "
          f"unlimited again {free_again:.0f} Mbit/s")
    assert 0.25 * rate < limited < 1.5 * rate
    assert free > 5 * rate
    assert free_again > 5 * rate


@pytest.mark.timeout(60)
def test_rate_at_construction_shapes_both_ends(shaping_ok):
    with NetnsHosts(3, rate_mbit=20) as hosts:
        for i in range(len(hosts.hosts)):
            q_host = hosts.run(i, ["tc", "qdisc", "show", "dev", "eth0"], timeout=10).stdout
            q_port = subprocess.run(
                ["tc", "-n", hosts.switch, "qdisc", "show", "dev", f"p{i}"],
                capture_output=True, text=True, check=True,
            ).stdout
            assert "tbf" in q_host and "20Mbit" in q_host
            assert "tbf" in q_port and "20Mbit" in q_port
        hosts.set_rate(None)
        assert "tbf" not in hosts.run(0, ["tc", "qdisc", "show"], timeout=10).stdout
        assert hosts.rate_mbit is None


@pytest.mark.timeout(60)
def test_delay_needs_netem(netns_ok):
    if netem_available():
        with NetnsHosts(2, delay_ms=5) as hosts:
            assert "netem" in hosts.run(0, ["tc", "qdisc", "show"], timeout=10).stdout
    else:
        before = _namespaces()
        with pytest.raises(RuntimeError, match="netem"):
            NetnsHosts(2, delay_ms=5)
        assert _namespaces() == before


@pytest.mark.timeout(60)
def test_parallel_instances_do_not_collide(netns_ok):
    with NetnsHosts(2) as a, NetnsHosts(2) as b:
        assert not set(a.hosts + [a.switch]) & set(b.hosts + [b.switch])
        assert a.ips == b.ips  # separate bridges, so equal subnets are fine
        for hosts in (a, b):
            res = hosts.run(0, ["ip", "-4", "-o", "addr", "show", "eth0"], timeout=10)
            assert hosts.ips[0] in res.stdout


@pytest.mark.timeout(60)
def test_bad_arguments(netns_ok):
    with pytest.raises(ValueError):
        NetnsHosts(0)
    with pytest.raises(ValueError):
        NetnsHosts(5, subnet="10.231.0.0/30")
    with pytest.raises(ValueError):
        NetnsHosts(2, prefix="bad-prefix")
    with pytest.raises(ValueError):
        NetnsHosts(2, rate_mbit=0)
    with NetnsHosts(1) as hosts, pytest.raises(IndexError):
        hosts.popen(1, ["true"])


@pytest.mark.timeout(60)
def test_cleanup_stale_removes_only_dead_owners(netns_ok):
    prefix = f"sstest{os.getpid()}"
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"{prefix}-{dead.pid}-0-h0"
    live = f"{prefix}-{os.getpid()}-0-h0"
    for name in (stale, live):
        subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    try:
        removed = cleanup_stale(prefix)
        assert removed == [stale]
        names = _namespaces()
        assert stale not in names and live in names
    finally:
        for name in (stale, live):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


@pytest.mark.timeout(60)
def test_pair_rate_limits_one_path_and_leaves_the_others_fast(shaping_ok):
    with NetnsHosts(3) as hosts:
        hosts.set_pair_rate(1, 2, 20)
        slow = _transfer_mbit(hosts, 2_000_000, 1, 2)
        fast = _transfer_mbit(hosts, 2_000_000, 0, 2)
        hosts.set_pair_rate(1, 2, None)
        restored = _transfer_mbit(hosts, 2_000_000, 1, 2)
    assert slow < 30, slow
    assert fast > 100 and restored > 100, (fast, restored)
