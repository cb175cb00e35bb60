"""`shadowsync bench short`: does a short job end as well under every background rule as
under synchronous SGD?

A user's first runs are short: a few hundred thousand rows or fewer, a few hundred steps a
worker. Two cases, each repeated and interleaved:

- **arrays**: a user's own model on their own arrays. 120,000 rows (108,000 trained), 5 dense
  features, 7 tables of 500 ids, clicks drawn from a logistic model of the dense part and
  per-id effects; a two-layer MLP over the dense features and the flattened embeddings; 2
  trainers and 1 embedding server, 211 steps a worker. `s-ma`, `s-bmuf`, `s-easgd` (a round
  at the latest every 5 steps of each worker, `runners.shadow.MIN_ROUNDS`), and beside them
  `ddp` with the same 2 trainers (gradients AllReduced every step), `none` (independent
  dense replicas over the shared tables, no final average) and `local` (one trainer over all
  the rows, twice the steps); and `s-bmuf` and `s-easgd` without the rules' warm-up
  (`--sync-warmup-rounds 0`: BMUF's block momentum and EASGD's pull at full strength from the
  first round). Every variant runs with the options it would get left open (the dense rate
  of `s-ma` and `s-easgd` is the default's x sqrt(2), `config.train.averaged_rate_factor`).
- **checkpoint**: the README's checkpoint-and-eval pair, the default job on 100,000
  synthetic examples with a checkpoint every 40,000, then `shadowsync eval` of its newest
  checkpoint on the held-out examples.

Goals: on the arrays case the median eval NE of each of `s-ma`, `s-bmuf` and `s-easgd` within
0.01 of `ddp`'s; every eval NE of the checkpoint pair below 1.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shadowsync.bench.common import interleaved, print_table, run_job, write_bench
from shadowsync.config import TrainConfig
from shadowsync.evaluation import evaluate_checkpoint

RULES = ("s-ma", "s-bmuf", "s-easgd")  # each against DDP with the same trainers
BESIDE = {"ddp": {"sync": "ddp"}, "none": {"sync": "none"},
          "local": {"sync": "none", "trainers": 1}}
UNWARMED = ("s-bmuf", "s-easgd")  # also run with --sync-warmup-rounds 0, as "MODE/no-warmup"
REFERENCE = "ddp"
MEDIAN_GAP, PAIR_CEILING = 0.01, 1.0


class TwoLayerMLP(torch.nn.Module):
    """A user's own dense model: two layers over the dense features and the flattened
    embeddings."""

    def __init__(self, num_dense: int, num_tables: int, embedding_dim: int) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(num_dense + num_tables * embedding_dim, 32), torch.nn.ReLU(),
            torch.nn.Linear(32, 1))

    def forward(self, dense: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([dense, emb.flatten(1)], dim=1)).squeeze(1)


def two_layer_mlp(num_dense: int, num_tables: int, embedding_dim: int) -> TwoLayerMLP:
    """The factory `--model shadowsync.bench.short:two_layer_mlp` names."""
    return TwoLayerMLP(num_dense, num_tables, embedding_dim)


def write_arrays(path: Path, rows: int = 120_000, num_dense: int = 5, num_tables: int = 7,
                 table_size: int = 500, seed: int = 0) -> Path:
    """A `--data DIR` of .npy arrays whose clicks depend on both kinds of feature:
    logit = 0.8 dense . w + 0.7 sum over tables of an effect per id - 0.5, w and the effects
    standard normal (a click rate near 0.42)."""
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((rows, num_dense)).astype(np.float32)
    cats = rng.integers(0, table_size, (rows, num_tables)).astype(np.int32)
    w = rng.standard_normal(num_dense)
    effect = rng.standard_normal((num_tables, table_size))
    logit = 0.8 * dense @ w + 0.7 * effect[np.arange(num_tables), cats].sum(1) - 0.5
    labels = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    path.mkdir(parents=True, exist_ok=True)
    for name, arr in (("labels", labels), ("dense", dense), ("cats", cats)):
        np.save(path / f"{name}.npy", arr)
    return path


def _fields(s: dict[str, Any]) -> dict[str, Any]:
    """What the bench keeps of a run's summary."""
    syncs = [n for n in (s.get("syncs") or []) if n is not None]
    return {"eval_ne": s["eval_ne"], "train_s": s["train_s"], "rounds": max(syncs, default=0)}


def _checkpoint_pair(out: Path) -> dict[str, Any]:
    cfg = TrainConfig(examples=100_000, checkpoint_every="40000", progress=False,
                      log_every=10**12, log_level="warning").validate()
    got = _fields(run_job(cfg, out))
    scored = evaluate_checkpoint(str(out), "synthetic")
    return {**got, "checkpoint_eval_ne": scored["ne"]}


def _median_gap(runs: list[dict[str, Any]], variant: str) -> float:
    """median eval NE of `variant` minus the reference's (DDP's): below 0 is better."""
    def median(v: str) -> float:
        return statistics.median(r["eval_ne"] for r in runs if r["variant"] == v)
    return median(variant) - median(REFERENCE)


def arrays_variants(data: Path, out: Path) -> dict[str, Callable[[], dict[str, Any]]]:
    """The arrays case's runs by name. Each config is made afresh from the options it sets,
    so that what a variant leaves open (the dense rate, the pace) is what a user gets."""
    common = {"data": str(data), "model": "shadowsync.bench.short:two_layer_mlp",
              "trainers": 2, "table_size": [500], "checkpoint_every": "never",
              "progress": False, "log_every": 10**12, "log_level": "warning"}
    options = {**{sync: {"sync": sync} for sync in RULES}, **BESIDE,
               **{f"{sync}/no-warmup": {"sync": sync, "sync_warmup_rounds": 0}
                  for sync in UNWARMED}}
    return {name: (lambda o=o: _fields(run_job(TrainConfig(**{**common, **o}).validate(),
                                               out)))
            for name, o in options.items()}


def run_short_bench(out: str, repeats: int = 10, pair: bool = True) -> dict[str, Any]:
    started = time.perf_counter()
    root = Path(out)
    variants = arrays_variants(write_arrays(root / "arrays"), root / "run")
    if pair:
        variants["checkpoint-pair"] = lambda: _checkpoint_pair(root / "pair")
    runs = interleaved(variants, repeats, "bench short", log=root / "runs.jsonl")
    ratios = {f"{v}_median_gap_vs_ddp": _median_gap(runs, v)
              for v in (*RULES, "none", "local", *(f"{v}/no-warmup" for v in UNWARMED))}
    goals = {f"{v}_median_gap_vs_ddp": f"<= {MEDIAN_GAP}" for v in RULES}
    if pair:
        ratios["checkpoint_pair_worst"] = max(r["checkpoint_eval_ne"] for r in runs
                                              if r["variant"] == "checkpoint-pair")
        goals["checkpoint_pair_worst"] = f"< {PAIR_CEILING}"
    table = []
    for v in variants:
        key = "checkpoint_eval_ne" if v == "checkpoint-pair" else "eval_ne"
        values = sorted(r[key] for r in runs if r["variant"] == v)
        table.append([v, statistics.median(values), values[0], values[-1],
                      statistics.median(r["rounds"] for r in runs if r["variant"] == v)])
    print_table(table, ["variant", "median eval NE", "best", "worst", "median rounds"])
    print_table([[k, v, goals.get(k, ""), _met(v, goals.get(k))] for k, v in ratios.items()],
                ["measure", "value", "goal", "met"])
    path = write_bench(root, "short", runs, ratios,
                       {"repeats": repeats, "goals": goals, "eval_ne": table,
                        "bench_wall_s": round(time.perf_counter() - started, 1)})
    print(f"wrote {path}")
    return {"ratios": ratios, "goals": goals}


def _met(value: float, goal: str | None) -> str:
    if goal is None:
        return ""
    op, bound = goal.split()
    return "met" if (value <= float(bound) if op == "<=" else value < float(bound)) else "NOT met"
