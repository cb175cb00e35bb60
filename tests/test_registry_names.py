"""The sync-mode registry (`spec/modes.py`) is the only place a mode or a protocol is
named: everywhere else code asks the registry (`mode_of(name).lockstep`, `.protocols`, ...)
or uses the `Protocol` enum. This reads the package's syntax trees and lists, file:line, every
string constant that decodes a name outside it:

- a protocol's name ("bsp", "asp") as a whole string constant anywhere but a docstring;
- a mode's name compared (==, !=, in, not in, as an element of the tuple it is compared with)
  or a key of a dict literal that is looked up;
- a mode family's prefix ("s-", "fr-") stripped or tested (`removeprefix`, `startswith`...).

Exempt: the registry, the module that defines the `Protocol` enum, and `bench/`, whose
variants are named for people reading the results.
"""

from __future__ import annotations

import ast
from pathlib import Path

from shadowsync.spec.modes import MODES, Protocol

PACKAGE = Path(__file__).resolve().parents[1] / "shadowsync"
EXEMPT = {"spec/modes.py", "protocols.py"}
EXEMPT_DIRS = ("bench/",)
PROTOCOL_NAMES = {p.value for p in Protocol}
MODE_NAMES = set(MODES) - PROTOCOL_NAMES  # "bsp" and "asp" are flagged as protocols anywhere
FAMILY_PREFIXES = {name[: name.index("-") + 1] for name in MODE_NAMES if "-" in name}
PREFIX_METHODS = {"startswith", "endswith", "removeprefix", "removesuffix"}


def _strings(node: ast.AST) -> list[ast.Constant]:
    """String constants of `node` itself or of the tuple/list/set literal it is."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [n for n in items if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def findings(source: str, where: str) -> list[str]:
    tree = ast.parse(source)
    docs = _docstrings(tree)
    found: list[tuple[int, str]] = []

    def flag(node: ast.Constant, why: str) -> None:
        found.append((node.lineno, f"{where}:{node.lineno}: {node.value!r} {why}"))

    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and node.value in PROTOCOL_NAMES
                and id(node) not in docs):
            flag(node, "names a protocol (use Protocol)")
        elif isinstance(node, ast.Compare):
            for operand in [node.left, *node.comparators]:
                for c in _strings(operand):
                    if c.value in MODE_NAMES:
                        flag(c, "compares a mode name (ask the registry)")
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Dict):
            for key in node.value.keys:
                for c in _strings(key) if key is not None else []:
                    if c.value in MODE_NAMES:
                        flag(c, "looks a mode name up (ask the registry)")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in PREFIX_METHODS):
            for arg in node.args:
                for c in _strings(arg):
                    if c.value in FAMILY_PREFIXES:
                        flag(c, "decodes a mode family from its name (ask the registry)")
    return [text for _, text in sorted(found)]


def package_findings() -> list[str]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in EXEMPT or rel.startswith(EXEMPT_DIRS):
            continue
        out.extend(findings(path.read_text(), f"shadowsync/{rel}"))
    return out


def test_no_mode_or_protocol_is_named_outside_the_registry():
    found = package_findings()
    assert not found, "mode or protocol names outside spec/modes.py:\n" + "\n".join(found)


def test_the_check_catches_each_kind_of_name():
    source = '''
"""A docstring may say bsp."""
def f(cfg, mode, rule):
    if cfg.sync == "switch" or mode in ("ddp", "torch-fr-ma"):
        return "asp"
    kind = "ddp" if rule else "none"  # naming a mode is fine, decoding one is not
    plain = {"s-ma": 1, "fr-ma": 2}[cfg.sync]
    return rule.removeprefix("s-"), f"--sync {cfg.sync}", "switch_plan", kind, plain
'''
    found = findings(source, "x.py")
    assert [line.split(":")[1] for line in found] == ["4", "4", "4", "5", "7", "7", "8"]
    assert "'asp' names a protocol" in found[3]
    assert findings('x = "bsp:0.5"\ny = "none"\nif z == "bspx": pass\n', "y.py") == []
