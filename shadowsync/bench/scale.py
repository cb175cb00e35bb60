"""`shadowsync bench scale`: a small cost model of EPS and syncs per minute, fitted on 1 to 4
trainers here, checked on held-out runs, and used to predict clusters we do not have.

The model (every time in seconds; n trainers, B examples per step, k steps between
foreground rounds, b bytes per round, R link rate in bit/s, infinite on loopback, d dense
servers, beta the auto pace's CPU budget, C_h cores of a host, n_h trainers on it):

- A trainer's worker steps in `t` (compute plus the embedding path through shared memory);
  remote tables (another host) add `dt_rpc`, the embedding RPC cost per step that
  `bench embedding` measures. A trainer keeps `rho` cores busy (its worker and its share of
  the servers' work), so `n_h` trainers on `C_h` cores each slow down by
  `s = max(1, n_h * rho / C_h)`. Here every trainer shares this machine (n_h = n); on the
  predicted cluster each trainer has a host like this one (n_h = 1).
- A round of model averaging (s-ma, s-bmuf, fr-ma: one AllReduce of b bytes) takes
  `T_ar = s * (a + c * (n - 1)) + 2 (n - 1) / n * 8 b / R` (a ring sends 2 (n - 1) / n of the
  buffer each way; its steps grow with n). An EASGD round (pull and push against the centre
  on the dense servers) takes `T_ea = s * (a_e + n * g / d) + 2 * 8 b / R`: the servers serve
  the n trainers' rounds one after another, `g` seconds of server work per round.
- Background rounds (s-*) never block the worker; the auto pace rests between them so that
  a round's CPU (`c_ma + c_ma1 (n - 1)`, and `c_ea`, `c_ea1` for EASGD: a ring's CPU grows
  with its steps; here it also absorbs the contention of n trainers on 2 cores) stays within
  beta of the trainer's cores: the period is
  `max(T_round, c_round * n_h / (beta * C_h))`, syncs per minute 60 / period, and the rounds
  take the share `u = c_round / period * n_h / C_h` of the CPU from training:
  `EPS = n * B / (s * t) * (1 - u)`.
- Foreground rounds (fr-ma) block every k steps, and each waits for the slowest trainer: a
  step takes `s * t * (1 + w (1 - 1/n)) + T_ar / k` (w: the wait as a share of the steps
  between two rounds, none for a lone trainer), `EPS = n * B / step`, syncs per minute
  `60 / (k * step)`.

Parameters are fitted by least squares in stages (rho on a grid with log t by numpy, the
rest by non-negative least squares): `t`, `rho` from EPS; `a`, `c`, the link coefficient
`gamma` (1 if the ring is link-bound) from back-to-back AllReduce rounds (60 / syncs per
minute) on loopback and on rate-limited namespace hosts; `a_e`, `g` from back-to-back EASGD
rounds; `c_ma`, `c_ma1`, `c_ea`, `c_ea1` from auto-paced rounds; `w` from the 2-trainer
foreground job. Other runs (3 trainers, s-bmuf, fr-ma on 3 and 4 trainers, rounds at another
link rate and in bf16, the link-limited foreground job) are held out:
`ratios.scale_model_error` is the model's mean relative error on them. Each job runs
`repeats` times; a point is the median of its runs.

Measured with the job's own summary (train EPS, syncs per minute, bytes per round), the
slow-network bench's namespace hosts, and `bench embedding` for the RPC cost per step.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from matplotlib.figure import Figure
from tqdm import tqdm

from shadowsync.bench.common import Job, print_table, write_bench
from shadowsync.bench.embedding import run_embedding_bench
from shadowsync.bench.slow_net import run_on_hosts
from shadowsync.bench.sync import job
from shadowsync.cluster.netns import (
    NetnsHosts,
    netns_unavailable_reason,
    shaping_unavailable_reason,
)
from shadowsync.config import TrainConfig
from shadowsync.errors import UserError
from shadowsync.spec.modes import mode_of
from shadowsync.train.tasks import plan_data

PACE_BUDGET = TrainConfig().sync.budget  # what a run records when --sync-budget is not given

try:  # the `bench` extra; `require_scipy` says in one line where it is missing
    from scipy.optimize import nnls
except ImportError:  # pragma: no cover - scipy is installed wherever the bench runs
    nnls = None

MODES = ("none", "s-ma", "s-bmuf", "s-easgd", "fr-ma")
ALLREDUCE = ("s-ma", "s-bmuf", "fr-ma")
PREDICT_TRAINERS = tuple(range(1, 65))
PREDICT_RATES_MBIT = (50.0, 1000.0, 10000.0)
GOAL = "<= 0.15"
PARAMS = ("t", "rho", "dt_rpc", "a", "c", "gamma", "a_e", "g", "c_ma", "c_ma1", "c_ea", "c_ea1",
          "w")


# ---------------------------------------------------------------- the model (pure)

@dataclass(frozen=True)
class Setting:
    """Where a job runs, as the model sees it."""
    trainers: int
    mode: str
    rate_mbit: float | None = None  # None: loopback (no link term)
    bytes_per_round: float = 0.0
    back_to_back: bool = False  # background rounds with no rest (sync_interval 0)
    remote_tables: bool = False  # embedding servers on another host (RPC, not shared memory)
    trainers_per_host: int | None = None  # None: all on one host (here)
    cores: float = 2.0  # of each host
    batch: int = 256
    every: int = 50  # foreground rounds: steps between them
    budget: float = PACE_BUDGET  # the auto pace's share of a trainer's cores
    dense_servers: int = 1


def _share(p: dict[str, float], x: Setting) -> tuple[float, float]:
    """(s, n_h): the CPU-sharing slowdown and trainers per host."""
    n_h = x.trainers if x.trainers_per_host is None else x.trainers_per_host
    return max(1.0, n_h * p["rho"] / x.cores), n_h


def _link_s(x: Setting, ring: bool) -> float:
    if x.rate_mbit is None:
        return 0.0
    share = 2.0 * (x.trainers - 1) / x.trainers if ring else 2.0
    return share * 8.0 * x.bytes_per_round / (x.rate_mbit * 1e6)


def round_s(p: dict[str, float], x: Setting) -> float:
    """Wall seconds of one round (not counting the pace's rest)."""
    s, _ = _share(p, x)
    if mode_of(x.mode).dense_servers:  # rounds against a centre, not between peers
        return (s * (p["a_e"] + x.trainers * p["g"] / x.dense_servers)
                + p["gamma"] * _link_s(x, ring=False))
    return s * (p["a"] + p["c"] * (x.trainers - 1)) + p["gamma"] * _link_s(x, ring=True)


def pace_cpu_s(p: dict[str, float], x: Setting) -> float:
    """CPU seconds of one background round, as the auto pace sees it."""
    key = "c_ea" if mode_of(x.mode).dense_servers else "c_ma"
    return p[key] + p[f"{key}1"] * (x.trainers - 1)


def predict(p: dict[str, float], x: Setting) -> dict[str, float | None]:
    """EPS (all trainers) and syncs per minute (per trainer) of a job in setting x."""
    s, n_h = _share(p, x)
    t = p["t"] + (p["dt_rpc"] if x.remote_tables else 0.0)
    if not mode_of(x.mode).synchronizes:
        return {"eps": x.trainers * x.batch / (s * t), "syncs_per_min": None}
    rnd = round_s(p, x)
    if x.mode.startswith("fr-"):
        # a lockstep round waits for the slowest of the n trainers (none to wait for alone)
        step = s * t * (1.0 + p["w"] * (1.0 - 1.0 / x.trainers))
        return {"eps": x.trainers * x.batch / (step + rnd / x.every),
                "syncs_per_min": 60.0 / (x.every * step + rnd)}
    cpu = pace_cpu_s(p, x)
    period = max(1e-6, rnd if x.back_to_back else max(rnd, cpu * n_h / (x.budget * x.cores)))
    u = min(1.0, cpu / period * n_h / x.cores)
    return {"eps": x.trainers * x.batch / (s * t) * (1.0 - u), "syncs_per_min": 60.0 / period}


def setting_of(point: dict[str, Any]) -> Setting:
    keys = {f for f in Setting.__dataclass_fields__}
    return Setting(**{k: v for k, v in point.items() if k in keys})


def require_scipy() -> None:
    """The fit needs scipy (the `bench` extra): say so in one line before anything runs."""
    if importlib.util.find_spec("scipy") is None:
        raise UserError("bench scale fits its cost model with scipy, which is not installed: "
                        "pip install 'shadowsync[bench]'")


def _lstsq(cols: list[np.ndarray], y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0 (each is a time or a rate's coefficient)."""
    require_scipy()
    return nnls(np.stack(cols, axis=1), y)[0]


def fit(points: list[dict[str, Any]], dt_rpc: float = 0.0,
        rho_grid: np.ndarray | None = None) -> dict[str, float]:
    """The parameters from measured points (each a Setting's fields plus `eps` and
    `syncs_per_min`); only the stages the points allow are fitted, the others stay 0
    (`dt_rpc`: the given value where no point has remote tables)."""
    p = dict.fromkeys(PARAMS, 0.0)
    p.update(dt_rpc=dt_rpc, gamma=1.0, rho=1.0)
    _fit_step(p, points, rho_grid)
    # Back-to-back rounds: their period is the round's wall time.
    ar = [q for q in points if q.get("back_to_back") and q["mode"] in ALLREDUCE
          and q.get("syncs_per_min")]
    if ar:
        s = np.array([_share(p, setting_of(q))[0] for q in ar])
        n = np.array([q["trainers"] for q in ar], dtype=float)
        link = np.array([_link_s(setting_of(q), ring=True) for q in ar])
        y = np.array([60.0 / q["syncs_per_min"] for q in ar])
        cols = [s, s * (n - 1)] + ([link] if link.any() else [])
        sol = _lstsq(cols, y)
        p["a"], p["c"] = float(sol[0]), float(sol[1])
        if link.any():
            p["gamma"] = float(sol[2])
    ea = [q for q in points if q.get("back_to_back") and mode_of(q["mode"]).dense_servers
          and q.get("syncs_per_min")]
    if ea:
        s = np.array([_share(p, setting_of(q))[0] for q in ea])
        n = np.array([q["trainers"] / q.get("dense_servers", 1) for q in ea], dtype=float)
        y = np.array([60.0 / q["syncs_per_min"] - p["gamma"] * _link_s(setting_of(q), False)
                      for q in ea])
        p["a_e"], p["g"] = (float(v) for v in _lstsq([s, s * n], y))
    # Auto-paced rounds: period = c_round * n_h / (beta * C_h) where the pace binds, with
    # c_round = c + c1 * (n - 1) CPU seconds.
    for mode, key in (("s-ma", "c_ma"), ("s-easgd", "c_ea")):
        pts = [q for q in points if q["mode"] == mode and not q.get("back_to_back")
               and q.get("syncs_per_min")]
        if pts:
            x = np.array([_share(p, setting_of(q))[1]
                          / (q.get("budget", PACE_BUDGET) * q["cores"])
                          for q in pts])
            n = np.array([q["trainers"] - 1 for q in pts], dtype=float)
            y = np.array([60.0 / q["syncs_per_min"] for q in pts])
            sol = _lstsq([x, x * n] if n.any() else [x], y)
            p[key], p[f"{key}1"] = float(sol[0]), float(sol[1]) if n.any() else 0.0
    # Foreground rounds: the wait for the slowest trainer, as a share w of the steps between
    # rounds: n B / EPS = s t (1 + w (1 - 1/n)) + T / k.
    fr = [q for q in points if q["mode"].startswith("fr-") and q.get("eps")
          and not q.get("remote_tables") and q["trainers"] > 1]
    if fr:
        w = [((q["trainers"] * q.get("batch", 256) / q["eps"]
               - round_s(p, setting_of(q)) / q.get("every", 50))
              / (_share(p, setting_of(q))[0] * p["t"]) - 1.0) / (1.0 - 1.0 / q["trainers"])
             for q in fr]
        p["w"] = max(0.0, float(np.mean(w)))
    _fit_remote(p, points)
    return p


def _fit_step(p: dict[str, float], points: list[dict[str, Any]],
              rho_grid: np.ndarray | None) -> None:
    """EPS: log(n B / EPS) = log t + log s(rho) (+ -log(1 - beta) for auto-paced background
    rounds, whose pace keeps their CPU at the budget); rho on a grid, log t linear. Sets
    p's rho and t where a point allows."""
    eps_pts = [q for q in points if q.get("eps") and not q.get("back_to_back")
               and not q["mode"].startswith("fr-") and not q.get("remote_tables")]
    if not eps_pts:
        return
    best = None
    for rho in (np.arange(0.25, 4.0, 0.005) if rho_grid is None else rho_grid):
        p["rho"] = float(rho)
        y = np.array([np.log(q["trainers"] * q.get("batch", 256) / q["eps"])
                      - np.log(_share(p, setting_of(q))[0])
                      + (np.log(1 - q.get("budget", PACE_BUDGET))
                         if mode_of(q["mode"]).synchronizes else 0)
                      for q in eps_pts])
        log_t = float(y.mean())
        err = float(((y - log_t) ** 2).sum())
        if best is None or err < best[0] - 1e-12:
            best = (err, float(rho), log_t)
    assert best is not None
    p["rho"], p["t"] = best[1], float(np.exp(best[2]))


def _fit_remote(p: dict[str, float], points: list[dict[str, Any]]) -> None:
    """Remote tables: the embedding RPC cost per step as the jobs on separate hosts saw it:
    n B / EPS = s (t + dt) / (1 - u) for none and s-* (u: the rounds' CPU share), and
    s (t + dt) + T / k for fr-*, so dt is the gap in n B / EPS to the same setting at
    dt = 0, scaled back; the mean over those points. Sets p's dt_rpc where a point allows."""
    remote = [q for q in points if q.get("remote_tables") and q.get("eps")]
    if not remote:
        return
    implied = []
    for q in remote:
        x = setting_of(q)
        s, _ = _share(p, x)
        e0 = predict({**p, "dt_rpc": 0.0}, x)["eps"]
        assert e0 is not None
        keep = 1.0 if x.mode.startswith("fr-") else e0 * s * p["t"] / (x.trainers * x.batch)
        implied.append((x.trainers * x.batch / q["eps"] - x.trainers * x.batch / e0)
                       * keep / s)
    p["dt_rpc"] = max(0.0, float(np.mean(implied)))


def relative_errors(p: dict[str, float], points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per measured quantity (EPS, syncs per minute) of each point."""
    rows = []
    for q in points:
        pred = predict(p, setting_of(q))
        for key in ("eps", "syncs_per_min"):
            if q.get(key) and pred[key] is not None:
                rows.append({"name": q["name"], "quantity": key, "measured": q[key],
                             "predicted": pred[key],
                             "error": abs(pred[key] - q[key]) / q[key]})
    return rows


def mean_error(rows: list[dict[str, Any]]) -> float | None:
    return float(np.mean([r["error"] for r in rows])) if rows else None


def cluster_predictions(p: dict[str, float], bytes_per_round: float, cores: float,
                        batch: int, every: int, budget: float, dense_servers: int = 1,
                        trainers: tuple[int, ...] = PREDICT_TRAINERS,
                        rates: tuple[float, ...] = PREDICT_RATES_MBIT) -> dict[str, Any]:
    """EPS and syncs per minute on a cluster: one trainer per host like this one, tables on
    remote embedding servers (enough of them), `dense_servers` for the EASGD centre."""
    out: dict[str, Any] = {}
    for mode in MODES:
        for rate in rates:
            rows = [predict(p, Setting(n, mode, rate, bytes_per_round, remote_tables=True,
                                       trainers_per_host=1, cores=cores, batch=batch,
                                       every=every, budget=budget,
                                       dense_servers=dense_servers)) for n in trainers]
            out[f"{mode}@{rate:g}mbit"] = {
                "trainers": list(trainers), "eps": [r["eps"] for r in rows],
                "syncs_per_min": [r["syncs_per_min"] for r in rows]}
    return out


def paper_checks(pred: dict[str, Any], p: dict[str, float], rate: float, budget: float,
                 cores: float) -> dict[str, Any]:
    """The paper's scaling claims, read off the predictions at one link rate."""
    def at(mode: str, key: str, n: int) -> float:
        row = pred[f"{mode}@{rate:g}mbit"]
        return row[key][row["trainers"].index(n)]
    last = pred[f"none@{rate:g}mbit"]["trainers"][-1]
    return {
        "rate_mbit": rate, "trainers": last,
        # EPS(n) / (n * EPS(1)): 1 is linear
        "linearity": {m: at(m, "eps", last) / (last * at(m, "eps", 1)) for m in MODES},
        "syncs_per_min_1_vs_last": {m: [at(m, "syncs_per_min", 1), at(m, "syncs_per_min", last)]
                                    for m in MODES if mode_of(m).synchronizes},
        # rounds a second one dense server can serve (each trainer's EASGD rate is at most
        # 60 d / (n g) a minute, however fast the pace)
        "easgd_server_rounds_per_s": None if p["g"] <= 0 else 1.0 / p["g"],
        # the fewest trainers (one dense server) at which the server's queue, not the pace,
        # sets EASGD's rate (None: not up to `last`)
        "easgd_server_bound_from_trainers": next(
            (n for n in range(1, last + 1)
             if round_s(p, Setting(n, "s-easgd", rate, trainers_per_host=1, cores=cores))
             > pace_cpu_s(p, Setting(n, "s-easgd")) / (budget * cores)), None),
    }


# ------------------------------------------------------------- measurements

@dataclass(frozen=True)
class Planned:
    name: str
    trainers: int
    mode: str
    role: str  # "fit" or "held_out"
    back_to_back: bool = False
    rate_mbit: float | None = None  # namespace hosts, link between the trainers limited
    sync_dtype: str = "fp32"


def plan(quick: bool = False, netns: bool = True) -> list[Planned]:
    """The default: 1, 2, 4 trainers to fit, 3 held out; s-bmuf held out whole (the model
    prices it with s-ma's rounds), fr-ma but for 2 trainers (its straggler wait); on the
    namespace hosts, 2 trainers with the link between them at 50 Mbit/s fit the link term,
    and rounds at 200 Mbit/s, a bf16 round and a foreground job on the slow link are held
    out."""
    out: list[Planned] = []
    if netns and not quick:
        out += [Planned("s-ma-b2b@50mbit/2", 2, "s-ma", "fit", True, 50.0),
                Planned("s-ma-b2b@200mbit/2", 2, "s-ma", "held_out", True, 200.0),
                Planned("s-ma-b2b-bf16@50mbit/2", 2, "s-ma", "held_out", True, 50.0, "bf16"),
                Planned("fr-ma@50mbit/2", 2, "fr-ma", "held_out", False, 50.0)]
    sizes = (1, 2) if quick else (1, 2, 3, 4)
    for n in sizes:
        role = "held_out" if n == 3 or (quick and n == 2) else "fit"
        for mode in ("none", "s-ma", "s-easgd"):
            out.append(Planned(f"{mode}/{n}", n, mode, role))
        if n > 1 and not quick:
            out.append(Planned(f"fr-ma/{n}", n, "fr-ma", "fit" if n == 2 else "held_out"))
        if n in (2, 4):  # (one trainer's AllReduce moves nothing)
            out.append(Planned(f"s-ma-b2b/{n}", n, "s-ma", "fit", back_to_back=True))
        if n in (2, 4) and not quick:
            out.append(Planned(f"s-easgd-b2b/{n}", n, "s-easgd", "fit", back_to_back=True))
        if n == 2 and not quick:
            out.append(Planned(f"s-bmuf/{n}", n, "s-bmuf", "held_out"))
    return out


# Foreground jobs round every FR_EVERY steps, so that a short run holds enough rounds to
# count; back-to-back EASGD pulls with alpha EASGD_B2B_ALPHA (at the default 0.5, 4 trainers
# averaging into the centre back to back diverged; a round's cost does not depend on alpha).
FR_EVERY = 20
EASGD_B2B_ALPHA = 0.1


def changes_for(item: Planned, per_trainer: int) -> dict[str, Any]:
    """The flat changes that make `item`'s job of the bench's one: each trainer trains
    `per_trainer` examples (weak scaling: the same steps per trainer whatever their number)."""
    changes: dict[str, Any] = dict(trainers=item.trainers, sync=item.mode,
                                   examples=per_trainer * item.trainers,
                                   sync_dtype=item.sync_dtype,
                                   dense_servers=None if item.rate_mbit is None else 0)
    if item.back_to_back:
        changes["sync_interval"] = "0"
    if item.mode.startswith("fr-"):
        changes["sync_every"] = FR_EVERY
    if item.back_to_back and mode_of(item.mode).dense_servers:
        changes["elastic_alpha"] = EASGD_B2B_ALPHA
    return changes


def figures(s: dict[str, Any]) -> dict[str, Any]:
    """What a point needs from a job's summary.json. Foreground rounds run only while a
    trainer trains, so their rate is each trainer's rounds over its own training span
    (its examples / its EPS); a background runner's own `syncs_per_min` counts its rounds
    over its whole life, which is the right span for it."""
    syncs = s.get("syncs") or []
    eps = s.get("eps_per_trainer") or []
    fg = s.get("sync_settings", {}).get("runner") == "foreground"
    spm = s.get("syncs_per_min")
    if fg and syncs and len(syncs) == len(eps) and all(v is not None for v in syncs):
        per_trainer = s["examples"] / len(eps)
        spm = float(np.mean([60.0 * n * e / per_trainer for n, e in zip(syncs, eps)]))
    return {"eps": s["train_eps"], "syncs_per_min": spm,
            "sync_bytes_per_round": s.get("sync_bytes_per_round"), "wall_s": s["wall_s"]}


class LocalRunner(Protocol):
    """Runs a planned job here: the bench's job with the item's `changes`, in `out`; returns
    its `figures`."""

    def __call__(self, job: Job, out: Path, changes: dict[str, Any]) -> dict[str, Any]: ...


class HostsRunner(Protocol):
    """Runs a planned job on namespace hosts, the trainers' link at `rate_mbit`."""

    def __call__(self, job: Job, out: Path, changes: dict[str, Any], rate_mbit: float
                 ) -> dict[str, Any]: ...


def run_local(job: Job, out: Path, changes: dict[str, Any]) -> dict[str, Any]:
    return figures(job.run(out, **changes))


def run_netns(job: Job, out: Path, changes: dict[str, Any], rate_mbit: float
              ) -> dict[str, Any]:
    """Host 0 the embedding server, hosts 1..n the trainers, the link between hosts 1 and 2
    (the trainers' rounds) limited."""
    cfg = job.config(**changes, embedding_servers=1)
    with NetnsHosts(cfg.cluster.trainers + 1) as hosts:
        hosts.set_pair_rate(1, 2, rate_mbit)
        return figures(run_on_hosts(hosts, cfg, out))


def netns_reason() -> str | None:
    return netns_unavailable_reason() or shaping_unavailable_reason()


def measure(job: Job, items: list[Planned], per_trainer: int, repeats: int,
            local: LocalRunner = run_local, hosts: HostsRunner = run_netns,
            ) -> list[dict[str, Any]]:
    """Run every planned job `repeats` times, the plan forwards then backwards (so a drift
    in the machine's load hits early and late points alike); each run is the model's Setting
    plus what the job's summary said, and the machine's load average when it ended. Runs are
    logged to the job's root's runs.jsonl as they end; a job that fails costs its run, not
    the bench."""
    root = job.root
    cores = float(len(os.sched_getaffinity(0)))
    runs = []
    (root / "runs.jsonl").unlink(missing_ok=True)
    order = [(r, item) for r in range(repeats)
             for item in (items if r % 2 == 0 else items[::-1])]
    for i, (rep, item) in enumerate(tqdm(order, desc="bench scale", unit="run")):
        changes = changes_for(item, per_trainer)
        cfg = job.config(**changes).validate()
        out = root / "runs" / f"{i:02d}-{item.name.replace('/', '-').replace('@', '-')}"
        try:
            r = (local(job, out, changes) if item.rate_mbit is None
                 else hosts(job, out, changes, item.rate_mbit))
        except (RuntimeError, UserError) as e:
            print(f"bench scale: {item.name} failed, left out: {str(e)[-300:]}")
            continue
        run = {"name": item.name, "repeat": rep, "role": item.role, "trainers": item.trainers,
               "mode": item.mode, "rate_mbit": item.rate_mbit,
               "bytes_per_round": r.get("sync_bytes_per_round") or 0.0,
               "back_to_back": item.back_to_back, "remote_tables": item.rate_mbit is not None,
               "cores": cores, "batch": cfg.optim.batch_size, "every": cfg.sync.every,
               "budget": cfg.sync.budget, "dense_servers": cfg.cluster.dense_servers or 1,
               "sync_dtype": item.sync_dtype, "eps": r["eps"],
               "syncs_per_min": r.get("syncs_per_min") if mode_of(item.mode).synchronizes else None,
               "wall_s": r.get("wall_s"), "load_avg_1min": os.getloadavg()[0]}
        runs.append(run)
        root.mkdir(parents=True, exist_ok=True)
        with (root / "runs.jsonl").open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(run) + "\n")
    return runs


def points_of(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One point per planned job: its runs' medians of EPS and syncs per minute, and their
    spread ([min, max])."""
    points = []
    for name in dict.fromkeys(r["name"] for r in runs):
        mine = [r for r in runs if r["name"] == name]
        q = {k: v for k, v in mine[0].items() if k not in ("repeat", "wall_s", "load_avg_1min")}
        for key in ("eps", "syncs_per_min"):
            vals = [r[key] for r in mine if r.get(key)]
            q[key] = float(np.median(vals)) if vals else None
            q[f"{key}_spread"] = [min(vals), max(vals)] if vals else None
        q["runs"] = len(mine)
        points.append(q)
    return points


def embedding_cost(root: Path, steps: int) -> dict[str, float]:
    """Run `bench embedding` (3 repeats, medians: one was seen off by 3x at a high load)
    into root/embedding."""
    run_embedding_bench(str(root / "embedding"), steps=steps, repeats=3)
    return read_embedding_cost(root / "embedding" / "bench.json")


def read_embedding_cost(path: Path) -> dict[str, float]:
    """Milliseconds per step of the embedding path over RPC and shared memory, and of the
    dense step, from a `bench embedding` bench.json."""
    e = json.loads(path.read_text())
    return {"rpc_ms": e["ratios"]["embedding_ms_rpc"], "shm_ms": e["ratios"]["embedding_ms_shm"],
            "dense_step_ms": e["medians"]["dense_step"]["step"]}


def run_scale_bench(out: str, per_trainer: int = 40_000, repeats: int = 2,
                    quick: bool = False, netns: bool = True, embedding_steps: int = 100,
                    points_from: str | None = None,
                    local: LocalRunner = run_local, hosts: HostsRunner = run_netns,
                    embedding: Callable[[Path, int], dict[str, float]] | None = None,
                    ) -> dict[str, Any]:
    """Measure, fit, check on held-out runs, predict to 64 trainers, plot. `points_from`: a
    runs.jsonl of an earlier run (and its embedding/bench.json) instead of measuring again.
    `local`, `hosts` and `embedding` run the jobs (replaceable, so the bookkeeping can be
    tested without)."""
    t0 = time.perf_counter()
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    emb: dict[str, float] | None = None
    if points_from is not None:
        src = Path(points_from)
        runs = [json.loads(line) for line in src.read_text().splitlines() if line.strip()]
        emb_file = src.parent / "embedding" / "bench.json"
        emb = read_embedding_cost(emb_file) if emb_file.exists() else None
    else:
        if netns and not quick:
            reason = netns_reason()
            if reason:
                print(f"bench scale: namespace hosts skipped: {reason}")
                netns = False
        # The model's rounds are AllReduces, as on a cluster of one trainer per host, also
        # where the trainers share this one (there they would average in shared memory).
        base = job(per_trainer * 4, sync_transport="collective")
        plan_data(base)  # the data of the largest job, once (smaller jobs read its start)
        if not quick:
            emb = (embedding or embedding_cost)(root, embedding_steps)
        runs = measure(Job(root, base), plan(quick, netns), per_trainer, repeats, local,
                       hosts)
    return analyse(root, runs, emb, {"per_trainer_examples": per_trainer, "repeats": repeats,
                                     "quick": quick, "measure_wall_s": time.perf_counter() - t0})


def analyse(root: Path, runs: list[dict[str, Any]], emb: dict[str, float] | None,
            info: dict[str, Any]) -> dict[str, Any]:
    """Fit on the points marked "fit", score the held-out ones, predict, write, plot."""
    points = points_of(runs)
    dt_rpc = max(0.0, (emb["rpc_ms"] - emb["shm_ms"]) / 1e3) if emb else 0.0
    fitted = [q for q in points if q["role"] == "fit"]
    held = [q for q in points if q["role"] == "held_out"]
    p = fit(fitted, dt_rpc=dt_rpc)
    fit_rows, held_rows = relative_errors(p, fitted), relative_errors(p, held)
    error = mean_error(held_rows)
    bytes_fp32 = max((q["bytes_per_round"] for q in points if q["sync_dtype"] == "fp32"),
                     default=0.0)
    default = TrainConfig()  # predictions are for the default job's settings
    cores = points[0]["cores"]
    pred = {f"dense_servers={d}": cluster_predictions(
        p, bytes_fp32, cores, default.optim.batch_size, default.sync.every, default.sync.budget, d)
        for d in (1, 4)}
    checks = {f"{r:g}mbit": paper_checks(pred["dense_servers=1"], p, r, default.sync.budget,
                                         cores) for r in PREDICT_RATES_MBIT}
    ratios = {"scale_model_error": error,
              "scale_model_error_eps": mean_error([r for r in held_rows
                                                   if r["quantity"] == "eps"]),
              "scale_model_error_syncs_per_min": mean_error(
                  [r for r in held_rows if r["quantity"] == "syncs_per_min"]),
              "scale_model_error_fit_points": mean_error(fit_rows)}
    loads = [r["load_avg_1min"] for r in runs if r.get("load_avg_1min") is not None]
    extra = {"goals": {k: GOAL if k == "scale_model_error" else None for k in ratios},
             "points": points, "params": p, "param_units": "seconds (rho: cores)",
             "embedding_cost_ms": emb, "dt_rpc_from_embedding_bench": dt_rpc, **info,
             "load_avg_1min": [min(loads), max(loads)] if loads else None,
             "held_out_errors": held_rows, "fit_errors": fit_rows,
             "predictions": pred, "paper_checks": checks,
             "prediction_setting": {"trainers_per_host": 1, "cores_per_host": cores,
                                    "bytes_per_round": bytes_fp32, "remote_tables": True,
                                    "sync_every": default.sync.every}}
    path = write_bench(root, "scale", runs, ratios, extra)
    print_table([[r["name"], r["quantity"], r["measured"], r["predicted"], r["error"]]
                 for r in held_rows], ["held out", "quantity", "measured", "model", "error"])
    print()
    print_table([[k, v] for k, v in p.items()], ["parameter", "value"])
    print()
    print_table([[k, "n/a" if v is None else v] for k, v in ratios.items()], ["ratio", "value"])
    print(f"(goal scale_model_error {GOAL}); measured in {info['measure_wall_s']:.0f}s")
    plot_scale(root, p, pred["dense_servers=1"], points)
    print(f"wrote {path}")
    return {"ratios": ratios, "params": p, "points": points, "predictions": pred}


def plot_scale(root: Path, p: dict[str, float], pred: dict[str, Any],
               points: list[dict[str, Any]]) -> None:
    colors = dict(zip(MODES, ("tab:gray", "tab:green", "tab:olive", "tab:blue", "tab:red")))
    styles = dict(zip(PREDICT_RATES_MBIT, (":", "--", "-")))
    fig = Figure(figsize=(13, 9))
    axes = fig.subplots(2, 2)
    for key, ax in zip(("eps", "syncs_per_min"), axes[0]):
        for name, row in pred.items():
            mode, rate = name.split("@")
            if row[key][0] is None:
                continue
            ax.plot(row["trainers"], row[key], styles[float(rate[:-4])], color=colors[mode],
                    label=f"{mode} @ {rate}", lw=1.3)
        for q in points:  # measured here (auto pace), on this machine's shared cores
            if q.get(key) and not q["back_to_back"]:
                ax.scatter(q["trainers"], q[key], marker="x", color=colors[q["mode"]], s=18)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("trainers (one per host like this one; x: measured here, shared cores)")
        ax.set_title(f"predicted {'EPS (all trainers)' if key == 'eps' else 'syncs / min'}, "
                     "1 dense server")
        ax.legend(fontsize=6, ncol=2)
    # This machine: every measured point against the model at the same setting.
    for key, ax in zip(("eps", "syncs_per_min"), axes[1]):
        for q in points:
            if not q.get(key):
                continue
            pr = predict(p, setting_of(q))[key]
            mk = "o" if q["role"] == "fit" else "s"
            ax.scatter(q[key], pr, marker=mk, color=colors[q["mode"]],
                       facecolors="none" if q["role"] == "held_out" else colors[q["mode"]])
            ax.annotate(q["name"], (q[key], pr), fontsize=5)
        vals = [q[key] for q in points if q.get(key)]
        if vals:
            lo, hi = min(vals) * 0.7, max(vals) * 1.3
            ax.plot([lo, hi], [lo, hi], "k-", lw=0.5)
            ax.fill_between([lo, hi], [lo * 0.85, hi * 0.85], [lo * 1.15, hi * 1.15],
                            color="k", alpha=0.06)
            ax.set_xscale("log")
            ax.set_yscale("log")
        ax.set_xlabel(f"measured {key} here (filled: fit, hollow: held out)")
        ax.set_ylabel("model")
        ax.set_title("this machine (1 to 4 trainers on its cores): model vs measured")
    fig.tight_layout()
    fig.savefig(root / "scale.png", dpi=110)
