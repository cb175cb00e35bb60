"""The package's shape, as scripts/check_layers.py measures it: layers that only point down,
no import circles between units, no long functions, few function-local imports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def counts() -> dict[str, int]:
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_layers.py"), "--json"],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    return json.loads(out)


def test_every_module_sits_in_a_layer(counts):
    assert counts["unplaced_modules"] == 0


def test_no_import_circles(counts):
    assert counts["package_cycles"] == 0


def test_no_two_folders_import_each_other(counts):
    assert counts["folder_pairs"] == 0


def test_no_upward_imports(counts):
    assert counts["upward_imports"] == 0


def test_no_function_over_80_lines_outside_bench(counts):
    assert counts["long_functions"] == 0


def test_few_function_local_imports_outside_bench(counts):
    assert counts["local_imports_outside_bench"] < 40


def test_the_measure_sees_what_it_counts(tmp_path):
    """The script finds an upward import, a circle, a long function and a local import."""
    pkg = tmp_path / "shadowsync"
    (pkg / "errors.py").parent.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "errors.py").write_text("from shadowsync import cli\n")  # base -> surface
    body = "\n".join(f"    x{i} = {i}" for i in range(85))
    (pkg / "cli.py").write_text(f"import shadowsync.errors\n\n\ndef f():\n"
                                f"    import shadowsync.logs\n{body}\n")
    (pkg / "logs.py").write_text("")
    (pkg / "stray.py").write_text("")
    # Two folders that import each other (config -> train is one more upward import).
    for folder, text in (("config", "from shadowsync.train import straggler\n"),
                         ("train", "from shadowsync.config import x\n")):
        (pkg / folder).mkdir()
        (pkg / folder / "__init__.py").write_text(text)
        (pkg / folder / "x.py").write_text("")
    (pkg / "train" / "straggler.py").write_text("")
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_layers.py"), "--json",
                          "--root", str(pkg)], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    got = json.loads(out)
    assert got["upward_imports"] == 2 and got["package_cycles"] == 2
    assert got["long_functions"] == 1 and got["local_imports_outside_bench"] == 1
    assert got["unplaced_modules"] == 1 and got["folder_pairs"] == 2  # errors-cli, config-train
