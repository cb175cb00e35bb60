"""Real multi-process jobs on loopback: servers over RPC, trainers syncing in the background."""

import pytest

from tests.helpers import run_cli, summary

SMALL = ["--examples", "60000", "--batch-size", "256", "--no-progress", "--eval-points", "2",
         "--table-size", "20000"]


@pytest.mark.timeout(240)
def test_two_trainers_one_server_background_bmuf_converges(tmp_path):
    out = tmp_path / "run"
    res = run_cli(["train", "--trainers", "2", "--workers", "1", "--embedding-servers", "1",
                   "--sync", "s-bmuf", "--sync-interval", "0.05", "--out", str(out), *SMALL],
                  timeout=200)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.leftover == []
    s = summary(out)
    assert s["trainers"] == 2 and s["sync"] == "s-bmuf"
    assert s["examples"] == 60000 - 60000 % 512 or s["examples"] >= 59000
    assert s["syncs_per_min"] > 60  # a round every 0.05 s, minus start-up
    assert s["sync_blocked_fraction"] == 0.0  # background: workers never wait
    assert s["eval_ne"] < 0.97  # learned something real: NE 1.0 is the mean-CTR predictor
