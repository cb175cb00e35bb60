#!/usr/bin/env python3
"""Measure the shape of the package: layers, import circles, long functions, local imports.

The layers, lowest first. A module may import from its own layer or a lower one; an import
of a higher layer is "upward". Top-level modules not named here belong to the layer of the
same name as their first dotted part (``shadowsync.config`` is ``config``).

    base        errors, logs, procfs, state_dicts, forkserver
    maths       metrics, rules
    data        data
    model       models, embeddings
    transport   transport
    when        runners, switch_search
    storage     checkpoint
    config      config
    train       train
    cluster     cluster
    surface     api, run, inference, export, evaluation, cli, bench, __init__

Prints one line per finding and a count per kind; ``--json`` prints the counts only.
Exit status 0 always: this is a measuring tool (its counts are what tests compare).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import defaultdict
from pathlib import Path

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("errors", "logs", "procfs", "state_dicts", "forkserver")),
    ("maths", ("metrics", "rules")),
    ("data", ("data",)),
    ("model", ("models", "embeddings")),
    ("transport", ("transport",)),
    ("when", ("runners", "switch_search")),
    ("storage", ("checkpoint",)),
    ("config", ("config",)),
    ("train", ("train",)),
    ("cluster", ("cluster",)),
    ("surface", ("api", "run", "inference", "export", "evaluation", "cli", "bench",
                 "__init__", "__main__")),
]
RANK = {part: i for i, (_, parts) in enumerate(LAYERS) for part in parts}
LONG_FUNCTION = 80


def module_name(root: Path, path: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1] or parts
    return ".".join(parts)


def top_part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imported_modules(tree: ast.AST, module: str, is_package: bool) -> list[tuple[str, bool]]:
    """(imported shadowsync module, whether the import is inside a function) pairs."""
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            local = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                found.extend((a.name, in_function) for a in child.names
                             if a.name.split(".")[0] == "shadowsync")
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    pkg = module.split(".") if is_package else module.split(".")[:-1]
                    pkg = pkg[: len(pkg) - child.level + 1]
                    base = ".".join(pkg + ([base] if base else []))
                if base.split(".")[0] == "shadowsync":
                    found.append((base, in_function))
            visit(child, local)

    visit(tree, False)
    return found


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
              "local_imports": 0, "local_imports_outside_bench": 0}
    package_graph: dict[str, set[str]] = defaultdict(set)
    for path in sorted(root.rglob("*.py")):
        module = module_name(root, path)
        tree = ast.parse(path.read_text(), filename=str(path))
        here = top_part(module)
        in_bench = here == "bench"
        for target, local in imported_modules(tree, module, path.name == "__init__.py"):
            there = top_part(target) if target != "shadowsync" else "__init__"
            if local:
                counts["local_imports"] += 1
                counts["local_imports_outside_bench"] += not in_bench
            if there != here and here != "__init__":
                package_graph[here].add(there)
            if RANK.get(there, -1) > RANK.get(here, len(LAYERS)):
                counts["upward_imports"] += 1
                lines.append(f"upward: {path}: {module} imports {target}")
        if not in_bench:
            for name, lineno, n in long_functions(tree):
                counts["long_functions"] += 1
                lines.append(f"long: {path}:{lineno}: {name} is {n} lines")
    for cycle in find_cycles(package_graph):
        counts["package_cycles"] += 1
        lines.append("cycle: " + " <-> ".join(cycle))
    return counts, lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=str(Path(__file__).resolve().parents[1] / "shadowsync"))
    parser.add_argument("--json", action="store_true", help="print the counts only, as JSON")
    args = parser.parse_args()
    counts, lines = measure(Path(args.root))
    if args.json:
        print(json.dumps(counts))
        return 0
    for line in lines:
        print(line)
    for key, value in counts.items():
        print(f"{key:30s} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
