"""The typed signal of a diverged training: raised by the worker's loss check, carried out of a
role process as exit status EXIT_DIVERGED, turned back into `TrainingDiverged` by the
launcher, and acted on (rollback) by its type, never by the words of a message."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from shadowsync import api
from shadowsync.cluster import job
from shadowsync.cluster.failures import ERROR_FILE, job_error
from shadowsync.config import config_from_options
from shadowsync.errors import PeerLost, UserError
from shadowsync.lifecycle import attempts
from shadowsync.lifecycle.exits import (
    EXIT_DIVERGED,
    EXIT_FAILED,
    EXIT_USER,
    TrainingDiverged,
    exit_status,
)
from shadowsync.train.worker import check_loss
from tests.helpers import run_cli, run_python


def test_exit_statuses_say_what_failed():
    assert (EXIT_FAILED, EXIT_USER, EXIT_DIVERGED) == (1, 2, 3)
    assert exit_status(TrainingDiverged("x")) == EXIT_DIVERGED
    assert exit_status(PeerLost("x")) == EXIT_USER == exit_status(UserError("x"))
    assert exit_status(RuntimeError("x")) == EXIT_FAILED
    # To the user a divergence is one line and status 2, like every bad-input error.
    assert isinstance(TrainingDiverged("x"), UserError) and TrainingDiverged.exit_code == 2


@pytest.mark.parametrize("loss", [float("nan"), float("inf"), 1e6])
def test_a_diverging_loss_raises_the_typed_signal(loss):
    spec = SimpleNamespace(trainer=1, worker=0)
    with pytest.raises(TrainingDiverged):
        check_loss(loss, 10, spec, seen=100)
    check_loss(6.9, 10, spec, seen=100)  # a plain loss passes


def test_the_launcher_turns_the_status_back_into_the_type(tmp_path):
    # Other processes end by the agent's SIGTERM (-15) or as lost peers (2).
    assert isinstance(job_error("boom", [-15, EXIT_DIVERGED, 2]), TrainingDiverged)
    # The words alone are not the signal.
    plain = job_error("training diverged: loss is nan", [EXIT_USER, -15])
    assert type(plain) is UserError and str(plain) == "training diverged: loss is nan"
    attempts.reset(tmp_path)
    assert attempts.refused_status(tmp_path) is None
    attempts.refuse_restart(tmp_path, EXIT_DIVERGED)  # kept for a restarted attempt
    assert attempts.restart_refused(tmp_path)
    assert attempts.refused_status(tmp_path) == EXIT_DIVERGED


def _fake_run(monkeypatch, tmp_path, first_error):
    calls = []

    def run_once(cfg):
        calls.append(cfg)
        if len(calls) == 1:
            raise first_error
        return cfg, {"out": str(tmp_path)}

    monkeypatch.setattr(job, "run_once", run_once)
    monkeypatch.setattr(job, "last_good",
                        lambda checkpoint, out: tmp_path / "checkpoint" / "step-8")
    return calls


def test_rollback_acts_on_the_type_not_the_words(monkeypatch, tmp_path):
    cfg = config_from_options(None, out=str(tmp_path), on_divergence="rollback", lr=0.1)
    calls = _fake_run(monkeypatch, tmp_path, TrainingDiverged("worker 0: it blew up"))
    _, summary = api.run(cfg)
    assert len(calls) == 2
    assert calls[1].checkpoint.resume == str(tmp_path / "checkpoint" / "step-8")
    assert calls[1].optim.lr == pytest.approx(0.05)
    assert summary["rollbacks"][0]["error"] == "worker 0: it blew up"
    assert json.loads((tmp_path / "summary.json").read_text())["rollbacks"]

    # A plain UserError that merely says so is no divergence: no rollback.
    calls = _fake_run(monkeypatch, tmp_path, UserError("training diverged: loss is nan"))
    with pytest.raises(UserError, match="training diverged"):
        api.run(cfg)
    assert len(calls) == 1


ROLE = """
import sys
import shadowsync.cluster.roles as roles
from shadowsync.config import config_from_options
from shadowsync.lifecycle import attempts
from shadowsync.lifecycle.exits import TrainingDiverged

def diverge(task, data, layout):
    raise TrainingDiverged("training diverged: loss is nan in trainer 0 worker 0")

roles.import_ahead = diverge
attempts.reset(sys.argv[1])
roles.role_main(config_from_options(None, out=sys.argv[1], log_level="warning"))
"""


@pytest.mark.timeout(120)
def test_a_diverged_role_process_ends_with_the_diverged_status(tmp_path):
    res = run_python(["-c", textwrap.dedent(ROLE), str(tmp_path)], timeout=100,
                     env={"RANK": "0", "WORLD_SIZE": "1"})
    assert res.returncode == EXIT_DIVERGED, res.stderr[-2000:]
    assert res.leftover == []
    line = (Path(tmp_path) / ERROR_FILE).read_text().splitlines()[0]
    assert line.startswith("training diverged: loss is nan")
    assert attempts.refused_status(tmp_path) == EXIT_DIVERGED  # a restart would repeat it


# Trainer 0 saves on its ticks (every 0.1 s), and this job trains 10,000 examples or more in
# one: the NaN comes late enough that a save before it does not depend on the machine's load.
CLUSTER = ["--trainers", "2", "--embedding-servers", "1", "--sync", "s-bmuf", "--no-progress",
           "--table-size", "2000", "--eval-points", "0", "-q", "--examples", "150000",
           "--checkpoint-every", "10000", "--inject-nan-at", "120000", "--log-every", "10000",
           "--keep-checkpoints", "100"]


@pytest.mark.timeout(300)
def test_a_cluster_that_diverges_rolls_back_through_the_exit_status(tmp_path):
    """The NaN is met in a worker of a trainer process of a launched job: only its exit
    status reaches the launcher, which must raise the type the rollback acts on."""
    res = run_cli(["train", *CLUSTER, "--on-divergence", "rollback", "--out",
                   str(tmp_path / "rb")], timeout=260)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.leftover == []
    s = json.loads((tmp_path / "rb" / "summary.json").read_text())
    assert len(s["rollbacks"]) == 1 and s["rollbacks"][0]["error"].startswith("training diverged")
    assert 0 < s["resumed_examples"] and s["examples"] == 150000
    # The checkpoint gone back to holds trainer 0 from before its poisoned step (the job's
    # count can be past 120,000 then: trainer 1 may run ahead of trainer 0).
    back = json.loads((Path(s["rollbacks"][0]["checkpoint"]) / "manifest.json").read_text())
    poisoned_step = 120000 // (2 * s["config"]["batch_size"])
    assert 0 < back["positions"]["trainer0"][0] <= poisoned_step
