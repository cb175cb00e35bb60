"""shadowsync.train(): the Python API runs the CLI's job, with the user's model and arrays."""

from __future__ import annotations

import json
import math
import textwrap

import pytest

from tests.conftest import write_array_dir
from tests.helpers import run_python

API_RUN = """
import json, sys
import shadowsync
from tests.helpers import two_layer_mlp

result = shadowsync.train(data=sys.argv[1], out=sys.argv[2], model=two_layer_mlp,
                          trainers=2, sync="s-bmuf", table_size=[50, 60, 70],
                          eval_points=2, log_every=10_000)
json.dump({"eval_ne": result.summary["eval_ne"], "out": str(result.out),
           "trainers": result.summary["trainers"], "sync": result.summary["sync"],
           "config": shadowsync.TrainConfig.__name__ == type(result.config).__name__}, sys.stdout)
"""


@pytest.mark.timeout(180)
def test_train_with_own_model_on_arrays_over_two_trainers(tmp_path):
    data = write_array_dir(tmp_path / "arrays", rows=40_000, num_dense=5, num_tables=3)
    out = tmp_path / "run"
    res = run_python(["-c", textwrap.dedent(API_RUN), str(data), str(out)], timeout=150)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.leftover == []
    got = json.loads(res.stdout)
    assert got["out"] == str(out) and got["trainers"] == 2 and got["sync"] == "s-bmuf"
    assert math.isfinite(got["eval_ne"]) and got["eval_ne"] < 1.0  # beats the mean click rate
    # Not a terminal: log lines, but no progress bar redrawing itself.
    assert "\r" not in res.stderr and "ex/s" not in res.stderr
    assert "shadowsync[launcher] INFO" in res.stderr

    # The run's config.toml reads back into the configuration it ran with.
    from shadowsync.cli import build_parser
    from shadowsync.config import load_config

    args = build_parser().parse_args(["train", "--config", str(out / "config.toml")])
    cfg = load_config(args)
    # A function is recorded by where it is defined (tests.helpers re-exports bench short's).
    assert cfg.model.name == "shadowsync.bench.short:two_layer_mlp"
    assert cfg.model.table_size == [50, 60, 70]
    assert cfg.cluster.trainers == 2 and cfg.cluster.dense_servers == 0
    assert cfg.output.dir == str(out)


def test_options_are_checked_before_anything_runs():
    import shadowsync
    from shadowsync.errors import UserError

    with pytest.raises(UserError, match="unknown option 'trainer'; did you mean 'trainers'"):
        shadowsync.train(trainer=2)
    with pytest.raises(UserError, match="--workers must be positive"):
        shadowsync.train(workers=0)


def test_import_is_light():
    res = run_python(["-c", "import sys, shadowsync; print('torch' in sys.modules)"], timeout=30)
    assert res.stdout.strip() == "False"


def test_train_stays_the_function_after_the_train_package_is_imported():
    import shadowsync
    import shadowsync.train.trainer  # noqa: F401  (what every run imports)
    from shadowsync.train.local import train_local  # noqa: F401

    assert callable(shadowsync.train) and shadowsync.train.__module__ == "shadowsync.api"
