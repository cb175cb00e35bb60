"""docs/architecture.md's "Where to add X" table names files and registries that exist: each
file, and each registry name (`MODES`, `SOURCES`...) defined in the file the table names."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "architecture.md"


def _rows() -> list[list[str]]:
    text = PAGE.read_text(encoding="utf-8").split("## Where to add X", 1)[1]
    table = re.search(r"\| to add \|.*?\n\|---.*?\n((?:\|.*\|\n)+)", text)
    assert table, "no table under 'Where to add X'"
    return [[c.strip() for c in line.strip("|").split("|")] for line in table.group(1).splitlines()]


def test_where_to_add_names_what_exists():
    rows = _rows()
    assert len(rows) >= 6
    for _, write, register in rows:
        for cell in (write, register):
            paths = re.findall(r"`(shadowsync/[\w/.]+)`", cell)
            assert paths, f"no path in {cell!r}"
            for path in paths:
                assert (ROOT / path).exists(), f"{path} does not exist"
        # Each registry name is defined in the file named after it ("`A` in `x.py` and `B`
        # in `y.py`").
        names: list[str] = []
        for token in re.findall(r"`([A-Z_]{4,}|shadowsync/[\w/.]+)`", register):
            if not token.startswith("shadowsync/"):
                names.append(token)
            elif token.endswith(".py"):
                source = (ROOT / token).read_text()
                for name in names:
                    assert re.search(rf"^{name}\b.*=", source, re.M), \
                        f"{name} is not defined in {token}"
                names = []
        assert not names, f"{names} name no file after them in {register!r}"


def test_every_kind_registry_has_a_row():
    """Each registry of a kind an option picks (scripts/check_layers.py's KIND_REGISTRIES, but
    the protocols, which no user adds to) is where the table sends a reader."""
    from scripts.check_layers import KIND_REGISTRIES

    registers = " ".join(register for _, _, register in _rows())
    for registry in KIND_REGISTRIES:
        if registry != "protocols.py":
            assert f"`shadowsync/{registry}`" in registers, f"no row registers in {registry}"


# Each example runs in a fresh interpreter: its registry module, which imports nothing of the
# package, is loaded first, alone, under its own name, from its source with the page's entry
# written into its table, as a reader would add it (an option's choices and help are made
# from the table as the module loads); the example's module is put in memory under the name
# the entry gives. The package's imports then find both. Nothing is written to the package.
REGISTER = r'''
import importlib.util, json, sys, types
module_text, entry_text, registry, module_name, table, name = sys.argv[1:7]
args = sys.argv[7:]
source = open(registry, encoding="utf-8").read()
head, rest = source.split(table + ": dict", 1)
rest = rest.replace("\n]}\n", "\n" + entry_text.rstrip() + "\n]}\n", 1)
spec = importlib.util.spec_from_file_location(module_name, registry)
registered = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
exec(compile(head + table + ": dict" + rest, registry, "exec"), vars(registered))
kind = getattr(registered, table)[name]
module = types.ModuleType(kind.builder.partition(":")[0])
exec(compile(module_text, "example " + name, "exec"), module.__dict__)
sys.modules[module.__name__] = module
'''


def run_example(section: str, registry: str, table: str, name: str, script: str,
                *args: str, timeout: float = 120) -> tuple[dict, str, str]:
    """The page's example under `## section` (its module, then its entry) registered as
    `name` in `table` of shadowsync/spec/`registry`.py, then `script` run: what it printed
    last, as JSON, and the module's and entry's text."""
    import json
    import subprocess
    import sys

    page = PAGE.read_text(encoding="utf-8").split(f"## {section}", 1)[1]
    module_text, entry_text = re.findall(r"```python\n(.*?)```", page, re.S)[:2]
    path = ROOT / "shadowsync" / "spec" / f"{registry}.py"
    out = subprocess.run([sys.executable, "-c", REGISTER + script, module_text, entry_text,
                          str(path), f"shadowsync.spec.{registry}", table, name, *args],
                         capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1]), module_text, entry_text


EXAMPLE_RULE = r'''
import torch

from shadowsync.cli import build_parser
from shadowsync.config import TrainConfig
from shadowsync.runners.build import rule_for
from shadowsync.spec.modes import MODES, mode_table

sync = next(a for a in build_parser()._subparsers._group_actions[0].choices["train"]._actions
            if "--sync" in a.option_strings)
cfg = TrainConfig(sync="s-halfway").validate()
grouped = TrainConfig(sync="fr-bmuf", sync_groups=["top=fr-halfway"]).validate()
rule = rule_for(cfg.sync, 2, cfg.sync.entry.rule)

class Mean:  # two replicas, [0, 4] here and [2, 0] on the other trainer
    done = False
    def mean(self, local):
        return (local + torch.tensor([2.0, 0.0])) / 2
    def every_trainer_done(self):
        return self.done

exchange = Mean()
middle = rule.round(torch.tensor([0.0, 4.0]), exchange)
exchange.done = True
last = rule.round(torch.tensor([0.0, 4.0]), exchange)
print(json.dumps({"choices": list(sync.choices), "help": sync.help,
                  "modes": {m.name: [m.family, m.dense_servers, m.can_fall_back]
                            for m in MODES.values() if m.rule == "halfway"},
                  "groups": [str(g) for g in grouped.sync.groups],
                  "rule": type(rule).__name__,
                  "middle": middle.tolist(), "last": last.tolist(), "table": mode_table()}))
'''


def test_the_example_rule_is_one_module_and_one_entry():
    """The page's example rule, its module and its entry taken from the page as they are,
    registered in memory: `s-halfway` and `fr-halfway` are `--sync` choices with their help,
    a configuration takes them (as --sync and in --sync-groups), the runner's builder makes
    the rule from its entry, and a round moves [0, 4] half-way to the mean with [2, 0]
    ([1, 2]): [0.5, 3.0]; the job's last round ends at the mean."""
    got, module_text, entry_text = run_example("Adding a sync rule", "sync_rules", "RULE_KINDS",
                                               "halfway", EXAMPLE_RULE)
    assert "RuleKind(" in entry_text and "class HalfwayAveraging" in module_text
    assert {"s-halfway", "fr-halfway"} <= set(got["choices"])
    assert got["modes"] == {"s-halfway": ["background", False, True],
                            "fr-halfway": ["foreground", False, False]}
    assert got["groups"] == ["top=fr-halfway"] and got["rule"] == "HalfwayAveraging"
    assert got["middle"] == [0.5, 3.0] and got["last"] == [1.0, 2.0]
    assert "`s-halfway`" in got["table"] and "half-way averaging" in got["table"]


EXAMPLE_POLICY = r'''
from shadowsync.cli import build_parser
from shadowsync.config.options import load_config
from shadowsync.runners.switch.detector import DetectorConfig
from shadowsync.runners.switch.schedule import Schedule
from shadowsync.spec.plan import SwitchPlan

parser = build_parser()
option = next(a for a in parser._subparsers._group_actions[0].choices["train"]._actions
              if "--switch-policy" in a.option_strings)
cfg = load_config(parser.parse_args(["train", "--sync", "switch", "--switch-policy", "oneway"]))
# trainer 1 is 3x slower for its steps 20..59 (tests/test_switch_policies.py's script)
schedule = Schedule(SwitchPlan.parse("bsp:0.5,asp"), budget=400, policy=cfg.switch.policy,
                    detector=DetectorConfig(k=1.5, m=2, window=5), trainers=2)
modes, bsp = [], 0
for step in range(100):
    for t in range(2):
        schedule.observe(t, 0.03 if t == 1 and 20 <= step < 60 else 0.01)
    mode = schedule.decide(2 * step, bsp, now=float(step))
    bsp += 2 if mode == "bsp" else 0
    modes.append(str(mode))
print(json.dumps({"choices": list(option.choices), "help": option.help,
                  "policy": cfg.switch.policy, "class": type(schedule.policy).__name__,
                  "detector": schedule.detector is not None, "modes": modes,
                  "stragglers": schedule.stragglers}))
'''


def test_the_example_switch_policy_is_one_module_and_one_entry():
    """The page's example policy, its module and its entry taken from the page as they are:
    `--switch-policy oneway` is a choice with its help, the configuration holds it, and a
    schedule made with it runs the detector, leaves BSP once trainer 1 straggles (after 2
    slow windows of 5 steps) and stays in ASP after the straggler clears (where greedy
    returns to BSP)."""
    got, module_text, entry_text = run_example("Adding a switch policy", "switch_policies",
                                               "POLICIES", "oneway", EXAMPLE_POLICY)
    assert "PolicyKind(" in entry_text and "class OneWay" in module_text
    assert "oneway" in got["choices"] and "oneway: ASP from the first straggler on" in got["help"]
    assert got["policy"] == "oneway" and got["class"] == "OneWay" and got["detector"]
    modes = got["modes"]
    first_asp = modes.index("asp")
    assert 25 <= first_asp <= 30 and set(modes[:first_asp]) == {"bsp"}
    assert set(modes[first_asp:]) == {"asp"} and got["stragglers"] == []


# After the table kind's registration a one-process job trains with it (its workers are forked
# from that interpreter, where both are registered) and its checkpoint is exported.
EXAMPLE_TABLES = r'''
import shadowsync
from shadowsync.cli import build_parser
from shadowsync.config.options import load_config
from shadowsync.train.local import local_tables
from shadowsync.train.tasks import features_of

parser = build_parser()
option = next(a for a in parser._subparsers._group_actions[0].choices["train"]._actions
              if "--tables" in a.option_strings)
cfg = load_config(parser.parse_args(["train", "--tables", "prime", "--table-size", "1000"]))
features = features_of(cfg)
tables = local_tables(cfg.model, cfg.optim, cfg.seed, features)
result = shadowsync.train(tables="prime", table_size=[1000], examples=4000, trainers=1,
                          embedding_servers=0, sync="none", workers=1, progress=False,
                          eval_points=1, out=args[0])
trained = result.model()
print(json.dumps({"choices": list(option.choices), "help": option.help, "kind": cfg.model.tables,
                  "rows": list(features.table_rows), "modulus": list(features.id_modulus),
                  "local": [list(tables.rows), tables.weight.shape[0]],
                  "trained": [int(r) for r in trained.table_rows], "raw": trained.raw_ids,
                  "eval_ne": result.summary["eval_ne"]}))
'''


def test_the_example_table_kind_is_one_module_and_one_entry(tmp_path):
    """The page's example kind, its module and its entry taken from the page as they are:
    `--tables prime` is a choice with its help, the configuration holds it, a --table-size of
    1000 gives tables of 997 rows that the data folds ids modulo, the trainer's tables have
    that many rows, and a one-process job trains with them and exports tables of 997 rows,
    ids folded (not raw)."""
    import math

    got, module_text, entry_text = run_example("Adding a table kind", "table_kinds",
                                               "TABLE_KINDS", "prime", EXAMPLE_TABLES,
                                               str(tmp_path / "run"), timeout=240)
    assert "TableKind(" in entry_text and "class Prime" in module_text
    assert "prime" in got["choices"] and "prime (ids modulo the largest prime" in got["help"]
    assert got["kind"] == "prime"
    assert set(got["rows"]) == {997} and got["modulus"] == got["rows"]
    assert got["local"] == [got["rows"], 997 * len(got["rows"])]
    assert set(got["trained"]) == {997} and got["raw"] is False
    assert math.isfinite(got["eval_ne"])


def test_every_table_kind_entry_builds_a_table_builder_of_its_name():
    """The registry is the only list of table kinds: each entry's builder is a TableBuilder
    of its name, made through the configuration's entry (`table_builder`)."""
    from shadowsync.config import TrainConfig
    from shadowsync.spec.table_kinds import TABLE_KINDS
    from shadowsync.train.table_kinds.kind import TableBuilder, table_builder

    for name in TABLE_KINDS:
        builder = table_builder(TrainConfig(tables=name).validate().model)
        assert isinstance(builder, TableBuilder) and builder.name == name
