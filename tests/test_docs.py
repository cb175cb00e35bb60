"""The documentation site builds without a warning, and its generated parts are current."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import shadowsync

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,
                    reason="mkdocs not installed (the docs extra)")
@pytest.mark.timeout(240)
def test_mkdocs_build_strict(tmp_path: Path) -> None:
    """A broken link, a missing page in the nav or an API name that no longer exists fails
    the strict build."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q",
                           "-d", str(tmp_path / "site")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=220)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    api = (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8")
    for name in ("shadowsync.api.train", "RunResult", "TrainConfig"):
        assert name in api
    cli = (tmp_path / "site" / "cli" / "index.html").read_text(encoding="utf-8")
    assert "--sync-every" in cli and "shadowsync bench switch" in cli


def test_api_page_lists_every_public_function() -> None:
    """Each name the package exports (load too, once it exists) has its reference entry."""
    page = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    for name in shadowsync.__all__:
        if name.startswith("_"):
            continue
        assert f".{name}\n" in page, f"docs/api.md has no '::: ...{name}' entry"


def test_benchmarks_page_is_generated_from_the_results() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_page.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_bench_page_add_imports_a_bench_json(tmp_path: Path, monkeypatch) -> None:
    """--add turns a bench's bench.json into its result file: ratios with spread and goals."""
    import json

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import bench_page
    finally:
        sys.path.pop(0)
    monkeypatch.setattr(bench_page, "RESULTS", tmp_path)
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"bench": "hogwild", "runs": [], "ratios": {"two_vs_one": 1.9},
                                 "ratio_spread": {"two_vs_one": [1.8, 2.1]},
                                 "goals": {"two_vs_one": ">= 1.5"}}))
    path = bench_page.add(bench, "here")
    result = json.loads(path.read_text())
    assert result["runs"] == [{"label": "here", "ratios": {"two_vs_one": [1.9, 1.8, 2.1]}}]
    assert result["goals"] == {"two_vs_one": ">= 1.5"} and result["machine"]["cpus"] >= 1
    section = "\n".join(bench_page.section(result))
    assert "| `two_vs_one` | 1.9 (1.8 to 2.1) | >= 1.5 |" in section
    # --keep-runs: another run (such as --full) beside it, the goals of both kept
    bench.write_text(json.dumps({"bench": "hogwild", "runs": [], "ratios": {"four_vs_one": 3.5},
                                 "goals": {"four_vs_one": ">= 3"}}))
    result = json.loads(bench_page.add(bench, "full", keep_runs=True).read_text())
    assert [r["label"] for r in result["runs"]] == ["here", "full"]
    assert result["goals"] == {"two_vs_one": ">= 1.5", "four_vs_one": ">= 3"}
    # tables a bench writes come along; a kept run's table of the same title once
    table = {"title": "t", "columns": ["a"], "rows": [[1]]}
    bench.write_text(json.dumps({"bench": "hogwild", "ratios": {}, "tables": [table]}))
    assert json.loads(bench_page.add(bench, "x").read_text())["tables"] == [table]
    other = {**table, "title": "u"}
    bench.write_text(json.dumps({"bench": "hogwild", "ratios": {}, "tables": [table, other]}))
    result = json.loads(bench_page.add(bench, "y", keep_runs=True).read_text())
    assert result["tables"] == [table, other]


def test_mode_tables_are_generated_from_the_registry() -> None:
    """The README's and docs/sync-modes.md's tables of --sync modes are the registry's."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "mode_table.py"), "--check"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
