"""`bench hosts`: its variants, ratios and the derived cost of a link delay in process; one small
job per placement on two emulated hosts behind the `hosts_apart` marker."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from shadowsync.bench import hosts as bench
from shadowsync.bench.faults import session_pids as session_processes
from shadowsync.bench.hosts import DELAY_MS, Variant, delay_cost, plan, ratios_of
from tests.helpers import start_cli


def test_plan_runs_one_host_beside_every_placement_and_depth():
    names = [v.name for v in plan((2, 4), (0, 1, 2))]
    assert names == ["h2-one-host", "h2-first-d0", "h2-first-d1", "h2-first-d2",
                     "h2-per-host-d0", "h2-per-host-d1", "h2-per-host-d2",
                     "h4-one-host", "h4-first-d2", "h4-per-host-d0", "h4-per-host-d1",
                     "h4-per-host-d2"]
    cfg = Variant(4, True, "per-host", 1).config(20_000)
    assert (cfg.cluster.embedding_servers, cfg.cluster.trainers) == (4, 4)
    assert cfg.cluster.embedding_placement == "per-host" and cfg.cluster.prefetch == "1"
    assert Variant(2, False).config(20_000).cluster.prefetch == "auto"


def _runs(**by_variant: list[tuple[float, float, float]]) -> list[dict]:
    """(eps, eval NE, step ms) per repeat of each variant (names with _ for -); a worker's CPU
    a step is the step less 10% one host, 30% spread."""
    return [{"variant": name.replace("_", "-"), "repeat": r, "eps": eps,
             "eps_per_trainer": eps / 2, "eval_ne": ne, "step_ms": step,
             "worker_cpu_ms_per_step": step * (0.9 if "one_host" in name else 0.7)}
            for name, values in by_variant.items() for r, (eps, ne, step) in enumerate(values)]


def test_ratios_are_per_repeat_against_the_one_host_runs():
    runs = _runs(h2_one_host=[(100.0, 0.80, 5.0), (120.0, 0.82, 5.0), (110.0, 0.81, 5.0)],
                 h2_first_d1=[(99.0, 0.815, 5.0), (96.0, 0.83, 5.0), (121.0, 0.80, 5.0)])
    variants = [Variant(2, False), Variant(2, True, "first", 1)]
    ratios, spreads = ratios_of(runs, variants)
    assert ratios["two_hosts_first_vs_one_host_d1"] == pytest.approx(99.0 / 110.0)
    assert spreads["two_hosts_first_vs_one_host_d1"] == pytest.approx([0.8, 1.1])
    assert ratios["two_hosts_first_ne_vs_one_host_d1"] == pytest.approx(0.815 / 0.81)
    assert ratios["two_hosts_first_ne_within_one_host_spread_d1"] == 1.0  # 0.80 <= 0.815 <= 0.82
    # the one-host worker's CPU a step (0.9 x 5.0) over the spread one's (0.7 x 5.0)
    assert ratios["two_hosts_first_worker_cpu_vs_one_host_d1"] == pytest.approx(0.9 / 0.7)
    for r in runs:
        r["link_bytes_per_step"] = 0.0 if r["variant"] == "h2-one-host" else 1e5
    _, extra = bench.summary_of(runs, variants)
    rows = extra["tables"][0]["rows"]
    assert [row[0] for row in rows] == ["h2-one-host", "h2-first-d1"]
    assert rows[1][4:8] == [99, 50, "0.8150 (0.8000 to 0.8300)", 100_000]  # medians
    assert extra["goals"] == {"two_hosts_first_vs_one_host_d1": bench.GOALS[
        "two_hosts_first_vs_one_host_d1"]}


def test_a_delay_costs_a_round_trip_at_depth_0_and_what_no_step_hides_beyond():
    """Depth 0: 2 x 0.2 ms a step. Depth d: the round trip r (what depth 0 exposes: t0 - t)
    plus 2 x 0.2 ms, less d steps of t, when positive."""
    runs = _runs(h2_first_d0=[(1.0, 0.8, 6.0)], h2_first_d1=[(1.0, 0.8, 4.0)],
                 h2_first_d2=[(1.0, 0.8, 1.0)])
    variants = [Variant(2, True, "first", d) for d in (0, 1, 2)]
    cost = delay_cost(runs, variants)
    assert cost["h2-first-d0"]["added_ms"] == pytest.approx(2 * DELAY_MS)
    assert cost["h2-first-d0"]["eps_factor"] == pytest.approx(6.0 / 6.4)
    assert cost["h2-first-d1"]["added_ms"] == 0.0  # r = 2 ms, 2.4 ms hidden in a 4 ms step
    assert cost["h2-first-d2"]["added_ms"] == pytest.approx(5.0 + 0.4 - 2.0)  # r = 5 ms


@pytest.mark.hosts_apart
@pytest.mark.timeout(600)
def test_per_host_placement_sends_about_half_the_rows_over_the_link(tmp_path):
    """Two emulated hosts (own /dev/shm, own network namespace, 1 Gbit/s), 2 embedding
    servers and 2 trainers: `first` puts both servers on host 0, so the trainers on host 1
    fetch every row over the link; `per-host` gives each host one server, whose rows its
    trainer maps, so about half the bytes cross (no dense sync: its rounds would cross the
    link only where the trainers are apart). Both train to the same quality."""
    reason = bench.unavailable()
    if reason:
        pytest.skip(reason)
    os.environ[bench.RPC_CHANNELS_ENV] = "basic"
    try:
        with bench.NetnsHosts(2, rate_mbit=bench.LINK_MBIT) as net, \
                bench.ApartHosts(2, shm_bytes=2**30, net=net, prefix="ssync-t") as apart:
            got = {p: bench.run_variant(apart, Variant(2, True, p, 0), 30_000,
                                        tmp_path / p, table_size=5000, sync="none")
                   for p in ("first", "per-host")}
    finally:
        os.environ.pop(bench.RPC_CHANNELS_ENV, None)
    first, per_host = got["first"], got["per-host"]
    assert first["examples"] == per_host["examples"] == 30_000
    assert first["link_bytes_per_step"] > 50_000  # rows and gradients of a batch
    assert 0.3 < per_host["link_bytes_per_step"] / first["link_bytes_per_step"] < 0.7
    assert abs(per_host["eval_ne"] - first["eval_ne"]) < 0.02
    log = (tmp_path / "per-host" / "host0.log").read_text()
    assert "per-host placement on 2 host(s): host 0: emb0=0 trainer0=1; host 1: emb1=2 " \
           "trainer1=3" in log


def _namespaces_of(pid: int) -> dict[str, list[int]]:
    """The network namespaces process `pid` made (named `...-PID-...`) and the processes
    in each."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found = [line.split()[0] for line in names.splitlines() if f"-{pid}-" in line]
    return {ns: [int(p) for p in subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                                                text=True).stdout.split()] for ns in found}


@pytest.mark.timeout(180)
def test_sigterm_mid_run_ends_the_bench_its_namespaces_and_their_processes(tmp_path):
    """SIGTERM's default would end the bench at once, leaving its network namespaces and the
    job's processes in them running: it stops the bench as Ctrl-C does, with one line."""
    reason = bench.unavailable()
    if reason:
        pytest.skip(f"emulated hosts unavailable: {reason}")
    out = tmp_path / "bench"
    proc = start_cli(["bench", "hosts", "--examples", "10000", "--repeats", "1", "--hosts", "2",
                      "--depths", "0", "--out", str(out)])
    running: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not running and proc.poll() is None and time.monotonic() < deadline:
            running = [p for pids in _namespaces_of(proc.pid).values() for p in pids]
            time.sleep(0.2)
        assert running, "no job ran on the emulated hosts"
        proc.send_signal(signal.SIGTERM)  # to the bench alone, as a supervisor sends it
        _, err = proc.communicate(timeout=60)
    finally:
        for pid in session_processes(proc.pid):
            os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGTERM
    assert err.strip().splitlines()[-1] == (f"shadowsync: stopped by SIGTERM; what it finished "
                                            f"is kept in {out}")
    assert _namespaces_of(proc.pid) == {}
    time.sleep(1)
    assert [p for p in running if os.path.exists(f"/proc/{p}")] == []
