"""The package's shape, as scripts/check_layers.py measures it: layers that only point down,
no import circles between units, no long functions, few function-local imports."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Signatures (and class fields) taking the whole TrainConfig (or a Protocol of every one of
# its sections), bench included: what runs, resolves or starts a whole job (the API, the
# options given as keywords, the job, its processes and their entries, the bench's base job
# and its runs here, on namespace hosts and as the torchft peer, the switch search's job). A
# bench's variants are flat changes to its `Job`, which makes their configurations; the
# configuration writes itself (`TrainConfig.to_dict`, `to_toml`); builders take their sections.
WHOLE_CONFIG_SIGNATURES = 14


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


def test_no_function_over_80_lines(counts):
    """bench included: it is measured as the rest of the package is."""
    assert counts["long_functions"] == 0


def test_few_function_local_imports(counts):
    """Under 40 in all, bench included (once 171): each one keeps a heavy import off a
    command-line or `import shadowsync` path, or imports an optional extra. Bench's own (the
    real-data baselines' optional learners and data, once 134) no more than 12."""
    assert counts["local_imports"] < 40
    assert counts["local_imports"] - counts["local_imports_outside_bench"] <= 12


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
    # bench is measured as the rest: its long function and local import count too.
    (pkg / "bench").mkdir()
    (pkg / "bench" / "__init__.py").write_text("")
    (pkg / "bench" / "x.py").write_text(f"def g():\n    import json\n{body}\n")
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_layers.py"), "--json",
                          "--root", str(pkg)], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    got = json.loads(out)
    assert got["upward_imports"] == 2 and got["package_cycles"] == 2
    assert got["long_functions"] == 2 and got["local_imports_outside_bench"] == 1
    assert got["local_imports"] == 2
    assert got["unplaced_modules"] == 1 and got["folder_pairs"] == 2  # errors-cli, config-train


def test_few_any_annotations_outside_transport(counts):
    assert counts["any_annotations"] < 100
    assert counts["any_aliases"] == 0  # Any is spelled where it is used


def test_an_alias_does_not_hide_any(tmp_path):
    """Annotations naming Any through an alias (assigned, TypeAlias, Any renamed on import,
    an alias of an alias, one defined in transport and used elsewhere) count as Any; plain
    data (`dict[str, Any]`) and its alias count as no more than plain data."""
    pkg = tmp_path / "shadowsync"
    (pkg / "transport").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "transport" / "__init__.py").write_text(
        "from typing import Any\nWire = tuple[Any, ...]\n\n\ndef g(a: Any) -> Any: ...\n")
    (pkg / "errors.py").write_text("from shadowsync.transport import Wire\n\n\n"
                                   "def h(w: Wire, n: int) -> None: ...\n")
    (pkg / "logs.py").write_text(
        "from typing import Any, TypeAlias\nfrom typing import Any as Loose\n\n"
        "Json = dict[str, Any]\nHidden: TypeAlias = list[Any]\nTwice = Hidden\n"
        "NOT_A_TYPE = 'Any of these'\n\n\n"
        "def f(a: Json, b: Loose, c: Hidden, d: Twice, e: Any, n: int) -> dict[str, Any]:\n"
        "    return {}\n")
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_layers.py"), "--json",
                          "--root", str(pkg)], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    got = json.loads(out)
    assert got["any_aliases"] == 5  # Loose, Json, Hidden, Twice, Wire
    # f: a..e and its return; h: w. Transport's own g is a boundary, not counted.
    assert got["any_annotations"] == 7
    assert got["any_beyond_plain_data"] == 5  # all but Json and dict[str, Any]


def test_kind_names_are_compared_only_in_their_registries(counts):
    """String comparisons against a registered kind's name (a sync mode or protocol, a sync
    rule, a switch policy, a task, a table kind) outside the registries: none, bench
    included."""
    assert counts["kind_comparisons"] == 0


def test_the_measure_sees_a_kind_name_compared(tmp_path):
    pkg = tmp_path / "shadowsync"
    (pkg / "spec").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "spec" / "__init__.py").write_text("")
    (pkg / "spec" / "tasks.py").write_text('ok = name == "digits"\n')  # a registry: exempt
    (pkg / "cli.py").write_text('a = policy == "greedy"\nb = t in ("fixed", "x")\n'
                                'c = mode != "s-ma"\nd = x == "greedy-ish"\n'
                                'e = rule == "easgd"\n')
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_layers.py"), "--json",
                          "--root", str(pkg)], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    got = json.loads(out)
    assert got["kind_comparisons"] == got["kind_comparisons_outside_bench"] == 4


def test_few_signatures_take_the_whole_config(counts):
    """A builder takes the section it reads; the whole `TrainConfig` stays at the top (the
    command line, the job, the API), bench included."""
    assert counts["whole_config_signatures"] <= WHOLE_CONFIG_SIGNATURES


def test_the_measure_sees_the_whole_config_taken(tmp_path):
    pkg = tmp_path / "shadowsync"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "cli.py").write_text(
        "def a(cfg: TrainConfig): ...\n"  # counts
        "def b(cfg: 'TrainConfig | None', x: TrainConfig): ...\n"  # one function: counts once
        "def c(sync: SyncConfig) -> TrainConfig: ...\n"  # returns it: not handed it
        "def d(cfg: config.TrainConfig): ...\n"  # counts
        "class E:\n    cfg: TrainConfig\n    sync: SyncConfig\n"  # the field counts
        "def f(run: Callable[[TrainConfig], dict]): ...\n"  # a runner handed in: not
        "def g(cfg: TrainConfig | Callable[[dict], TrainConfig]): ...\n")  # counts
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_layers.py"), "--json",
                          "--root", str(pkg)], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    assert json.loads(out)["whole_config_signatures"] == 5


def test_the_measure_sees_the_whole_config_under_a_protocol(tmp_path):
    """A Protocol of the package declaring every section of `TrainConfig` (its own or from
    its Protocol bases) is the whole configuration renamed; one missing a section is not."""
    pkg = tmp_path / "shadowsync"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "base.py").write_text(
        "class Inputs(Protocol):\n    task: str\n    seed: int\n    data: DataConfig\n"
        "    model: ModelConfig\n    checkpoint: CheckpointConfig\n")
    (pkg / "cli.py").write_text(
        "class Most(Inputs, typing.Protocol):\n    optim: O\n    cluster: C\n    sync: S\n"
        "    output: Out\n    testing: T\n"  # no switch: some sections, not the whole
        "class Whole(Most, Protocol):\n    @property\n    def switch(self) -> Sw: ...\n"
        "class NotAProtocol(Most):\n    switch: Sw\n"  # a class deriving one: no Protocol
        "def a(cfg: Whole): ...\n"  # counts
        "def b(cfg: 'base.Whole | None'): ...\n"  # counts
        "def c(cfg: Most): ...\n"
        "def d(cfg: Inputs, x: NotAProtocol): ...\n"
        "class E:\n    cfg: Whole\n")  # the field counts
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_layers.py"), "--json",
                          "--root", str(pkg)], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    assert json.loads(out)["whole_config_signatures"] == 3


def test_the_measure_knows_every_section_of_the_config():
    """The sections a Protocol must declare to be the whole configuration are its fields."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from check_layers import WHOLE_CONFIG_SECTIONS
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    from shadowsync.config import TrainConfig
    assert {f.name for f in dataclasses.fields(TrainConfig)
            if not f.name.startswith("_")} == WHOLE_CONFIG_SECTIONS
