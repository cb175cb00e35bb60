"""The README's torchrun command line across emulated hosts: one embedding server and two
trainers, each in its own network namespace, syncing in the background over veth links."""

from dataclasses import replace

import pytest

from shadowsync.bench.slow_net import run_on_hosts
from shadowsync.bench.sync import job
from shadowsync.cluster.netns import NetnsHosts, netns_unavailable_reason


@pytest.mark.timeout(240)
def test_background_bmuf_across_namespace_hosts(tmp_path):
    reason = netns_unavailable_reason()
    if reason:
        pytest.skip(f"network namespaces unavailable: {reason}")
    cfg = replace(job(30_000, table_size=5000), sync="s-bmuf", sync_interval="0.05")
    with NetnsHosts(3) as hosts:
        hosts.set_pair_rate(1, 2, 50)  # trainers talk over a 50 Mbit/s path
        s = run_on_hosts(hosts, cfg, tmp_path / "run", timeout=180)
    assert s["trainers"] == 2 and s["examples"] >= 29_000
    assert all(n > 10 for n in s["syncs"]), s["syncs"]
    assert s["eval_ne"] < 1.0
