"""The `shadowsync bench ...` commands: their options and the checks of their values. Each
benchmark's module is imported only when its command runs (`_bench`; start-up cost: most
import torch and start processes; `shadowsync --help` and the other commands need none of
it)."""

from __future__ import annotations

import argparse
import functools
import importlib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from shadowsync.errors import UserError
from shadowsync.lifecycle.stop import signals_raise

OUT_HELP = "output directory (bench.json, runs.jsonl, plots)"
REPEATS_HELP = "interleaved repeats of every variant (medians and spread over them)"


def _bench(name: str) -> ModuleType:
    """The module of `shadowsync bench NAME`, imported when its command runs: most import
    torch and start processes, which `shadowsync --help` and the other commands need none of."""
    return importlib.import_module(f"shadowsync.bench.{name}")


def _bench_hogwild(args: argparse.Namespace) -> int:
    hogwild = _bench("hogwild")
    hogwild.run_hogwild_bench(args.out, examples=args.examples, repeats=args.repeats)
    return 0


def _bench_sync(args: argparse.Namespace) -> int:
    sync = _bench("sync")
    sync.run_sync_bench(args.out, examples=args.examples, repeats=args.repeats,
                        slow_net=not args.no_slow_net, quality_examples=args.quality_examples,
                        full=args.full, slow_net_only=args.slow_net_only)
    return 0


def _bench_embedding(args: argparse.Namespace) -> int:
    embedding = _bench("embedding")
    embedding.run_embedding_bench(args.out, steps=args.steps, repeats=args.repeats)
    return 0


def _bench_dynamic(args: argparse.Namespace) -> int:
    dynamic = _bench("dynamic")
    try:
        budgets = tuple(int(v) for v in args.rows.split(","))
    except ValueError:
        budgets = ()
    if (min(args.examples, args.eps_examples) < 10_000 or not budgets or min(budgets) < 1
            or args.repeats < 1):
        raise UserError("--examples and --eps-examples must be >= 10000, --rows a comma list "
                        "of sizes >= 1 and --repeats >= 1")
    if args.eps_only and args.clothing_only:
        raise UserError("--eps-only and --clothing-only each run one part: give one of them")
    dynamic.run_dynamic_bench(
        args.out, examples=args.examples, budgets=budgets, eps_examples=args.eps_examples,
        repeats=args.repeats, quality_repeats=args.quality_repeats,
        clothing_only=args.clothing_only, eps_only=args.eps_only)
    return 0


def _bench_scale(args: argparse.Namespace) -> int:
    scale = _bench("scale")
    scale.require_scipy()
    if args.examples < 5_000 or args.repeats < 1:
        raise UserError("--examples must be >= 5000 and --repeats >= 1")
    if args.points and not Path(args.points).is_file():
        raise UserError(f"--points: no such file {args.points}")
    scale.run_scale_bench(args.out, per_trainer=args.examples, repeats=args.repeats,
                          quick=args.quick, netns=not args.no_netns, points_from=args.points)
    return 0


def _bench_hosts(args: argparse.Namespace) -> int:
    from shadowsync.bench.hosts import run_hosts_bench

    try:
        depths = tuple(int(d) for d in args.depths.split(","))
        settings = tuple(int(h) for h in args.hosts.split(","))
    except ValueError:
        depths = settings = ()
    if (not depths or not set(depths) <= {0, 1, 2} or not settings
            or not set(settings) <= {2, 4} or args.examples < 10_000 or args.repeats < 1):
        raise UserError("--depths takes a comma list of 0, 1, 2, --hosts of 2, 4; --examples "
                        "must be >= 10000 and --repeats >= 1")
    run_hosts_bench(args.out, examples=args.examples, repeats=args.repeats, settings=settings,
                    depths=depths)
    return 0


def _bench_switch(args: argparse.Namespace) -> int:
    switch = _bench("switch")
    if not 0 < args.share < 1:
        raise UserError(f"--share must be in (0, 1), got {args.share}")
    if args.no_ctr and args.no_digits and args.slow_link is None:
        raise UserError("bench switch: --no-ctr and --no-digits leave nothing to run")
    if args.trainers < 2 or args.repeats < 1:
        raise UserError("--trainers must be >= 2 and --repeats >= 1")
    if args.digits_lr is not None and not args.digits_lr > 0:
        raise UserError(f"--digits-lr must be > 0, got {args.digits_lr}")
    if args.slow_link is not None and not args.slow_link > 0:
        raise UserError(f"--slow-link must be > 0 (Mbit/s), got {args.slow_link}")
    variants = tuple(v.strip() for v in (args.variants or "").split(",") if v.strip())
    unknown = [v for v in variants if v not in switch.VARIANTS]
    if unknown:
        raise UserError(f"--variants: {', '.join(unknown)} not among {', '.join(switch.VARIANTS)}")
    switch.run_switch_bench(args.out, trainers=args.trainers, digits_examples=args.digits_examples,
                            ctr_examples=args.ctr_examples, share=args.share, repeats=args.repeats,
                            ctr=not (args.no_ctr or args.full), ctr_trainers=args.ctr_trainers,
                            digits=not args.no_digits, full=args.full, slow_link=args.slow_link,
                            variants=variants, digits_lr=args.digits_lr)
    return 0


def _bench_short(args: argparse.Namespace) -> int:
    short = _bench("short")
    if args.repeats < 1:
        raise UserError(f"--repeats must be >= 1, got {args.repeats}")
    short.run_short_bench(args.out, repeats=args.repeats, pair=not args.no_checkpoint_pair)
    return 0


def _bench_faults(args: argparse.Namespace) -> int:
    faults = _bench("faults")
    if args.examples < 20_000 or args.repeats < 1 or args.soak_s < 0:
        raise UserError("--examples must be >= 20000, --repeats >= 1 and --soak-s >= 0")
    names = faults.SCENARIOS if args.scenarios == "all" else \
        tuple(s.strip() for s in args.scenarios.split(",") if s.strip())
    unknown = [s for s in names if s not in faults.SCENARIOS]
    if unknown:
        raise UserError(f"--scenarios: unknown {', '.join(unknown)} (choose from "
                        f"{', '.join(faults.SCENARIOS)})")
    faults.run_faults_bench(args.out, examples=args.examples, repeats=args.repeats,
                            scenarios=names, soak_s=args.soak_s)
    return 0


def _bench_data(args: argparse.Namespace) -> int:
    data = _bench("data")
    data.run_data_bench(args.out, lines=args.lines, repeats=args.repeats)
    return 0


def _bench_realdata(args: argparse.Namespace) -> int:
    realdata = _bench("realdata")
    if args.seeds < 1 or args.epochs < 1:
        raise UserError("--seeds and --epochs must be >= 1")
    if args.collect:
        realdata.collect_results(args.out, [d for d in args.collect.split(",") if d],
                                 seeds=args.seeds)
        return 0
    realdata.run_realdata_bench(args.out, seeds=args.seeds, epochs=args.epochs,
                                val_share=args.val_share,
                                sets=tuple(s for s in args.sets.split(",") if s),
                                multi_hot=args.multi_hot, splits=parse_splits(args.splits),
                                tuning=args.tuning_split)
    return 0


def parse_splits(text: str) -> tuple[int, ...]:
    """--splits: a comma list of split seeds and ranges (`1-5`, `1,3`), in order, no repeats."""
    splits: list[int] = []
    try:
        for part in (p.strip() for p in text.split(",") if p.strip()):
            lo, _, hi = part.partition("-")
            splits += [k for k in range(int(lo), int(hi or lo) + 1) if k not in splits]
    except ValueError:
        splits = []
    if not splits or min(splits) < 0:
        raise UserError(f"--splits: expected split seeds such as 1 or 1-5 or 1,3, got {text!r}")
    return tuple(splits)


def add_bench_commands(sub: Any) -> None:
    """`shadowsync bench ...`: one command per benchmark."""
    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench", required=True)
    _add_throughput(bench)
    _add_scale(bench)
    _add_switch(bench)
    _add_faults_data_realdata(bench)
    for parser in bench.choices.values():
        parser.set_defaults(func=_stopped_by_signals(parser.get_default("func")))


def _stopped_by_signals(run: Callable[[argparse.Namespace], int]
                        ) -> Callable[[argparse.Namespace], int]:
    """`run` with SIGINT and SIGTERM stopping it as an error would: what it started (network
    namespaces, processes) is ended, and the line printed says where its finished runs are."""

    @functools.wraps(run)
    def stoppable(args: argparse.Namespace) -> int:
        with signals_raise(kept=getattr(args, "out", None)):
            return run(args)

    return stoppable


def _add_throughput(bench: Any) -> None:
    """hogwild, sync and embedding: throughput side by side."""
    hog = bench.add_parser("hogwild", help="Hogwild scaling and trainer overhead")
    hog.add_argument("--out", default="runs/bench-hogwild", help=OUT_HELP)
    hog.add_argument("--examples", type=int, default=400_000, help="examples per timed run")
    hog.add_argument("--repeats", type=int, default=5, help=REPEATS_HELP)
    hog.set_defaults(func=_bench_hogwild)
    sync = bench.add_parser("sync", help="every --sync side by side; frontier; slow network")
    sync.add_argument("--out", default="runs/bench-sync", help=OUT_HELP)
    sync.add_argument("--examples", type=int, default=None,
                      help="examples per throughput run (default: 500k, with --full 1M; "
                      "at most 300k on the namespace hosts)")
    sync.add_argument("--quality-examples", type=int, default=None,
                      help="examples per run of the quality comparison (default: 1.5M, "
                      "with --full 3M)")
    sync.add_argument("--full", action="store_true",
                      help="the whole frontier: foreground rules, fixed intervals, overwrite")
    sync.add_argument("--repeats", type=int, default=3, help=REPEATS_HELP)
    sync.add_argument("--no-slow-net", action="store_true",
                      help="skip the network-namespace hosts part")
    sync.add_argument("--slow-net-only", action="store_true",
                      help="run only the network-namespace hosts part (with --full: every way "
                      "of syncing on a 50 Mbit/s and a 1 Gbit/s link)")
    sync.set_defaults(func=_bench_sync)
    emb = bench.add_parser("embedding", help="where a step's time goes on the embedding path: "
                           "RPC, shared memory, local tables")
    emb.add_argument("--out", default="runs/bench-embedding", help=OUT_HELP)
    emb.add_argument("--steps", type=int, default=400, help="steps per timed run")
    emb.add_argument("--repeats", type=int, default=3, help=REPEATS_HELP)
    emb.set_defaults(func=_bench_embedding)
    hosts = _jobs_bench(bench, "hosts", "a job spread over 2 and 4 emulated hosts on a "
                        "1 Gbit/s link against the same job on one host: --prefetch depths, "
                        "both --embedding-placement values (needs root)", repeats=3)
    hosts.add_argument("--depths", default="0,1,2", help="--prefetch depths of the spread runs")
    hosts.add_argument("--hosts", default="2,4", help="settings: 2 hosts, 4 hosts, or both")
    hosts.set_defaults(func=_bench_hosts)
    short = bench.add_parser("short", help="short jobs: a user's model on 120k rows of arrays "
                             "under s-ma, s-bmuf and s-easgd beside ddp, none and one local "
                             "trainer, and the README's checkpoint-and-eval pair, eval NE "
                             "over repeated identical runs")
    short.add_argument("--out", default="runs/bench-short", help=OUT_HELP)
    short.add_argument("--repeats", type=int, default=10, help=REPEATS_HELP)
    short.add_argument("--no-checkpoint-pair", action="store_true",
                       help="only the arrays case")
    short.set_defaults(func=_bench_short)
    dyn = bench.add_parser("dynamic", help="dynamic tables against hashing into fixed tables: "
                           "quality on Zipf raw ids and real sets, EPS, memory while ids grow")
    dyn.add_argument("--out", default="runs/bench-dynamic", help=OUT_HELP)
    dyn.add_argument("--examples", type=int, default=400_000,
                     help="rows of Zipf raw-id data (the last 10%% evaluates)")
    dyn.add_argument("--rows", default="100000,10000",
                     help="rows a feature, one quality comparison each: the fixed tables' size, "
                     "the dynamic ones' budget")
    dyn.add_argument("--eps-examples", type=int, default=1_500_000,
                     help="examples of each default-job run timed for EPS (the default "
                     "job's own)")
    dyn.add_argument("--repeats", type=int, default=5, help=REPEATS_HELP + " (EPS)")
    dyn.add_argument("--quality-repeats", type=int, default=1, help="repeats of the quality runs")
    dyn.add_argument("--clothing-only", action="store_true",
                     help="only the real set with a long tail: the clothing reviews' words "
                     "hashed into 2,000 and 8,000 rows against dynamic tables (3 seeds)")
    dyn.add_argument("--eps-only", action="store_true",
                     help="only the speed: the default job's EPS with fixed and dynamic tables "
                     "(--repeats interleaved pairs) and a training step's CPU time in one process")
    dyn.set_defaults(func=_bench_dynamic)


def _add_scale(bench: Any) -> None:
    """scale: the fitted cost model."""
    scale = bench.add_parser(
        "scale", help="a cost model of EPS and syncs per minute fitted on 1 to 4 trainers, "
        "checked on held-out runs, predicted to 64 trainers",
        description="Runs 1 to 4 trainers on this machine (local cluster, and namespace hosts "
        "with a rate-limited link), fits a small cost model, reports its error on held-out "
        "runs and predicts EPS and syncs per minute for 1 to 64 trainers per mode and link "
        "rate (bench.json, scale.png). About 20 minutes on 2 cores; --quick a few.")
    scale.add_argument("--out", default="runs/bench-scale", help=OUT_HELP)
    scale.add_argument("--examples", type=int, default=40_000,
                       help="examples per trainer in each run (a run of n trainers trains n "
                       "times as many)")
    scale.add_argument("--repeats", type=int, default=2,
                       help="runs of each job (medians; the plan forwards, then backwards)")
    scale.add_argument("--quick", action="store_true",
                       help="a smoke run: 1 and 2 trainers, no namespace hosts, no embedding "
                       "bench (2 trainers are held out with nothing to fit contention on)")
    scale.add_argument("--no-netns", action="store_true", help="skip the namespace hosts")
    scale.add_argument("--points", metavar="RUNS.jsonl",
                       help="refit and predict from an earlier run's runs.jsonl (no new runs)")
    scale.set_defaults(func=_bench_scale)


def _add_switch(bench: Any) -> None:
    """switch: BSP, ASP and Sync-Switch."""
    sw = bench.add_parser("switch", help="BSP, ASP and Sync-Switch, with and without a straggler")
    sw.add_argument("--out", default="runs/bench-switch", help=OUT_HELP)
    sw.add_argument("--trainers", type=int, default=4, help="trainers of the digits job")
    sw.add_argument("--digits-examples", type=int, default=None,
                    help="examples per digits run (default 96k, with --full 48k)")
    sw.add_argument("--digits-lr", type=float, default=None,
                    help="learning rate of a BSP step of the digits job; ASP's is this over "
                    "the trainers (default 0.1)")
    sw.add_argument("--ctr-examples", type=int, default=None,
                    help="examples per ctr run (default 100k)")
    sw.add_argument("--ctr-trainers", type=int, default=2, help="trainers of the ctr job")
    sw.add_argument("--share", type=float, default=0.5,
                    help="BSP share of the digits switch plan (the quota of the online policies)")
    sw.add_argument("--repeats", type=int, default=3, help=REPEATS_HELP)
    sw.add_argument("--full", action="store_true",
                    help="instead of the default's: what the delay and false-alarm goals need, "
                    "on digits at 48k examples with ASP steps' momentum compensated: BSP and "
                    "ASP, then BSP, greedy, elastic and "
                    "isolate behind a link delayed 10 and 30 ms on 1 and on 2 trainers in 1 "
                    "and in 4 episodes, and greedy and elastic under a false alarm (108 runs "
                    "at 3 repeats, no ctr); --variants runs any other")
    sw.add_argument("--variants", metavar="A,B", help="run these digits variants (and the "
                    "baselines their ratios need) instead of the default's, e.g. the "
                    "configuration ablation: switch/no-scale,switch/compensate,switch/zero,"
                    "switch/ramp,switch/asp-first")
    sw.add_argument("--no-ctr", action="store_true", help="digits only")
    sw.add_argument("--no-digits", action="store_true", help="ctr only")
    sw.add_argument("--slow-link", type=float, metavar="MBIT",
                    help="also bsp and greedy on digits with every process on its own emulated "
                    "host and trainer 1's link to the dense server limited to MBIT Mbit/s "
                    "for the middle half of the job, as the compute straggler (network "
                    "namespaces and tc; needs root); with --no-digits --no-ctr only "
                    "this part runs")
    sw.set_defaults(func=_bench_switch)


def _jobs_bench(bench: Any, name: str, help: str, repeats: int,
                examples: int = 300_000) -> argparse.ArgumentParser:
    """A bench of whole jobs: its subcommand with --out (runs/bench-NAME), --examples a run
    and --repeats."""
    parser = bench.add_parser(name, help=help)
    parser.add_argument("--out", default=f"runs/bench-{name}", help=OUT_HELP)
    parser.add_argument("--examples", type=int, default=examples, help="examples per run")
    parser.add_argument("--repeats", type=int, default=repeats, help=REPEATS_HELP)
    return parser


def _add_faults_data_realdata(bench: Any) -> None:
    """faults, data and realdata."""
    faults = _jobs_bench(bench, "faults", "a run stopped by SIGINT / SIGTERM and resumed, "
                         "processes killed, a NaN rolled back, each next to the same run "
                         "uninterrupted; then a memory soak", repeats=1)
    faults.add_argument("--scenarios", default="all",
                        help="comma list of: sigint-resume, sigterm-resume, kill-trainer, "
                        "kill-worker, kill-embedding-server, kill-dense-server, nan-rollback "
                        "(default: all)")
    faults.add_argument("--soak-s", type=float, default=600.0,
                        help="seconds of training of the memory soak (0: none)")
    faults.set_defaults(func=_bench_faults)
    data_bench = bench.add_parser("data", help="TSV conversion and cache reader speed")
    data_bench.add_argument("--out", default="runs/bench-data", help=OUT_HELP)
    data_bench.add_argument("--lines", type=int, default=500_000,
                            help="lines of the Criteo TSV file converted and read")
    data_bench.add_argument("--repeats", type=int, default=3, help=REPEATS_HELP)
    data_bench.set_defaults(func=_bench_data)
    real = bench.add_parser("realdata", help="the public sets of data prepare: the default "
                            "job, 1 local trainer, a plain PyTorch DeepFM and LightGBM, untuned "
                            "and tuned on the tuning split, AUC / NE / time side by side on "
                            "splits never used for choosing")
    real.add_argument("--out", default="runs/bench-realdata", help=OUT_HELP)
    real.add_argument("--seeds", type=int, default=3, help="seeds of every learner")
    real.add_argument("--sets", default="movielens100k,adult,clothing-reviews",
                      help="comma list of the data sets (default: all three)")
    real.add_argument("--epochs", type=int, default=20,
                      help="most passes over the training rows (early stopping ends sooner)")
    real.add_argument("--val-share", type=float, default=0.1,
                      help="validation tail of the training rows; the job's other options "
                      "are the defaults it adapts")
    real.add_argument("--multi-hot", default="auto", choices=("auto", "on", "off"),
                      help="genres and review words as multi-hot features (auto: when "
                      "training reads them)")
    real.add_argument("--splits", default="1",
                      help="the reported splits: train / eval splits drawn from these seeds, "
                      "never used for choosing a default or a baseline's setting (default: 1, "
                      "the short run; the whole protocol: 1-5)")
    real.add_argument("--tuning-split", action="store_true",
                      help="run on the tuning split (seed 0) instead: the one on which defaults "
                      "and the baselines' settings may be chosen, never reported")
    real.add_argument("--collect", metavar="DIR,DIR",
                      help="no new runs: write OUT's results from these earlier runs' "
                      "directories (e.g. one command a set or a split, run side by side)")
    real.set_defaults(func=_bench_realdata)


