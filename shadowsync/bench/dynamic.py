"""`shadowsync bench dynamic`: dynamic embedding tables against hashing into fixed tables.

Three parts, each a figure the docs page (docs/dynamic-tables.md) reports:

- **quality**: Zipf raw ids over 10^7 values a feature (`shadowsync.data.zipf`), one pass on
  the default job's shape (2 trainers, 1 embedding server), for each budget of `rows` rows a
  feature (10^5 and 10^4 by default): fixed tables of `rows` rows see the ids folded modulo
  `rows` (what ``hash = true`` does); dynamic tables with admission after 2 or 4 sightings
  get the same rows, and, at equal bytes, the fixed tables' memory as --table-memory (fewer
  rows: the map costs bytes too). Eval NE and AUC on the last 10%, and how many ids and
  lookups hashing made share a row (collisions).
- **eps**: the default job (synthetic data, 26 features) with fixed and dynamic tables,
  interleaved; the ratio of median training EPS (goal >= 0.9); and one embedding step's
  milliseconds in one process (the map's own cost, without other processes in the way).
- **memory**: the peak RSS of a process holding one server's dynamic tables while the ids
  it is fed grow 10x in number (the pool, its map and its sketch are allocated up front).
"""

from __future__ import annotations

import multiprocessing as mp
import resource
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shadowsync.bench.common import (
    interleaved,
    median_of,
    print_table,
    ratio_of_medians,
    write_bench,
)
from shadowsync.bench.sync import job, run_job


def hashed_copy(src: Path, dst: Path, rows: int) -> None:
    """The arrays of `src` with every id folded modulo `rows`, as ``hash = true`` folds."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("labels.npy", "dense.npy"):
        shutil.copy(src / name, dst / name)
    np.save(dst / "cats.npy", np.load(src / "cats.npy") % rows)


def collision_rate(cats: np.ndarray, rows: int) -> dict[str, float]:
    """Of the distinct ids of each feature, the share whose row (id mod rows) some other
    distinct id also folds to; and the share of lookups that read such a row."""
    shared_ids = shared_lookups = distinct = 0
    for f in range(cats.shape[1]):
        ids, counts = np.unique(cats[:, f], return_counts=True)
        row_of = ids % rows
        per_row = np.bincount(row_of, minlength=rows)
        shared = per_row[row_of] > 1
        shared_ids += int(shared.sum())
        shared_lookups += int(counts[shared].sum())
        distinct += len(ids)
    return {"ids_sharing_a_row": shared_ids / distinct,
            "lookups_on_shared_rows": shared_lookups / cats.size, "distinct_ids": distinct}


def _quality(out: Path, examples: int, budgets: tuple[int, ...], repeats: int
             ) -> dict[str, Any]:
    from shadowsync.data.zipf import write_days

    data = out / "data"
    info = write_days(data, examples, days=1)
    raw = data / "day0"
    features = info["config"]["features"]
    train = int(examples * 0.9)
    cats = np.load(raw / "cats.npy")[:train]
    variants, collisions, fixed_bytes = {}, {}, {}

    def hashed(rows: int) -> dict[str, Any]:
        return run_job(job(data=str(data / f"day0-mod{rows}"), examples=train,
                           table_size=[rows]), out / "runs" / f"hash-{rows}")

    def dynamic(rows: int, admit: int, equal_bytes: bool = False) -> dict[str, Any]:
        memory = {"table_memory": str(fixed_bytes[rows])} if equal_bytes else {}
        name = f"dynamic-admit{admit}{'-equal-bytes' if equal_bytes else ''}-{rows}"
        return run_job(job(data=str(raw), tables="dynamic", admit_after=admit, examples=train,
                           table_size=[rows], **memory), out / "runs" / name)

    for rows in budgets:
        hashed_copy(raw, data / f"day0-mod{rows}", rows)
        collisions[rows] = collision_rate(cats, rows)
        # Rows of 16 floats and an id bias, and Adagrad's sum a row.
        fixed_bytes[rows] = features * rows * (17 + 1) * 4
        variants.update({
            f"hash-{rows}": lambda rows=rows: hashed(rows),
            f"dynamic-admit2-{rows}": lambda rows=rows: dynamic(rows, 2),
            f"dynamic-admit4-{rows}": lambda rows=rows: dynamic(rows, 4),
            f"dynamic-admit2-equal-bytes-{rows}": lambda rows=rows: dynamic(rows, 2, True),
        })
    runs = interleaved(variants, repeats, "quality", out / "runs.jsonl")
    return {"runs": runs, "variants": list(variants), "collisions": collisions,
            "fixed_table_bytes": fixed_bytes,
            "teacher_eval_ne": info["days"]["day0"]["teacher_eval_ne"]}


def _eps(out: Path, examples: int, repeats: int) -> list[dict[str, Any]]:
    variants = {
        "fixed": lambda: run_job(job(examples), out / "runs" / "fixed"),
        "dynamic": lambda: run_job(job(examples, tables="dynamic"),
                                   out / "runs" / "dynamic-eps"),
    }
    return interleaved(variants, repeats, "eps", out / "runs.jsonl")


def _steps(examples: int, repeats: int) -> list[dict[str, Any]]:
    """Milliseconds of one embedding step (apply a batch's gradients, read the next batch)
    in this process, one thread, on the default job's batches (26 features x 256 examples):
    fixed tables of 100,000 rows a feature against dynamic tables of the same budget
    (admission at once, and after 2 sightings), interleaved. The map's cost without the
    rest of a training step, and without other processes in the way."""
    from shadowsync.data.dataset import batches, open_data
    from shadowsync.embeddings import EmbeddingTables
    from shadowsync.embeddings.dynamic_tables import DynamicSpec

    torch.set_num_threads(1)
    data = open_data("synthetic", examples=examples)
    raw = [ids for _, ids, _ in batches(data, 0, examples, 256, table_size=[0] * 26)]
    folded = [ids for _, ids, _ in batches(data, 0, examples, 256, table_size=[100_000] * 26)]
    grads = torch.randn(256, 26, 17) * 0.01
    optimizer = {"lr": 0.2, "initial_accumulator": 0.05}

    def timed(tables: Any, ids: list[Any]) -> dict[str, Any]:
        tables.lookup(ids[0])
        seconds = []
        for prev, nxt in zip(ids, ids[1:]):
            t0 = time.perf_counter()
            tables.update_and_lookup(prev, grads, nxt)
            seconds.append(time.perf_counter() - t0)
        return {"step_ms": float(np.median(seconds[len(seconds) // 4:]) * 1e3)}

    variants = {
        "fixed": lambda: timed(EmbeddingTables([100_000] * 26, 17, **optimizer), folded),
        "dynamic": lambda: timed(DynamicSpec(26, 2_600_000).build(17, 0, **optimizer), raw),
        "dynamic-admit2": lambda: timed(
            DynamicSpec(26, 2_600_000, admit_after=2).build(17, 0, **optimizer), raw),
    }
    return interleaved(variants, repeats, "embedding steps")


def _rss_mb() -> float:
    with open("/proc/self/statm", encoding="ascii") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize() / 2**20


def _hold(capacity: int, batches: int, results: Any) -> None:
    """A process that holds one server's dynamic tables (26 tables, admission after 2
    sightings) and feeds them `batches` batches of 256 x 26 ids: half from a Zipf head that
    keeps coming back, half never seen before (so the distinct ids grow with the batches).
    Its RSS once the tables are built, its peak RSS, and the map's counters."""
    from shadowsync.embeddings.dynamic_tables import DynamicSpec

    tables = DynamicSpec(26, capacity, admit_after=2).build(17, 0, lock_path=None)
    built = _rss_mb()
    rng = np.random.default_rng(0)
    fresh = 10**12
    for _ in range(batches):
        ids = rng.zipf(1.05, (256, 26))
        new = rng.random((256, 26)) < 0.5
        ids[new] = fresh + np.arange(int(new.sum()))
        fresh += int(new.sum())
        tables.rows_of(torch.from_numpy(ids), admit=True)
        tables.rows_of(torch.from_numpy(ids), admit=True)  # seen twice: admitted
    results.put({"distinct_ids_fed": fresh - 10**12, "rss_built_mb": built,
                 "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                 **tables.counters()})


def _memory(capacity: int, batches: int) -> list[dict[str, Any]]:
    ctx = mp.get_context("spawn")
    out = []
    for n in (batches // 10, batches):
        q = ctx.Queue()
        p = ctx.Process(target=_hold, args=(capacity, n, q))
        p.start()
        out.append({"batches": n, **q.get(timeout=600)})
        p.join(timeout=60)
    return out


def run_dynamic_bench(out: str, examples: int = 400_000,
                      budgets: tuple[int, ...] = (100_000, 10_000),
                      eps_examples: int = 300_000, repeats: int = 3,
                      quality_repeats: int = 1, memory_batches: int = 1000) -> dict[str, Any]:
    root = Path(out)
    t0 = time.time()
    quality = _quality(root, examples, budgets, quality_repeats)
    eps_runs = _eps(root, eps_examples, repeats)
    ratio, spread = ratio_of_medians(eps_runs, "dynamic", "fixed", "eps")
    memory = _memory(capacity=200_000, batches=memory_batches)
    steps = _steps(eps_examples, repeats)
    q = quality["runs"]
    summary = {
        "quality": {v: {k: median_of(q, v, k) for k in ("eval_ne", "eval_auc")}
                    for v in quality["variants"]},
        "collisions": quality["collisions"], "fixed_table_bytes": quality["fixed_table_bytes"],
        "teacher_eval_ne": quality["teacher_eval_ne"],
        "eps": {"fixed": median_of(eps_runs, "fixed", "eps"),
                "dynamic": median_of(eps_runs, "dynamic", "eps")},
        "memory": memory,
        "embedding_step_ms": {v: median_of(steps, v, "step_ms")
                              for v in ("fixed", "dynamic", "dynamic-admit2")},
        "settings": {"examples": examples, "budgets": list(budgets),
                     "eps_examples": eps_examples, "repeats": repeats,
                     "quality_repeats": quality_repeats, "memory_batches": memory_batches},
        "bench_wall_s": round(time.time() - t0, 1),
        "ratio_spread": {"eps_dynamic_over_fixed": spread},
        "goals": {"eps_dynamic_over_fixed": ">= 0.9"},
    }
    write_bench(root, "dynamic", q + eps_runs + steps, {"eps_dynamic_over_fixed": ratio},
                summary)
    print(f"\nquality: Zipf ids over 10^7 a feature (teacher NE "
          f"{summary['teacher_eval_ne']:.4f}); rows a feature in the name")
    print_table([[v, s["eval_ne"], s["eval_auc"]] for v, s in summary["quality"].items()],
                ["tables", "eval NE", "eval AUC"])
    for rows, c in summary["collisions"].items():
        print(f"hashing into {rows:,} rows: {c['ids_sharing_a_row']:.1%} of "
              f"{c['distinct_ids']:,} distinct ids and {c['lookups_on_shared_rows']:.1%} of "
              "lookups share a row with another id")
    e = summary["eps"]
    print(f"\nEPS (default job): fixed {e['fixed']:,.0f}, dynamic {e['dynamic']:,.0f}: "
          f"{ratio:.3f} (per repeat {spread}), goal >= 0.9")
    ms = summary["embedding_step_ms"]
    print("embedding step in one process (ms): " + ", ".join(f"{v} {t:.2f}"
                                                            for v, t in ms.items()))
    print(f"\nmemory (one holder of {200_000:,} rows, RSS in MB):")
    print_table([[m["distinct_ids_fed"], m["rss_built_mb"], m["peak_rss_mb"], m["live"],
                  m["admitted"], m["evicted"]] for m in memory],
                ["distinct ids fed", "RSS built", "peak RSS", "rows used", "admitted",
                 "evicted"])
    return summary
