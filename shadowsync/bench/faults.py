"""`shadowsync bench faults`: a job stopped by a signal and resumed, next to the same job run
without interruption.

Each scenario drives the command line as a user would: `shadowsync train` in its own process
group, a signal to the whole group (what a terminal's Ctrl-C does) once training has passed a
random point, then `shadowsync train --resume RUN`. It records whether the run recovered, the
exit code and the seconds until every process was gone, the examples trained twice, and the
resumed run's final NE against the clean run's. `recovery_s` is the resumed run's time
that is not training (process start-up, loading the checkpoint, final evaluation).

Scenarios measured here: SIGINT and SIGTERM, each then resumed. Killed processes
(--max-restarts), NaN rollback and a memory soak are not implemented yet.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from shadowsync.bench.common import print_table, write_bench


def job_args(examples: int, seed: int) -> list[str]:
    return ["--examples", str(examples), "--table-size", "5000", "--seed", str(seed),
            "--log-every", "5000", "--checkpoint-every", "0", "--eval-points", "0",
            "--no-progress", "-q"]


def session_pids(sid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == sid:
                    pids.append(int(entry.name))
            except (ProcessLookupError, PermissionError):
                pass
    return pids


def trained_examples(out: Path) -> int:
    try:
        lines = (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return 0
    rows = [json.loads(line) for line in lines if line.strip()]
    return max((r.get("examples", 0) for r in rows if r.get("trainer") == 0), default=0)


def cli(args: list[str], timeout: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "shadowsync.cli", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def interrupt_run(out: Path, args: list[str], sig: int, after_examples: int,
                  timeout: float = 600) -> dict[str, Any]:
    """Start a run, signal its process group once trainer 0 has logged `after_examples`;
    return the exit code, the seconds until no process of the run was left, and its stderr."""
    proc = cli(["train", "--out", str(out), *args], timeout)
    t_start = time.monotonic()
    while proc.poll() is None and trained_examples(out) < after_examples:
        if time.monotonic() - t_start > timeout:
            break
        time.sleep(0.1)
    t0 = time.monotonic()
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
    _, err = proc.communicate(timeout=timeout)
    while session_pids(proc.pid) and time.monotonic() - t0 < 60:
        time.sleep(0.1)
    gone_s = time.monotonic() - t0
    left = session_pids(proc.pid)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return {"rc": proc.returncode, "gone_s": round(gone_s, 2), "left": len(left),
            "stderr": err.strip().splitlines()[-3:]}


def finish(args: list[str], timeout: float = 900) -> dict[str, Any]:
    proc = cli(args, timeout)
    _, err = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"shadowsync {' '.join(args)} failed: {err.strip()[-500:]}")
    return {}


def run_faults_bench(out: Path, examples: int = 400_000, repeats: int = 2,
                     seed: int = 0) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    runs: list[dict[str, Any]] = []
    scenarios = [("sigint-resume", signal.SIGINT), ("sigterm-resume", signal.SIGTERM)]
    for r in range(repeats):
        clean_dir = out / f"clean-{r}"
        finish(["train", "--out", str(clean_dir), *job_args(examples, r)])
        clean = json.loads((clean_dir / "summary.json").read_text())
        runs.append({"name": "clean", "repeat": r, "eval_ne": clean["eval_ne"],
                     "wall_s": clean["wall_s"]})
        for name, sig in scenarios:
            run_dir = out / f"{name}-{r}"
            at = int(examples / 2 * rng.uniform(0.2, 0.8))  # trainer 0's share of the data
            stop = interrupt_run(run_dir, job_args(examples, r), sig, at)
            t0 = time.monotonic()
            finish(["train", "--resume", str(run_dir)])
            resumed = json.loads((run_dir / "summary.json").read_text())
            runs.append({
                "name": name, "repeat": r, "signal_after_examples": at * 2,
                "exit_code": stop["rc"], "expected_exit_code": 128 + sig,
                "all_gone_s": stop["gone_s"], "processes_left": stop["left"],
                "recovered": resumed.get("resumed_from") is not None
                and resumed["examples"] >= clean["examples"],
                "resumed_at_examples": resumed.get("resumed_examples"),
                "examples_lost": max(0, clean["examples"] - resumed["examples"]),
                "examples_trained_twice": resumed.get("examples_trained_twice"),
                # the resumed run from command to exit, and the part of it that is not
                # training (start-up, loading the checkpoint, final evaluation)
                "resume_total_s": round(time.monotonic() - t0, 2),
                "recovery_s": round(time.monotonic() - t0 - resumed["wall_s"], 2),
                "eval_ne": resumed["eval_ne"],
                "eval_ne_vs_clean": resumed["eval_ne"] / clean["eval_ne"],
                "stop_line": stop["stderr"][-1] if stop["stderr"] else "",
            })
    scenarios_out = []
    for name, _ in scenarios:
        mine = [x for x in runs if x["name"] == name]
        scenarios_out.append({
            "name": name, "recovered": all(x["recovered"] for x in mine),
            "examples_lost": max(x["examples_lost"] for x in mine),
            "recovery_s": max(x["recovery_s"] for x in mine),
            "eval_ne_vs_clean": [round(x["eval_ne_vs_clean"], 4) for x in mine],
            "all_gone_s": [x["all_gone_s"] for x in mine],
        })
    path = write_bench(out, "faults", runs, {}, {"scenarios": scenarios_out,
                                                  "examples": examples})
    print_table([[s["name"], s["recovered"], s["examples_lost"], s["recovery_s"],
                  " ".join(f"{v:.4f}" for v in s["eval_ne_vs_clean"]),
                  " ".join(f"{v:.1f}" for v in s["all_gone_s"])] for s in scenarios_out],
                ["scenario", "recovered", "lost", "recovery_s", "ne_vs_clean", "gone_s"])
    return path
