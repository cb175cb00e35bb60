"""Killed processes (--max-restarts) and the faults bench, on a tiny job: a trainer killed
with kill -9 mid-run, the job restarts once from its newest checkpoint, finishes every
example and reaches about the clean run's NE; the bench reports it and its memory soak."""

from __future__ import annotations

import json

import pytest

from shadowsync.bench.faults import run_faults_bench


@pytest.mark.timeout(400)
def test_kill_9_of_a_trainer_restarts_the_job_which_completes(tmp_path):
    path = run_faults_bench(tmp_path, examples=60_000, scenarios=("kill-trainer",),
                            soak_s=5, timeout=240)
    bench = json.loads(path.read_text())
    (killed,) = [r for r in bench["runs"] if r["name"] == "kill-trainer"]
    assert killed["killed"] and killed["exit_code"] == 0, killed
    assert killed["restarts"] == 1, killed
    assert killed["recovered"], killed
    (sc,) = bench["scenarios"]
    assert sc["name"] == "kill-trainer" and sc["recovered"]
    # Lost: what the failed attempt trained past the checkpoint it went back to.
    assert 0 <= sc["examples_lost"] <= bench["checkpoint_every_examples"] + 2 * 8192
    assert sc["recovery_s"] > 0
    assert sc["eval_ne_vs_clean"][0] == pytest.approx(1.0, abs=0.02)
    soak = bench["soak"]
    assert soak["processes"] == 5  # 1 embedding server, 2 trainers, 2 workers
    assert soak["rss_growth"] is not None and soak["rss_growth"] < 0.5, soak
    for run in tmp_path.iterdir():
        if (run / ".attempts" / "pids").exists():
            from shadowsync.train.attempts import processes

            left = [pid for _, _, pid in processes(run) if _alive(pid)]
            assert not left, (run, left)
    assert not (tmp_path / "soak-data").exists()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


