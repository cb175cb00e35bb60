"""`shadowsync bench faults`: faults injected into a job, each next to the same job run clean.

Each scenario drives the command line as a user would, `shadowsync train` in its own process
group:
- `sigint-resume`, `sigterm-resume`: the signal to the whole group (what a terminal's Ctrl-C
  does) at a random point, then `shadowsync train --resume RUN`;
- `kill-trainer`, `kill-worker`, `kill-embedding-server`, `kill-dense-server`: `kill -9` of
  one process of the job (trainer 1, trainer 0's first Hogwild worker, embedding server 0,
  dense server 0 of a `bsp` job; found in the run's list of processes) at a random point
  after the first checkpoint; the job restarts itself from its newest checkpoint
  (--max-restarts) and must finish;
- `nan-rollback`: a NaN injected at a random point (`--inject-nan-at N`) with
  `--on-divergence rollback`: the job goes back to its last good checkpoint and finishes.

Per scenario: whether it recovered (finished every example; restarted or rolled back where
that is the point), the examples lost (trained again: past the checkpoint it went back to),
`recovery_s` (kills and NaN: from the fault until the job trains again; resumes: the resumed
run's time that is not training) and its final eval NE over the clean run's.

Then a soak: the same job trained for `soak_s` seconds (its data sized from the clean run's
speed, stopped by SIGTERM at the end), sampling every process's resident memory from
/proc/PID/status. `rss_growth`: the job's resident memory at the end over its memory after
warm-up, less one; counted without file-backed pages (RssFile: the memory-mapped training
data, page cache that a single pass keeps touching) as VmRSS - RssFile; raw VmRSS is reported
beside it.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from shadowsync.bench.common import print_table, write_bench
from shadowsync.checkpoint.store import CHECKPOINT_DIR, published
from shadowsync.data.dataset import open_data
from shadowsync.lifecycle import attempts

SIGNALS = {"sigint-resume": signal.SIGINT, "sigterm-resume": signal.SIGTERM}
KILLS = {"kill-trainer": "trainer1", "kill-worker": "trainer0-worker0",
         "kill-embedding-server": "emb0", "kill-dense-server": "dense0"}
SCENARIOS = (*SIGNALS, *KILLS, "nan-rollback")
# The job of a scenario that needs another than the default (with its own clean run): the
# default s-bmuf has no dense server to kill; bsp's holds the dense model itself.
SYNC = {"kill-dense-server": "bsp"}


def job_args(examples: int, seed: int, sync: str | None = None) -> list[str]:
    """The job every scenario runs: 2 trainers, 1 embedding server, s-bmuf (the defaults)
    unless `sync`, checkpointed five times over the run."""
    return ["--examples", str(examples), "--table-size", "5000", "--seed", str(seed),
            "--log-every", "5000", "--checkpoint-every", str(checkpoint_interval(examples)),
            "--eval-points", "0", "--no-progress", "-q", *(["--sync", sync] if sync else [])]


def checkpoint_interval(examples: int) -> int:
    return max(1, examples // 5)


def session_pids(sid: int) -> list[int]:
    """The live processes of session `sid`. A zombie has ended: it waits only for its parent
    to collect its exit status, which for an orphan is the machine's init, whenever that
    looks (one did so every 1-2 s, and counting its zombies made every run seem to leave a
    process behind for that long)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == sid and attempts.alive(int(entry.name)):
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


def progress(out: Path, attempt: int, trainer: int = 0) -> int | None:
    """A trainer's examples in `attempt` of the run's current launch (None: not started)."""
    return attempts.noted(out, attempts.trained_name(attempt, trainer))


class TrainsAgain:
    """True once trainer 0 of `attempt` has had a report from its workers: its count moved
    past the value it started from (where it resumed). `resumed`: only an attempt that
    resumed from a checkpoint counts (not a previous launch's files)."""

    def __init__(self, run: Path, attempt: int, resumed: bool = False) -> None:
        self.run, self.attempt, self.resumed = run, attempt, resumed
        self.first: int | None = None

    def __call__(self) -> bool:
        done = progress(self.run, self.attempt)
        if done is None:
            return False
        if self.first is None:
            at = attempts.noted(self.run, attempts.resumed_name(self.attempt))
            if at is None or (self.resumed and at == 0):
                return False
            self.first = done
        return done > self.first


class Job:
    """`shadowsync ARGS` in its own session; stderr collected, with the time of each line."""

    def __init__(self, args: list[str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "shadowsync.cli", *args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, start_new_session=True)
        self.lines: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float) -> int:
        """The exit code, once every process of the job is gone (killed after `timeout`)."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        t0 = time.monotonic()
        while session_pids(self.proc.pid) and time.monotonic() - t0 < 30:
            time.sleep(0.1)
        for pid in session_pids(self.proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=30)
        self._reader.join(timeout=5)
        return self.proc.returncode

    def stderr_tail(self, n: int = 3) -> list[str]:
        return [line for _, line in self.lines[-n:]]


def wait_until(cond: Any, job: Job, timeout: float, step: float = 0.05) -> bool:
    t0 = time.monotonic()
    while job.running() and time.monotonic() - t0 < timeout:
        if cond():
            return True
        time.sleep(step)
    return bool(cond())


def finish(args: list[str], timeout: float = 900) -> dict[str, Any]:
    job = Job(args)
    if job.wait(timeout) != 0:
        raise RuntimeError(f"shadowsync {' '.join(args)} failed: "
                           f"{' / '.join(job.stderr_tail(5))}")
    return {}


def summary_of(run: Path) -> dict[str, Any]:
    try:
        return json.loads((run / "summary.json").read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return {}


def signal_scenario(run: Path, examples: int, seed: int, sig: int, at: int,
                    timeout: float) -> dict[str, Any]:
    """Signal the job's process group once trainer 0 has logged `at` examples, then resume."""
    job = Job(["train", "--out", str(run), *job_args(examples, seed)])
    wait_until(lambda: trained_examples(run) >= at, job, timeout, step=0.1)
    t0 = time.monotonic()
    if job.running():
        os.killpg(job.proc.pid, sig)
    rc = job.wait(timeout)
    gone_s = time.monotonic() - t0
    t1 = time.monotonic()
    resumed_ok = True
    try:
        finish(["train", "--resume", str(run)], timeout)
    except RuntimeError:
        resumed_ok = False
    s = summary_of(run)
    total = time.monotonic() - t1
    return {
        "exit_code": rc, "expected_exit_code": 128 + sig, "all_gone_s": round(gone_s, 2),
        "recovered": resumed_ok and s.get("resumed_from") is not None,
        "resumed_at_examples": s.get("resumed_examples"),
        "examples_lost": 0 if resumed_ok else None,  # a stop saves exactly where it stopped
        "examples_trained_twice": s.get("examples_trained_twice"),
        # the resumed run from command to exit, and the part of it that is not training
        # (start-up, loading the checkpoint, final evaluation)
        "resume_total_s": round(total, 2),
        "recovery_s": round(total - s["wall_s"], 2) if "wall_s" in s else None,
        "summary": s, "stop_line": job.stderr_tail(1)[-1] if job.lines else "",
    }


def kill_scenario(run: Path, examples: int, seed: int, victim: str, at: int,
                  timeout: float, sync: str | None = None,
                  expected: int | None = None) -> dict[str, Any]:
    """kill -9 the process named `victim` once a checkpoint is published and trainer 0 has
    passed `at` examples; the job should restart itself from the checkpoint and finish
    (train `expected` examples, as its clean run did; default `examples`)."""
    job = Job(["train", "--out", str(run), *job_args(examples, seed, sync)])

    def ready() -> bool:
        done = progress(run, 0)
        return bool(published(run / CHECKPOINT_DIR)) and done is not None and done >= at

    wait_until(ready, job, timeout)
    pids = [pid for a, name, pid in attempts.processes(run) if a == 0 and name == victim]
    killed_at = None
    if job.running() and pids:
        os.kill(pids[0], signal.SIGKILL)
        killed_at = time.monotonic()
    # Recovery in three parts: the failed attempt's processes gone, the restarted ones
    # started (noted in the list), training again.
    marks: dict[str, float] = {}
    again = TrainsAgain(run, 1)

    def recovered() -> bool:
        now = time.monotonic()
        seen = attempts.processes(run)
        if "old_gone" not in marks and not any(attempts.alive(p) for a, _, p in seen if a == 0):
            marks["old_gone"] = now
        launched = sum(1 for a, n, _ in seen if a == 0 and "-" not in n)  # not workers
        if "started" not in marks and sum(1 for a, n, _ in seen if a == 1 and "-" not in n) \
                >= launched:
            marks["started"] = now
        return again()

    training_again = None
    if killed_at is not None and wait_until(recovered, job, timeout):
        training_again = time.monotonic()
    rc = job.wait(timeout)
    s = summary_of(run)
    return {
        "victim": victim, "killed": killed_at is not None, "exit_code": rc,
        "recovered": rc == 0 and killed_at is not None and s.get("restarts", 0) >= 1
        and s.get("examples") == (expected or examples),
        "restarts": s.get("restarts"), "examples_lost": s.get("examples_lost"),
        "resumed_at_examples": s.get("resumed_examples"),
        "recovery_s": round(training_again - killed_at, 2)
        if training_again is not None and killed_at is not None else None,
        **{f"{k}_s": round(t - killed_at, 2) for k, t in marks.items() if killed_at},
        "summary": s, "stderr_tail": job.stderr_tail(),
    }


def nan_scenario(run: Path, examples: int, seed: int, at: int,
                 timeout: float) -> dict[str, Any]:
    """A NaN injected after `at` examples, with rollback to the last good checkpoint."""
    job = Job(["train", "--out", str(run), *job_args(examples, seed), "--inject-nan-at",
               str(at), "--on-divergence", "rollback"])
    # The launcher says it rolls back (one warning line), then launches the job again.
    reached = [0]  # the diverged launch's examples, all trainers together

    def rolling_back() -> bool:
        reached[0] = max(reached[0], sum(progress(run, 0, t) or 0 for t in range(2)))
        return any("rolling back" in line for _, line in job.lines)

    wait_until(rolling_back, job, timeout)
    rolled = next((t for t, line in job.lines if "rolling back" in line), None)
    training_again = None
    # The launch after the rollback starts its attempts afresh: its attempt 0 resumed > 0.
    if rolled is not None and wait_until(TrainsAgain(run, 0, resumed=True), job, timeout):
        training_again = time.monotonic()
    rc = job.wait(timeout)
    s = summary_of(run)
    back = s.get("rollbacks") or []
    went_back_to = int(Path(back[0]["checkpoint"]).name.split("-")[1]) if back else None
    return {
        "nan_at": at, "exit_code": rc,
        "recovered": rc == 0 and bool(back) and s.get("examples") == examples,
        "rollbacks": len(back), "rolled_back_to": went_back_to,
        # trained again: from the checkpoint it went back to up to where it diverged
        "examples_lost": max(0, reached[0] - went_back_to) if went_back_to is not None
        else None,
        "recovery_s": round(training_again - rolled, 2)
        if training_again is not None and rolled is not None else None,
        "summary": s, "stderr_tail": job.stderr_tail(),
    }


def memory_of(pid: int) -> tuple[int, int] | None:
    """(VmRSS, RssFile) of a process in kB, None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text(encoding="ascii")
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    try:
        return int(fields["VmRSS"].split()[0]), int(fields["RssFile"].split()[0])
    except (KeyError, ValueError):
        return None


def soak_data(dest: Path, examples: int, seed: int, rows: int) -> Path:
    """An array directory of `rows` rows: the job's synthetic data repeated (generating as
    many fresh rows would take longer than the soak)."""
    src = open_data("synthetic", examples=examples + examples // 9, seed=seed)
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("labels", "dense", "cats"):
        a = getattr(src, name)
        out = np.lib.format.open_memmap(dest / f"{name}.npy", mode="w+", dtype=a.dtype,
                                        shape=(rows, *a.shape[1:]))
        for start in range(0, rows, len(a)):
            n = min(len(a), rows - start)
            out[start:start + n] = a[:n]
        out.flush()
        del out
    return dest


def soak(run: Path, examples: int, seed: int, soak_s: float, eps: float, warmup_s: float,
         timeout: float) -> dict[str, Any]:
    """Train the job for `soak_s` seconds (then SIGTERM) and compare every process's resident
    memory `warmup_s` into training with its memory at the end. Its data: the job's own,
    repeated to last the soak at the clean run's speed (`eps`) with room to spare."""
    rows = int(max(2 * examples, eps * soak_s * 1.5 * 10 / 9))
    data = soak_data(run.parent / "soak-data", examples, seed, rows)
    args = job_args(examples, seed)
    args[args.index("--examples") + 1] = str(rows - rows // 10)
    args[args.index("--checkpoint-every") + 1] = "300s"  # the default
    # Batches of 64: four times the steps per row, so a leak per step shows four times sooner,
    # and the job trains at about half the clean run's pace (measured: 28.6k against 70k
    # examples/s), so ten minutes of it fit in a data file sized from the clean run. At 256
    # the default job had outrun such a file in 8 minutes on an idle machine.
    args += ["--batch-size", "64"]
    job = Job(["train", "--out", str(run), "--data", str(data), *args])
    wait_until(lambda: (progress(run, 0) or 0) > 0, job, timeout)  # training
    t_start = time.monotonic()
    samples: list[dict[int, tuple[int, int]]] = []
    times: list[float] = []
    warm_index = None
    while job.running() and time.monotonic() - t_start < soak_s:
        procs = {pid: name for a, name, pid in attempts.processes(run) if a == 0}
        samples.append({pid: m for pid in procs if (m := memory_of(pid)) is not None})
        times.append(time.monotonic() - t_start)
        if warm_index is None and times[-1] >= warmup_s:
            warm_index = len(samples) - 1
        time.sleep(min(5.0, max(0.5, soak_s / 100)))
    trained_s = time.monotonic() - t_start
    names = {pid: name for a, name, pid in attempts.processes(run) if a == 0}
    if job.running():
        os.killpg(job.proc.pid, signal.SIGTERM)
    rc = job.wait(timeout)

    shutil.rmtree(data, ignore_errors=True)
    # The end: the last sample in which every process of the warm-up still ran (a job that
    # finished its data before the soak's time was up has none in its final samples).
    warm = samples[warm_index] if warm_index is not None else {}
    live = [i for i in range(warm_index + 1, len(samples))
            if all(p in samples[i] for p in warm)] if warm else []
    if not live:
        return {"soak_s": round(trained_s, 1), "exit_code": rc, "rss_growth": None,
                "rows": rows, "note": "too short to compare warm-up with the end"}
    end_index = live[-1]
    end = samples[end_index]
    both = list(warm)

    def total(sample: dict[int, tuple[int, int]], anon: bool) -> int:
        return sum(sample[p][0] - (sample[p][1] if anon else 0) for p in both)

    per = {names.get(p, str(p)): {"warm_kb": warm[p][0] - warm[p][1],
                                  "end_kb": end[p][0] - end[p][1],
                                  "vmrss_warm_kb": warm[p][0], "vmrss_end_kb": end[p][0]}
           for p in both}
    return {
        "soak_s": round(trained_s, 1), "warmup_s": round(times[warm_index], 1),
        "end_s": round(times[end_index], 1), "rows": rows, "exit_code": rc,
        "processes": len(both),
        "rss_growth": round(total(end, True) / total(warm, True) - 1, 4),
        "vmrss_growth": round(total(end, False) / total(warm, False) - 1, 4),
        "max_process_growth": round(max((v["end_kb"] / v["warm_kb"] - 1)
                                        for v in per.values()), 4),
        "per_process": per,
    }


def run_faults_bench(out: Path, examples: int = 300_000, repeats: int = 1, seed: int = 0,
                     scenarios: tuple[str, ...] = SCENARIOS, soak_s: float = 600.0,
                     timeout: float = 900.0) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    runs: list[dict[str, Any]] = []
    per_trainer = examples // 2  # trainer 0's share of the data (2 trainers)
    for r in range(repeats):
        cleans: dict[str | None, dict[str, Any]] = {}
        for sync in dict.fromkeys(SYNC.get(name) for name in scenarios):
            clean_dir = out / (f"clean-{sync}-{r}" if sync else f"clean-{r}")
            finish(["train", "--out", str(clean_dir), *job_args(examples, r, sync)], timeout)
            cleans[sync] = summary_of(clean_dir)
            runs.append({"name": f"clean-{sync}" if sync else "clean", "repeat": r,
                         "eval_ne": cleans[sync]["eval_ne"], "wall_s": cleans[sync]["wall_s"],
                         "eps": cleans[sync]["eps"]})
        for name in scenarios:
            clean = cleans[SYNC.get(name)]
            run_dir = out / f"{name}-{r}"
            frac = rng.uniform(0.3, 0.7)
            if name in SIGNALS:
                res = signal_scenario(run_dir, examples, r, SIGNALS[name],
                                      int(per_trainer * frac), timeout)
            elif name in KILLS:
                res = kill_scenario(run_dir, examples, r, KILLS[name],
                                    int(per_trainer * frac), timeout, SYNC.get(name),
                                    clean["examples"])
            else:
                res = nan_scenario(run_dir, examples, r, int(examples * frac), timeout)
            s = res.pop("summary")
            ne = s.get("eval_ne")
            runs.append({"name": name, "repeat": r, **res, "eval_ne": ne,
                         "eval_ne_vs_clean": ne / clean["eval_ne"] if ne else None})
    soaked = None
    if soak_s > 0:
        eps = min(x["eps"] for x in runs if x["name"].startswith("clean"))
        soaked = soak(out / "soak", examples, 0, soak_s, eps,
                      warmup_s=min(120.0, soak_s / 5), timeout=timeout)
    scenarios_out = []
    for name in scenarios:
        mine = [x for x in runs if x["name"] == name]
        lost = [x["examples_lost"] for x in mine]
        rec = [x["recovery_s"] for x in mine]
        scenarios_out.append({
            "name": name, "recovered": all(x["recovered"] for x in mine),
            "examples_lost": None if None in lost else max(lost),
            "recovery_s": None if None in rec else max(rec),
            "eval_ne_vs_clean": [round(x["eval_ne_vs_clean"], 4) if x["eval_ne_vs_clean"]
                                 else None for x in mine],
        })
    path = write_bench(out, "faults", runs, {}, {
        "scenarios": scenarios_out, "examples": examples,
        "checkpoint_every_examples": checkpoint_interval(examples),
        "rss_growth": soaked["rss_growth"] if soaked else None, "soak": soaked})
    print_table([[s["name"], s["recovered"], s["examples_lost"], s["recovery_s"],
                  " ".join("-" if v is None else f"{v:.4f}" for v in s["eval_ne_vs_clean"])]
                 for s in scenarios_out],
                ["scenario", "recovered", "lost", "recovery_s", "ne_vs_clean"])
    if soaked:
        print(f"soak {soaked['soak_s']} s: rss_growth {soaked['rss_growth']} "
              f"(VmRSS {soaked.get('vmrss_growth')})")
    return path
