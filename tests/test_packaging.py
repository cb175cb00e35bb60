"""The package others install: a wheel built from this tree installs into a new virtual
environment and trains there (scripts/check_wheel), and the metadata lets people adopt it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import shadowsync
from tests.helpers import _kill_session

ROOT = Path(__file__).resolve().parent.parent


def test_metadata_names_the_license_and_the_extras():
    from shadowsync.toml_file import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "BSD-3-Clause" and (ROOT / "LICENSE").exists()
    assert "BSD 3-Clause" in (ROOT / "LICENSE").read_text()
    assert {"bench", "docs", "dev", "tensorboard", "peers"} <= set(project["optional-dependencies"])
    assert not any(d.startswith("scipy") for d in project["dependencies"])
    assert (ROOT / "shadowsync" / "py.typed").exists()
    assert f"## {shadowsync.__version__}" in (ROOT / "CHANGELOG.md").read_text()


def test_bench_scale_without_scipy_is_one_line(monkeypatch):
    from shadowsync.bench import scale
    from shadowsync.errors import UserError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "scipy" else real(name, *a))
    with pytest.raises(UserError, match=r"pip install 'shadowsync\[bench\]'"):
        scale.require_scipy()


@pytest.mark.skipif(importlib.util.find_spec("build") is None,
                    reason="the build package is not installed (the dev extra)")
@pytest.mark.timeout(420)
def test_wheel_installs_and_trains_in_a_new_environment(tmp_path: Path):
    proc = subprocess.Popen([str(ROOT / "scripts" / "check_wheel"), str(tmp_path / "work")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True,
                            env={**os.environ, "PYTHON": sys.executable})
    try:
        out, _ = proc.communicate(timeout=400)
    finally:
        leftover = _kill_session(proc.pid)
    assert proc.returncode == 0, out[-4000:]
    assert leftover == []
    assert f"shadowsync {shadowsync.__version__}" in out and "examples               20,000" in out
