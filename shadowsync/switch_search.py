"""`shadowsync switch search --config job.toml`: Sync-Switch's offline timing search on a real
job (the policy itself: `shadowsync.runners.switch.search`). Each point is the job run as
`--sync switch --switch-plan bsp:SHARE,asp` (full BSP at share 1) with seeds 0..R-1; runs are
kept under OUT/share-S-seed-K, the measured curve of the metric against the share as
OUT/curve.json and OUT/curve.png."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

from tqdm.auto import tqdm

from shadowsync.api import run
from shadowsync.config import TrainConfig
from shadowsync.protocols import Protocol
from shadowsync.runners.switch import search
from shadowsync.train.tasks import task_of


def run_search(cfg: TrainConfig, name: str, tolerance: float | None, seeds: int,
               min_share: float,
               store_root: str, out: str, progress: bool = True,
               probes: int = search.DEFAULT_PROBES) -> search.SearchResult:
    task = task_of(cfg.task)
    metric = task.metric
    bar = tqdm(total=probes * seeds, unit="run", desc=f"switch search: {name}",
               disable=not progress)

    def one(share: float, seed: int) -> float:
        bsp, asp = Protocol.BSP.value, Protocol.ASP.value
        plan = bsp if share >= 1.0 else f"{bsp}:{share:g},{asp}"
        where = Path(out) / f"share-{share:g}-seed-{seed}"
        if where.exists():
            shutil.rmtree(where)
        job = replace(cfg, sync="switch", switch_plan=plan, switch_at=None, seed=seed,
                      out=str(where), progress=False)
        _, summary = run(job)
        bar.update(1)
        value = float(summary[f"eval_{metric}"])
        bar.set_postfix(share=f"{share:g}", **{metric: f"{value:.4f}"})
        return value

    try:
        result = search.search(one, name, metric, task.higher_is_better, tolerance, seeds,
                               min_share, probes=probes)
    finally:
        bar.close()
    search.store(result, store_root)
    search.store(result, out, "curve")  # the metric against the share, beside the runs
    return result
