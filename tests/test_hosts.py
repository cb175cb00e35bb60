"""The README's torchrun command line across emulated hosts: one embedding server and two
trainers, each in its own network namespace, syncing in the background over veth links."""

from dataclasses import replace

import pytest

from shadowsync.bench.common import Job
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


def test_slow_net_only_runs_the_namespace_hosts_part_alone(tmp_path, monkeypatch):
    """`bench sync --slow-net-only`: no loopback run, the namespace part on at most
    SLOW_NET_EXAMPLES, and bench.json with its ratios and their goals."""
    import json

    from shadowsync.bench import slow_net, sync

    seen = {}

    def fake_slow_net(job, repeats, full=False, torchft=False):
        seen.update(examples=job.base.data.examples, repeats=repeats, full=full)
        return {"runs": [], "ratios": {"background_vs_ddp_slow_net": 4.0},
                "spreads": {"background_vs_ddp_slow_net": [3.5, 4.5]}}

    monkeypatch.setattr(slow_net, "run_slow_net", fake_slow_net)
    monkeypatch.setattr(sync, "_on_loopback", lambda *a, **k: pytest.fail("ran on loopback"))
    sync.run_sync_bench(str(tmp_path), examples=20_000, repeats=2, full=True,
                        slow_net_only=True)
    assert seen == {"examples": 20_000, "repeats": 2, "full": True}
    bench = json.loads((tmp_path / "bench.json").read_text())
    assert bench["runs"] == [] and bench["ratios"] == {"background_vs_ddp_slow_net": 4.0}
    assert bench["goals"] == {"background_vs_ddp_slow_net": ">= 3"}
    assert bench["ratio_spread"]["background_vs_ddp_slow_net"] == [3.5, 4.5]


@pytest.mark.parametrize("full", [False, True])
def test_every_link_ratio_compares_variants_that_run_and_background_is_s_ma(full, tmp_path):
    """The namespace part runs what its ratios divide, each peer after the s-ma run whose
    rate it copies, and "background" means s-ma on every link as on loopback."""
    from shadowsync.bench.slow_net import GIGABIT_MBIT, LINK_RATIOS, SLOW_MBIT, at, link_variants

    names = [name for name, _, _ in link_variants(Job(tmp_path, job(1000)), full=full,
                                                   torchft=True)]
    assert len(names) == len(set(names))
    assert {"s-ma@unlimited", "s-ma@50mbit", "ddp@50mbit", "torch-fr-ma@50mbit",
            "torchft-ma@50mbit"} <= set(names)
    assert "s-bmuf@50mbit" not in names or full  # nothing the default's ratios do not read
    for rate in (SLOW_MBIT, GIGABIT_MBIT) if full else (SLOW_MBIT,):
        for ratio, num, den in LINK_RATIOS:
            if ratio.startswith("background"):
                assert num == "s-ma"
            if full or {num, den} <= {"s-ma", "ddp", "torch-fr-ma", "torchft-ma"}:
                assert f"{num}{at(rate)}" in names and f"{den}{at(rate)}" in names, ratio
        ma = names.index(f"s-ma{at(rate)}")
        assert all(names.index(f"{peer}{at(rate)}") > ma for peer in ("torch-fr-ma", "torchft-ma"))
    assert ("ddp@unlimited" in names) == full


def test_ddp_on_a_limited_link_runs_a_third_of_the_examples(tmp_path):
    """Its EPS there is steady from the first step; every other run keeps the job's length."""
    from shadowsync.bench.slow_net import link_variants

    variants = link_variants(Job(tmp_path, job(3000)), True, False)
    examples = {name: changes.get("examples", 3000) for name, changes, _ in variants
                if not callable(changes)}  # the peers' changes follow s-ma's run, full length
    assert examples.pop("ddp@50mbit") == examples.pop("ddp@1000mbit") == 1000
    assert set(examples.values()) == {3000}, examples
