"""Each script under examples/ runs, with small sizes."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from shadowsync.toml_file import read_toml
from tests.helpers import _kill_session, run_python

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def _bin_dir(where: Path) -> Path:
    """A directory with a `shadowsync` command that runs this checkout's CLI."""
    bin_dir = where / "bin"
    bin_dir.mkdir()
    script = bin_dir / "shadowsync"
    script.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m shadowsync.cli \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def _run_script(args: list[str], cwd: Path, env: dict[str, str], timeout: float):
    proc = subprocess.Popen(args, cwd=cwd, env={**os.environ, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        leftover = _kill_session(proc.pid)
    return proc.returncode, out, err, leftover


@pytest.mark.timeout(200)
def test_own_arrays_and_model_from_python(tmp_path: Path):
    res = run_python([str(EXAMPLES / "own_arrays.py"), "--rows", "12000", "--data",
                      str(tmp_path / "arrays"), "--out", str(tmp_path / "run")],
                     timeout=170, cwd=tmp_path, env={"PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.leftover == []
    eval_ne, out, checkpoint = res.stdout.split()
    assert 0 < float(eval_ne) < 1.0  # beats always predicting the mean click rate
    config = read_toml(str(tmp_path / "run" / "config.toml"), "config")
    assert config["model"]["name"] == "my_model:mlp" and Path(checkpoint).exists()


@pytest.mark.timeout(400)
def test_recurring_switch_job(tmp_path: Path):
    env = {"PATH": f"{_bin_dir(tmp_path)}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT),
           "EXAMPLES": "4000", "TRAINERS": "2", "SEEDS": "1", "MIN_SHARE": "0.5"}
    rc, out, err, leftover = _run_script(
        [str(EXAMPLES / "recurring_switch_job.sh"), str(tmp_path / "work")], tmp_path, env, 380)
    assert rc == 0, err[-3000:]
    assert leftover == []
    assert "chosen BSP share:" in out
    stored = json.loads((tmp_path / "work" / "runs" / "switch-search" / "digits.json").read_text())
    summary = json.loads((tmp_path / "work" / "run-1" / "summary.json").read_text())
    assert summary["sync"] == "switch" and summary["config"]["switch_at"] == "auto"
    assert 0.5 <= stored["share"] <= 1.0  # halving stops at --min-share; bisection lies above


def test_two_hosts_recipe_parses_and_explains_itself():
    script = str(EXAMPLES / "two_hosts.sh")
    assert subprocess.run(["bash", "-n", script]).returncode == 0
    helped = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=10)
    assert helped.returncode == 0 and "examples/two_hosts.sh HOST0 1" in helped.stdout
    bare = subprocess.run([script], capture_output=True, text=True, timeout=10)
    assert bare.returncode == 2 and "HOST0 0" in bare.stderr
    assert "-m shadowsync.run" in Path(script).read_text()


@pytest.mark.timeout(300)
def test_two_hosts_recipe_runs_a_job_as_two_hosts_on_this_machine(tmp_path: Path):
    """Both 'hosts' here: two torchrun agents, ranks 0-1 and 2-3, meeting on loopback."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "PYTHONPATH": str(ROOT), "PORT": str(port), "OUT": "run"}
    options = ["--examples", "20000", "--checkpoint-every", "never", "--eval-points", "0"]
    hosts = [subprocess.Popen([str(EXAMPLES / "two_hosts.sh"), "127.0.0.1", str(rank), *options],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
             for rank in (0, 1)]
    try:
        outputs = [h.communicate(timeout=240) for h in hosts]
    finally:
        leftover = [pid for h in hosts for pid in _kill_session(h.pid)]
    for h, (_, err) in zip(hosts, outputs):
        assert h.returncode == 0, err[-3000:]
    assert leftover == []
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["examples"] == 20000 and summary["trainers"] == 3


def test_pytorchjob_gives_every_pod_a_dev_shm_and_one_storage_for_out():
    """The Kubernetes example: a memory-backed /dev/shm and a ReadWriteMany volume holding
    --out in every pod, torchrun's processes adding up to the job's, options that parse."""
    import argparse

    from shadowsync.cluster.parts import layout_of
    from shadowsync.config import add_config_arguments, load_config

    yaml = pytest.importorskip("yaml")
    job, claim = yaml.safe_load_all((EXAMPLES / "pytorchjob.yaml").read_text())
    assert job["kind"] == "PyTorchJob" and job["spec"]["elasticPolicy"]["rdzvBackend"] == "c10d"
    workers = job["spec"]["pytorchReplicaSpecs"]["Worker"]
    pod = workers["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    (container,) = pod["containers"]
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    assert mounts["/dev/shm"]["emptyDir"]["medium"] == "Memory"
    command = container["command"]
    assert command[0] == "torchrun" and command[command.index("-m") + 1] == "shadowsync.run"
    launcher = dict(a.split("=", 1) for a in command[1:command.index("-m")])
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    cfg = load_config(parser.parse_args(command[command.index("-m") + 2:]))
    shared = next(path for path in mounts if cfg.output.dir.startswith(path + "/"))
    assert mounts[shared]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    nodes = int(launcher["--nnodes"])
    assert nodes == workers["replicas"]
    assert nodes * int(launcher["--nproc-per-node"]) == layout_of(cfg.cluster).world_size
