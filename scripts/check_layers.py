#!/usr/bin/env python3
"""Measure the shape of the package: layers, import circles, long functions, local imports.

The layers, lowest first. A module may import from its own layer or a lower one; an import
of a higher layer is "upward". An entry names a top-level module or package of
``shadowsync`` (``config``) or a module or package inside one; a module belongs to the
longest entry that contains it.

    base        errors, logs, procfs, state_dicts, forkserver, toml_file, by_value, protocols,
                lifecycle
    spec        spec: the option value types the configuration parses once (the --sync
                mode registry, the switch plan, share and detector, the straggler and its
                link delay, the checkpoint and sync intervals)
    config      config
    maths       metrics, rules
    data        data
    model       models, embeddings
    transport   transport
    when        runners
    storage     checkpoint
    train       train
    cluster     cluster
    surface     api, run, evaluation, inference, switch_search, cli, bench, __init__, __main__

Import circles are counted between units (the entries above). Folder pairs are counted
between the package's top-level folders and modules (``train`` and ``runners``, whatever their
entries): two that import each other, directly, are a pair, even where each import is
downward (a leaf of one placed in a lower layer). Every module must belong to some entry
("unplaced" otherwise).

``bench`` is measured as the rest of the package is: its imports, circles, long functions,
local imports and kind comparisons count; ``local_imports_outside_bench`` and
``kind_comparisons_outside_bench`` give the package without it, for comparison.

``any_annotations``: annotations (of parameters, returns and annotated assignments) that
mention ``Any``, outside ``transport`` (where bytes and pickled objects cross processes) and
``bench`` (whose runs and results are JSON-shaped records); ``--any`` lists them. An
annotation that names an alias hiding ``Any`` counts too: a name bound anywhere in the package
to a type that mentions ``Any`` (``Loose = Any``, ``Json: TypeAlias = dict[str, Any]``,
``type X = ...``) or to ``Any`` renamed (``from typing import Any as Loose``);
``any_aliases`` counts those definitions (listed as ``alias``).
``any_beyond_plain_data``: the annotations where ``Any`` is more than the values of plain
data (``dict[str, Any]``: a summary, a report, JSON).

``kind_comparisons``: comparisons (``==``, ``!=``, ``in``, ``not in``) of a string literal, or
of a tuple, list or set of them, that is the name of a registered kind: a ``--sync`` mode or
protocol, a sync rule, a ``--switch-policy``, a ``--task``, a ``--tables`` kind. Code asks the
kind's entry instead (``mode_of(name).lockstep``); the registries themselves
(``KIND_REGISTRIES``) are exempt.

``whole_config_signatures``: functions with a parameter annotated ``TrainConfig`` (the whole
configuration) and class fields of that type, bench included. A builder takes the section it
reads (``cfg.cluster``, ``cfg.sync``) or the few values; the whole configuration stays at the
top (the command line, the job, the API) where it is the whole thing. A ``Protocol`` class of
the package that declares every section of ``TrainConfig`` (``task``, ``seed`` and the nine
sections, its own or inherited from the package's Protocol classes it derives from) is the
whole configuration by another name: a parameter or field annotated with it counts too. One
that names some sections (``ReplicaOptions``) does not.

Prints one line per finding and a count per kind; ``--json`` prints the counts only.
Exit status 0 always: this is a measuring tool (its counts are what tests compare).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import defaultdict
from collections.abc import Collection, Mapping
from pathlib import Path

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("errors", "logs", "procfs", "state_dicts", "forkserver", "toml_file", "by_value",
              "protocols", "lifecycle")),
    ("spec", ("spec",)),
    ("config", ("config",)),
    ("maths", ("metrics", "rules")),
    ("data", ("data",)),
    ("model", ("models", "embeddings")),
    ("transport", ("transport",)),
    ("when", ("runners",)),
    ("storage", ("checkpoint",)),
    ("train", ("train",)),
    ("cluster", ("cluster",)),
    ("surface", ("api", "run", "evaluation", "inference", "switch_search", "cli", "bench",
                 "__init__", "__main__")),
]
RANK = {unit: i for i, (_, units) in enumerate(LAYERS) for unit in units}
LONG_FUNCTION = 80
# The modules that name kinds (relative to the package): comparisons there are the registry's.
KIND_REGISTRIES = ("spec/modes.py", "spec/sync_rules.py", "spec/switch_policies.py",
                   "spec/tasks.py", "spec/table_kinds.py", "protocols.py")


def kind_names() -> dict[str, str]:
    """Every registered kind's name -> what kind it is, from the registries (torch-free)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from shadowsync.protocols import Protocol
    from shadowsync.spec.modes import MODES
    from shadowsync.spec.switch_policies import POLICIES
    from shadowsync.spec.sync_rules import RULE_KINDS
    from shadowsync.spec.table_kinds import TABLE_KINDS
    from shadowsync.spec.tasks import TASK_KINDS

    names = {name: "table kind" for name in TABLE_KINDS}
    names.update((name, "task") for name in TASK_KINDS)
    names.update((name, "switch policy") for name in POLICIES)
    names.update((name, "sync rule") for name in RULE_KINDS)
    names.update((name, "sync mode") for name in MODES)
    names.update((p.value, "protocol") for p in Protocol)
    return names


def kind_comparisons(tree: ast.AST, names: Mapping[str, str]) -> list[tuple[str, str, int]]:
    """(name, its kind, line) of each string literal compared that names a registered kind."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        for operand in (node.left, *node.comparators):
            items = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) \
                else [operand]
            out += [(c.value, names[c.value], c.lineno) for c in items
                    if isinstance(c, ast.Constant) and isinstance(c.value, str)
                    and c.value in names]
    return sorted(out, key=lambda x: x[2])


def module_name(root: Path, path: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1] or parts
    return ".".join(parts)


def unit_of(module: str) -> str | None:
    """The LAYERS entry `module` (a dotted name under shadowsync) belongs to: the longest
    one that contains it. None when no entry does."""
    parts = module.split(".")[1:] or ["__init__"]
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        if name in RANK:
            return name
    return None


def top_part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imported_modules(tree: ast.AST, module: str, is_package: bool,
                     known: set[str]) -> list[tuple[str, bool, int]]:
    """(imported shadowsync module, whether the import is inside a function, line) triples.
    `from shadowsync.pkg import mod` names the module `shadowsync.pkg.mod` when it is one of
    `known` (the package's modules), else the package."""
    found: list[tuple[str, bool, int]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            local = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                found.extend((a.name, in_function, child.lineno) for a in child.names
                             if a.name.split(".")[0] == "shadowsync")
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    pkg = module.split(".") if is_package else module.split(".")[:-1]
                    pkg = pkg[: len(pkg) - child.level + 1]
                    base = ".".join(pkg + ([base] if base else []))
                if base.split(".")[0] == "shadowsync":
                    subs = {f"{base}.{a.name}" for a in child.names} & known
                    found.extend((m, in_function, child.lineno) for m in sorted(subs or {base}))
            visit(child, local)

    visit(tree, False)
    return found


def local_imports(tree: ast.AST) -> list[tuple[str, int]]:
    """Every import statement inside a function, of any module: (what it imports, line)."""
    out = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Import):
                out.append((", ".join(a.name for a in node.names), node.lineno))
            elif isinstance(node, ast.ImportFrom):
                out.append((node.module or ".", node.lineno))
    return sorted(set(out), key=lambda x: x[1])  # nested functions are walked twice


WHOLE_CONFIG = "TrainConfig"
# The sections (and top-level fields) of `TrainConfig`; tests/test_layers.py checks them
# against the class.
WHOLE_CONFIG_SECTIONS = frozenset({"task", "seed", "data", "model", "optim", "cluster", "sync",
                                   "switch", "checkpoint", "output", "testing"})


def _base_names(cls: ast.ClassDef) -> list[str]:
    """The names of `cls`'s bases (`Protocol`, `typing.Protocol`, `Base[T]`: their last part)."""
    out = []
    for base in cls.bases:
        node = base.value if isinstance(base, ast.Subscript) else base
        if isinstance(node, ast.Name):
            out.append(node.id)
        elif isinstance(node, ast.Attribute):
            out.append(node.attr)
    return out


def _declared_fields(cls: ast.ClassDef) -> set[str]:
    """What `cls`'s body declares: annotated fields and properties."""
    annotated = {f.target.id for f in cls.body
                 if isinstance(f, ast.AnnAssign) and isinstance(f.target, ast.Name)}
    properties = {f.name for f in cls.body if isinstance(f, ast.FunctionDef)
                  and any(ast.unparse(d) == "property" for d in f.decorator_list)}
    return annotated | properties


def whole_config_protocols(trees: list[ast.AST]) -> set[str]:
    """The names of the package's `Protocol` classes that declare every section of
    `TrainConfig`, themselves or through the package's Protocol classes they derive from:
    the whole configuration under another name."""
    classes = {c.name: c for tree in trees for c in ast.walk(tree) if isinstance(c, ast.ClassDef)}

    def fields(name: str, seen: frozenset[str] = frozenset()) -> set[str] | None:
        """`name`'s fields with its bases', None when it is no Protocol."""
        cls = classes.get(name)
        # A class deriving a Protocol is one only when it names Protocol too (as typing has it)
        if cls is None or name in seen or "Protocol" not in _base_names(cls):
            return None
        inherited = (fields(base, seen | {name}) for base in _base_names(cls))
        return _declared_fields(cls).union(*(f for f in inherited if f is not None))

    return {name for name in classes if WHOLE_CONFIG_SECTIONS <= (fields(name) or set())}


def _whole_config_named(annotation: ast.expr | None, whole: Collection[str]) -> str | None:
    """Which of `whole` (the whole configuration's names: `TrainConfig`, a Protocol of all its
    sections) `annotation` names (`X`, `"X"`, `X | None`, `mod.X`), None if none. A callable
    that takes one (`Callable[[X], ...]`) is a runner handed in, not the configuration."""
    if annotation is None:
        return None
    in_callables = {id(c) for n in ast.walk(annotation) if isinstance(n, ast.Subscript)
                    and ast.unparse(n.value).split(".")[-1] == "Callable"
                    for c in ast.walk(n.slice)}
    for n in ast.walk(annotation):
        if id(n) in in_callables:
            continue
        if isinstance(n, ast.Name) and n.id in whole:
            return n.id
        if isinstance(n, ast.Attribute) and n.attr in whole:
            return n.attr
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            named = [part.split(".")[-1] for part in n.value.replace(" ", "").split("|")]
            found = [part for part in named if part in whole]
            if found:
                return found[0]
    return None


def whole_config_signatures(tree: ast.AST, whole: Collection[str] = (WHOLE_CONFIG,)
                            ) -> list[tuple[str, int, str]]:
    """(function or class field, line, the name it is annotated with) of each function with a
    parameter annotated with the whole configuration (one of `whole`'s names), and of each
    class field of that type."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            params = (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg)
            named = [_whole_config_named(p.annotation, whole) for p in params if p is not None]
            if any(named):
                out.append((node.name, node.lineno, next(n for n in named if n)))
        elif isinstance(node, ast.ClassDef):
            for f in node.body:
                named = (_whole_config_named(f.annotation, whole)
                         if isinstance(f, ast.AnnAssign) else None)
                if named:
                    out.append((f"{node.name}.{ast.unparse(f.target)}", f.lineno, named))
    return sorted(out, key=lambda x: x[1])


def _names_any(node: ast.AST, aliases: Mapping[str, object]) -> bool:
    """Whether `node` names `Any` (`Any`, `typing.Any`) or an alias of it."""
    return any((isinstance(n, ast.Name) and (n.id == "Any" or n.id in aliases))
               or (isinstance(n, ast.Attribute) and n.attr == "Any") for n in ast.walk(node))


def any_aliases(tree: ast.AST, known: Mapping[str, object] = {}) -> dict[str, tuple[str, int]]:
    """Names `tree` binds to a type that mentions `Any` (or an alias of it, of `known`) or to
    `Any` itself under another name: name -> (what it stands for, line)."""
    out: dict[str, tuple[str, int]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("typing", "typing_extensions"):
            out.update((a.asname, ("Any", node.lineno)) for a in node.names
                       if a.name == "Any" and a.asname and a.asname != "Any")
            continue
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None and \
                "TypeAlias" in ast.unparse(node.annotation):
            target, value = node.target, node.value
        elif type(node).__name__ == "TypeAlias":  # `type X = ...` (Python 3.12)
            target, value = node.name, node.value  # type: ignore[attr-defined]
        else:
            continue
        if isinstance(target, ast.Name) and _names_any(value, {**known, **out}):
            out[target.id] = (ast.unparse(value), node.lineno)
    return out


def any_annotations(tree: ast.AST, aliases: Mapping[str, object] = {}) -> list[tuple[str, int]]:
    """(annotation, line) of every annotation that mentions `Any` or one of `aliases`."""
    out = []
    for node in ast.walk(tree):
        found: list[ast.expr | None] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            found += [arg.annotation for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs,
                                                 a.vararg, a.kwarg) if arg is not None]
            found.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            found.append(node.annotation)
        out += [(ast.unparse(ann), node.lineno) for ann in found
                if ann is not None and ("Any" in ast.unparse(ann) or _names_any(ann, aliases))]
    return out


def long_functions(tree: ast.AST) -> list[tuple[str, int, int]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = (node.end_lineno or node.lineno) - node.lineno + 1
            if n > LONG_FUNCTION:
                out.append((node.name, node.lineno, n))
    return out


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    sys.setrecursionlimit(10_000)

    def strong(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def measure(root: Path) -> tuple[dict[str, int], list[str]]:
    lines: list[str] = []
    counts = {"upward_imports": 0, "package_cycles": 0, "long_functions": 0,
              "local_imports": 0, "local_imports_outside_bench": 0, "unplaced_modules": 0,
              "folder_pairs": 0, "any_annotations": 0, "any_beyond_plain_data": 0,
              "any_aliases": 0, "kind_comparisons": 0, "kind_comparisons_outside_bench": 0,
              "whole_config_signatures": 0}
    names = kind_names()
    unit_graph: dict[str, set[str]] = defaultdict(set)
    folder_graph: dict[str, set[str]] = defaultdict(set)
    paths = sorted(root.rglob("*.py"))
    known = {module_name(root, p) for p in paths}
    trees = {p: ast.parse(p.read_text(), filename=str(p)) for p in paths}
    whole = {WHOLE_CONFIG} | whole_config_protocols(list(trees.values()))
    # Aliases of Any anywhere in the package (transport's too: its aliases used elsewhere
    # count there), to a fixed point: an alias may be made of another.
    aliases: dict[str, tuple[str, int]] = {}
    while True:
        found = {name: (text, line, path) for path, tree in trees.items()
                 for name, (text, line) in any_aliases(tree, aliases).items()}
        if found.keys() <= aliases.keys():
            break
        aliases.update((name, (text, line)) for name, (text, line, _) in found.items())
    for name, (text, line, path) in sorted(found.items(), key=lambda x: (str(x[1][2]), x[1][1])):
        counts["any_aliases"] += 1
        lines.append(f"alias: {path}:{line}: {name} = {text}")
    # An alias is plain data when what it stands for is (dict[str, Any]).
    loose = {n for n, (text, _) in aliases.items()
             if "Any" in text.replace("dict[str, Any]", "") or text in aliases}
    for path in paths:
        module = module_name(root, path)
        tree = trees[path]
        here = unit_of(module)
        if here is None:
            counts["unplaced_modules"] += 1
            lines.append(f"unplaced: {path}: {module} is in no layer")
        in_bench = top_part(module) == "bench"
        if not in_bench and top_part(module) != "transport":
            for text, lineno in any_annotations(tree, aliases):
                counts["any_annotations"] += 1
                counts["any_beyond_plain_data"] += "Any" in text.replace(
                    "dict[str, Any]", "") or any(isinstance(n, ast.Name) and n.id in loose
                                                 for n in ast.walk(ast.parse(text, mode="eval")))
                lines.append(f"any: {path}:{lineno}: {text}")
        imports = imported_modules(tree, module, path.name == "__init__.py", known)
        for what, lineno in local_imports(tree):
            counts["local_imports"] += 1
            counts["local_imports_outside_bench"] += not in_bench
            lines.append(f"local: {path}:{lineno}: imports {what}")
        for target, _, lineno in imports:
            there = unit_of(target)
            if here is None or there is None:
                continue
            if there != here and here != "__init__":
                unit_graph[here].add(there)
            if top_part(target) != top_part(module) and top_part(module) != "__init__":
                folder_graph[top_part(module)].add(top_part(target))
            if RANK[there] > RANK[here]:
                counts["upward_imports"] += 1
                lines.append(f"upward: {path}:{lineno}: {module} imports {target}")
        if path.relative_to(root).as_posix() not in KIND_REGISTRIES:
            for name, kind, lineno in kind_comparisons(tree, names):
                counts["kind_comparisons"] += 1
                counts["kind_comparisons_outside_bench"] += not in_bench
                lines.append(f"kind: {path}:{lineno}: compares the {kind} name {name!r}")
        for name, lineno, named in whole_config_signatures(tree, whole):
            counts["whole_config_signatures"] += 1
            alias = "" if named == WHOLE_CONFIG else f" (as {named}, a Protocol of every section)"
            lines.append(f"config: {path}:{lineno}: {name} takes the whole {WHOLE_CONFIG}{alias}")
        for name, lineno, n in long_functions(tree):
            counts["long_functions"] += 1
            lines.append(f"long: {path}:{lineno}: {name} is {n} lines")
    pairs = sorted((x, y) for x in folder_graph for y in folder_graph[x]
                   if x < y and x in folder_graph.get(y, ()))
    for x, y in pairs:
        counts["folder_pairs"] += 1
        lines.append(f"pair: {x} <-> {y} import each other")
    for cycle in find_cycles(unit_graph):
        counts["package_cycles"] += 1
        lines.append("cycle: " + " <-> ".join(cycle))
    return counts, lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=str(Path(__file__).resolve().parents[1] / "shadowsync"))
    parser.add_argument("--json", action="store_true", help="print the counts only, as JSON")
    parser.add_argument("--any", action="store_true", help="also list the Any annotations")
    args = parser.parse_args()
    counts, lines = measure(Path(args.root))
    if args.json:
        print(json.dumps(counts))
        return 0
    for line in lines:
        if not line.startswith(("any: ", "alias: ")) or args.any:
            print(line)
    for key, value in counts.items():
        print(f"{key:30s} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
