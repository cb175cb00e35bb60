#!/usr/bin/env python3
"""Trace the configuration's walk through the code in one small run, from `role_main`.

    python scripts/trace_config_walk.py                 # this checkout
    python scripts/trace_config_walk.py --root OTHER    # another checkout (its own layers)

Runs `shadowsync train` (2 trainers, 1 embedding server, --sync s-bmuf, 20,000 examples)
with a profiler in every process of the job (a `sitecustomize` on PYTHONPATH): from the call
of `cluster/roles.py:role_main` to its return, on the process's main thread, every call of a
function of the package that is handed the configuration (an argument that is the
`TrainConfig` or one of its sections). Counted, per process, over that sequence of calls:

- files: the package's files the walk enters;
- stays: maximal runs of consecutive walk calls in one file;
- re-entries: stays in a file the walk had already left;
- climbs: walk calls made from a file of a lower layer than the called function's
  (layers as the checkout's `scripts/check_layers.py` places the modules);
- ups: consecutive stays where the walk moves into a file of a higher layer (back up
  into a room it had gone down from, e.g. from config/ back to train/ or cluster/), and
  how many of them are the composition root's next call (`cluster/roles.py` building a
  process's parts in order: the walk went back up by returning, not by a call from below).

Prints two lines per process (its role is the first of run_trainer / serve_embeddings /
serve_dense in its walk): over every such call, and without the calls of the configuration's
own methods (`cfg.sync.entry`, `cfg.model.table_rows()`: the config answering, not the code
walking with it); `--show` prints the trainers' walks.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
ROOT = "cluster/roles.py"  # the composition root: it builds a process's parts in order

SITECUSTOMIZE = r'''
import json, os, sys, threading

_OUT = os.environ.get("WALK_TRACE_OUT")
_PKG = os.environ.get("WALK_TRACE_PKG", "")


def _is_config(value):
    return type(value).__module__.startswith("shadowsync.config")


def _start():
    walk = []

    def full(frame, event, arg):
        code = frame.f_code
        if event == "call" and code.co_filename.startswith(_PKG):
            args = list(frame.f_locals.values())[:code.co_argcount + code.co_kwonlyargcount]
            if any(_is_config(v) for v in args):
                caller = frame.f_back.f_code.co_filename if frame.f_back else ""
                own = code.co_varnames[:1] == ("self",) and _is_config(args[0])
                walk.append((code.co_filename[len(_PKG):], code.co_name,
                             caller[len(_PKG):] if caller.startswith(_PKG) else "", own))
        elif event == "return" and code.co_name == "role_main" and \
                code.co_filename.endswith("cluster/roles.py"):
            sys.setprofile(None)
            with open(os.path.join(_OUT, f"{os.getpid()}.json"), "w") as f:
                json.dump({"rank": os.environ.get("RANK"), "walk": walk}, f)

    return full


def _watch(frame, event, arg):
    if event == "call" and frame.f_code.co_name == "role_main" and \
            frame.f_code.co_filename.endswith("cluster/roles.py"):
        prof = _start()
        sys.setprofile(prof)
        prof(frame, event, arg)


if _OUT and threading.current_thread() is threading.main_thread():
    sys.setprofile(_watch)
'''


def layer_rank(root: Path):
    spec = importlib.util.spec_from_file_location("check_layers_of_root",
                                                  root / "scripts" / "check_layers.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]

    def rank(rel: str) -> int | None:
        module = "shadowsync." + rel.removesuffix(".py").replace("/", ".")
        module = module.removesuffix(".__init__")
        unit = mod.unit_of(module)
        return mod.RANK[unit] if unit is not None else None

    return rank


def measure(walk: list[list], rank) -> dict:
    files = [callee for callee, _, _, _ in walk]
    stays = [f for i, f in enumerate(files) if i == 0 or files[i - 1] != f]
    seen: set[str] = set()
    reentries = 0
    for f in stays:
        reentries += f in seen
        seen.add(f)
    climbs = 0
    for callee, _, caller, _ in walk:
        a, b = rank(caller) if caller else None, rank(callee)
        climbs += a is not None and b is not None and a < b
    starts = [i for i, f in enumerate(files) if i == 0 or files[i - 1] != f]
    ranks = [rank(f) for f in stays]
    up_at = [starts[i + 1] for i, (a, b) in enumerate(zip(ranks, ranks[1:]))
             if a is not None and b is not None and b > a]
    by_root = sum(1 for i in up_at if walk[i][2] == ROOT)
    return {"files": len(set(files)), "stays": len(stays), "reentries": reentries,
            "climbs": climbs, "ups": len(up_at), "ups_by_root": by_root, "calls": len(walk),
            "per_file": Counter(stays).most_common(4)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=str(HERE), help="the checkout to trace")
    parser.add_argument("--show", action="store_true", help="print trainer 0's walk too")
    args = parser.parse_args()
    root = Path(args.root).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        (tmp_path / "site").mkdir()
        (tmp_path / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
        (tmp_path / "trace").mkdir()
        env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'site'}:{root}",
               "WALK_TRACE_OUT": str(tmp_path / "trace"),
               "WALK_TRACE_PKG": str(root / "shadowsync") + "/"}
        cmd = [sys.executable, "-m", "shadowsync.cli", "train", "--trainers", "2",
               "--embedding-servers", "1", "--sync", "s-bmuf", "--examples", "20000",
               "--checkpoint-every", "10000", "-q", "--out", str(tmp_path / "run")]
        subprocess.run(cmd, env=env, check=True, timeout=600, cwd=tmp_path,
                       stdout=subprocess.DEVNULL)
        rank = layer_rank(root)
        for path in sorted((tmp_path / "trace").glob("*.json")):
            data = json.loads(path.read_text())
            names = [name for _, name, _, _ in data["walk"]]
            role = next((n for n in names if n in ("run_trainer", "serve_embeddings",
                                                   "serve_dense")), "?")
            for label, walk in (("all calls", data["walk"]),
                                ("without the config's own methods",
                                 [c for c in data["walk"] if not c[3]])):
                m = measure(walk, rank)
                print(f"rank {data['rank']} ({role}, {label}): {m['files']} files, "
                      f"{m['stays']} stays, {m['reentries']} re-entries, {m['climbs']} climbs, "
                      f"{m['ups']} ups ({m['ups_by_root']} the root's next call), "
                      f"{m['calls']} calls; most stays: {m['per_file']}")
            if args.show and role == "run_trainer":
                for callee, name, caller, _ in data["walk"]:
                    print(f"    {callee}:{name}  <- {caller}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
