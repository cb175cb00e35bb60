"""Hosts that share no /dev/shm and no disk (`cluster.hosts_apart`): each its own mount and UTS
namespace, torchrun with c10d rendezvous on each, as `docs/multi-host.md` says. The jobs take
minutes, so they run only when selected (`pytest -m hosts_apart`); all is skipped where
namespaces cannot be made."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shadowsync.cluster.hosts_apart import ApartHosts, apart_unavailable_reason
from shadowsync.cluster.parts import resolve
from shadowsync.cluster.shm_room import needed_here
from shadowsync.config import add_config_arguments, load_config
from shadowsync.lifecycle.attempts import alive
from tests.helpers import run_cli, summary

# One embedding server and three trainers on two hosts of two processes each: the embedding
# server and trainer 0 on the first (torchrun ranks hosts by name), trainers 1 and 2 on the
# second, as examples/two_hosts.sh places them.
JOB = ["--examples", "120000", "--table-size", "5000", "--embedding-servers", "1",
       "--trainers", "3", "--workers", "1", "--checkpoint-every", "24000", "--seed", "3",
       "--eval-points", "0", "--no-progress", "-q"]
SHM_LINE = "/dev/shm on ssync-h0 is too small for this job"


@pytest.fixture
def apart_ok():
    reason = apart_unavailable_reason()
    if reason is not None:
        pytest.skip(f"hosts apart cannot be emulated here: {reason}")


def torchrun(hosts: ApartHosts, args: list[str], port: int, restarts: int = 0) -> list:
    """One torchrun agent on each host (c10d rendezvous on the first host's name)."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(hosts.names)),
            "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-id", "job",
            "--rdzv-endpoint", f"{hosts.names[0]}:{port}", "--max-restarts", str(restarts),
            "-m", "shadowsync.run", *args]
    # Each host's processes bind the address its name resolves to: no interface is named.
    env = {k: v for k, v in os.environ.items() if k not in ("GLOO_SOCKET_IFNAME",
                                                            "TP_SOCKET_IFNAME")}
    return [hosts.popen(i, argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        text=True) for i in range(len(hosts.names))]


def finish(agents: list, timeout: float) -> list[tuple[int, str, float]]:
    """(exit status, stderr, seconds from now) of each agent."""
    t0, ends = time.monotonic(), []
    for agent in agents:
        _, err = agent.communicate(timeout=max(1.0, timeout - (time.monotonic() - t0)))
        ends.append((agent.returncode, err, time.monotonic() - t0))
    return ends


def rank_pid(hosts: ApartHosts, host: int, rank: int) -> int | None:
    """The process of torchrun rank `rank` on host `host` (not its Hogwild workers)."""
    for pid in hosts.processes(host):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
            env = Path(f"/proc/{pid}/environ").read_text().split("\0")
        except OSError:
            continue
        if "shadowsync.run" in argv and "torch.distributed.run" not in argv \
                and f"RANK={rank}" in env:
            return pid
    return None


def config_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    return parser


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(60)
def test_each_host_has_its_name_shm_and_disk_and_close_ends_everything(apart_ok, tmp_path):
    own = tmp_path / "own"
    hosts = ApartHosts(2, shm_bytes=[8 * 2**20, 16 * 2**20], own=[own])
    try:
        for i in range(2):
            res = hosts.run(i, ["sh", "-c", f"hostname; df -B1 --output=size /dev/shm | tail -1;"
                                f" getent hosts ssync-h0 ssync-h1; hostname > {own}/me"],
                            timeout=20)
            lines = res.stdout.split("\n")
            assert res.returncode == 0, res.stderr
            assert lines[0] == f"ssync-h{i}" and int(lines[1]) == (8, 16)[i] * 2**20
            assert lines[2].split() == ["127.0.1.1", "ssync-h0"]
            assert lines[3].split() == ["127.0.1.2", "ssync-h1"]
            assert (hosts.own_dir(i, own) / "me").read_text() == f"ssync-h{i}\n"
        assert not (own / "me").exists()  # each wrote to its own disk
        # A process that leaves its session (torchrun's workers do) still ends with the host.
        escaped = hosts.popen(1, ["setsid", "sleep", "300"])
        deadline = time.monotonic() + 10
        while not hosts.processes(1) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = hosts.processes(1)
        assert left and hosts.processes(0) == []
    finally:
        hosts.close()
    assert escaped.poll() is not None
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in left) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in left)  # a zombie waits for init: it has ended
    assert not hosts.root.exists()


@pytest.mark.timeout(60)
def test_hosts_apart_in_network_namespaces_resolve_each_other_there(apart_ok, tmp_path):
    from shadowsync.cluster.netns import NetnsHosts, netns_unavailable_reason

    if netns_unavailable_reason() is not None:
        pytest.skip(netns_unavailable_reason())
    with NetnsHosts(2) as net, ApartHosts(2, net=net) as hosts:
        assert hosts.addrs == net.ips
        res = hosts.run(1, ["sh", "-c", "hostname; getent hosts ssync-h0; ip -4 -o addr show eth0"],
                        timeout=20)
    name, resolved, addr = res.stdout.splitlines()
    assert name == "ssync-h1" and resolved.split() == [net.ips[0], "ssync-h0"]
    assert f"{net.ips[1]}/" in addr


@pytest.mark.hosts_apart
@pytest.mark.timeout(240)
def test_a_dev_shm_too_small_for_a_local_job_is_refused_before_it_starts(apart_ok, tmp_path):
    """On one host, `shadowsync train` says so before it starts any process; with a /dev/shm
    of what the check asks for, the same job runs (the estimate is not short: no SIGBUS)."""
    job = [*JOB, "--examples", "5000", "--trainers", "2"]
    cfg = resolve(load_config(config_parser().parse_args(job)))
    needed = needed_here(cfg, cfg.distributed)
    train = [sys.executable, "-m", "shadowsync.cli", "train", *job, "--out"]
    with ApartHosts(2, shm_bytes=[needed // 2, needed + 2**19], prefix="ssync-one") as hosts:
        small = hosts.run(0, [*train, str(tmp_path / "small")], timeout=90)
        fits = hosts.run(1, [*train, str(tmp_path / "fits")], timeout=140)
    assert small.returncode == 2, small.stderr
    line = small.stderr.strip().splitlines()[-1]
    assert line.startswith("shadowsync: error: /dev/shm on ssync-one0 is too small"), line
    assert f"need {needed:,} bytes" in line and "--shm-size=" in line and "medium: Memory" in line
    assert not (tmp_path / "small" / "summary.json").exists()
    assert fits.returncode == 0, fits.stderr[-2000:]
    assert summary(tmp_path / "fits")["examples"] == 5000


@pytest.mark.hosts_apart
@pytest.mark.timeout(200)
def test_a_small_dev_shm_on_the_embedding_servers_host_ends_every_agent(apart_ok, tmp_path):
    """8 MB of /dev/shm where the embedding server's tables (8.8 MB) go: every rank of both
    hosts ends with the one line naming /dev/shm, each agent non-zero, no bus error, nothing
    left running."""
    out = tmp_path / "run"
    with ApartHosts(2, shm_bytes=[8 * 2**20, 64 * 2**20]) as hosts:
        ends = finish(torchrun(hosts, [*JOB, "--out", str(out)], free_port()), timeout=150)
        left = hosts.processes(0) + hosts.processes(1)
    for status, err, seconds in ends:
        print(f"agent exit {status} after {seconds:.1f} s")
        assert status != 0 and seconds < 120, (status, seconds, err[-2000:])
        assert "SIGBUS" not in err and "Bus error" not in err
        lines = [ln for ln in err.splitlines() if SHM_LINE in ln]
        assert lines and lines[0].startswith(f"shadowsync: error: {SHM_LINE}"), err[-2000:]
        print(lines[0])
    assert left == []
    assert SHM_LINE in (out / "error.txt").read_text()


@pytest.mark.hosts_apart
@pytest.mark.timeout(420)
def test_shared_out_survives_kill_9_of_a_rank_on_the_second_host(apart_ok, tmp_path):
    """A shared --out, torchrun --max-restarts 2, kill -9 of trainer 2 (second host) after the
    first checkpoint: both agents exit 0, the job resumed from that step, its eval NE is
    within 2% of the same job run on one machine, and no staging directory is left."""
    clean = run_cli(["train", *JOB, "--out", str(tmp_path / "clean")], timeout=150)
    assert clean.returncode == 0, clean.stderr[-2000:]
    out = tmp_path / "shared"
    steps = out / "checkpoint"
    with ApartHosts(2) as hosts:
        agents = torchrun(hosts, [*JOB, "--out", str(out)], free_port(), restarts=2)
        killed, deadline = None, time.monotonic() + 200
        while killed is None and time.monotonic() < deadline:
            assert all(a.poll() is None for a in agents), "the job ended before its first save"
            if any((p / "manifest.json").is_file() for p in steps.glob("step-*")):
                killed = rank_pid(hosts, 1, 3)
                os.kill(killed, signal.SIGKILL)
            time.sleep(0.05)
        assert killed is not None, "no checkpoint published in time"
        ends = finish(agents, timeout=300)
        left = hosts.processes(0) + hosts.processes(1)
    assert [status for status, _, _ in ends] == [0, 0], [err[-2000:] for _, err, _ in ends]
    assert left == []
    s, c = summary(out), summary(tmp_path / "clean")
    print(f"resumed at {s['resumed_examples']} after {s['restarts']} restart(s); eval NE "
          f"{s['eval_ne']:.4f}, clean local run {c['eval_ne']:.4f}")
    assert s["restarts"] >= 1 and s["resumed_examples"] > 0 and s["examples"] == 120000
    assert abs(s["eval_ne"] / c["eval_ne"] - 1) < 0.02
    assert not [p.name for p in steps.iterdir() if p.name.startswith(".tmp-")]


@pytest.mark.hosts_apart
@pytest.mark.timeout(200)
def test_an_out_on_each_hosts_own_disk_is_refused_before_training(apart_ok, tmp_path):
    """--out on each host's own disk (Kubernetes without a shared volume, SLURM node-local
    scratch): refused in one line naming --out before anything trains; nothing published."""
    out = tmp_path / "run"
    with ApartHosts(2, own=[out]) as hosts:
        ends = finish(torchrun(hosts, [*JOB, "--out", str(out)], free_port()), timeout=150)
        left = hosts.processes(0) + hosts.processes(1)
        dirs = [hosts.own_dir(i, out) for i in range(2)]
        published = [p for d in dirs for p in d.glob("checkpoint/step-*")]
        summaries = [d / "summary.json" for d in dirs if (d / "summary.json").exists()]
    for status, err, seconds in ends:
        lines = [ln for ln in err.splitlines() if ln.startswith("shadowsync: error: --out")]
        print(f"agent exit {status} after {seconds:.1f} s: {lines[:1]}")
        assert status != 0 and lines, err[-2000:]
    assert left == [] and published == [] and summaries == []
