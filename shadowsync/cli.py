"""The `shadowsync` command: train, generate data, run benchmarks."""

from __future__ import annotations

import argparse
import difflib
import logging
import re
import sys
import warnings
from typing import Any, NoReturn

from shadowsync.errors import UserError
from shadowsync.train.stop import Interrupted

SUMMARY_KEYS = [
    "examples", "wall_s", "eps", "total_s", "train_ne", "train_loss", "eval_ne", "eval_accuracy",
    "teacher_eval_ne", "ne_vs_teacher",
    "eval_auc", "eval_logloss", "calibration", "trainers", "workers", "sync",
    "syncs_per_min", "sync_blocked_fraction", "skipped_lines",
]


def _train(args: argparse.Namespace) -> int:
    from shadowsync.config import config_to_toml, load_config

    if args.resume and not args.config:  # the checkpoint's options are the base
        from shadowsync.checkpoint.store import CONFIG, find_checkpoint

        args.config = str(find_checkpoint(args.resume, "--resume") / CONFIG)
    cfg = load_config(args)
    if args.print_config:
        sys.stdout.write(config_to_toml(cfg))
        return 0
    from shadowsync.api import run
    from shadowsync.logs import setup_logging
    from shadowsync.train.report import format_table

    setup_logging(cfg.output.log_level, "launcher")
    _, summary = run(cfg)
    logging.getLogger("shadowsync").info("done, outputs in %s/", summary["out"])
    print(format_table(summary, SUMMARY_KEYS))
    best = summary.get("best")
    if best:  # --val-share: which model the run keeps, and why it stopped
        print(f"  best model: epoch {best.get('epoch')} ({best.get('examples', 0):,} examples), "
              f"validation NE {best.get('val_ne', float('nan')):.4f} AUC "
              f"{best.get('val_auc', float('nan')):.4f}"
              f"{'; stopped early' if summary.get('early_stopped') else ''}"
              f"; last model's eval AUC {summary.get('last_eval_auc', float('nan')):.4f}")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from shadowsync.checkpoint.evaluate import evaluate_checkpoint
    from shadowsync.train.report import format_table

    result = evaluate_checkpoint(args.checkpoint, args.data, args.predictions,
                                 args.skip_bad_lines)
    keys = ["examples", "ne", "auc", "logloss", "calibration", "accuracy", "checkpoint",
            "predictions"]
    print(format_table(result, keys))
    return 0


def _export(args: argparse.Namespace) -> int:
    from shadowsync.inference import export
    from shadowsync.train.report import format_table

    result = export(args.checkpoint, args.out)
    print(format_table(result, ["out", "schema", "bytes", "load_s", "export_s", "checkpoint"]))
    return 0


def _prepare(args: argparse.Namespace) -> int:
    from shadowsync.data.prepare import prepare

    info = prepare(args.name, args.out, args.seed, args.format, args.multi_hot)
    for part, f in info["files"].items():
        print(f"{part}: {f['path']} ({f['rows']:,} rows, click rate {f['click_rate']:.3f})")
    if args.format == "parquet":
        print(f"schema: {info['schema']}")
    return 0


def _synth(args: argparse.Namespace) -> int:
    from shadowsync.data.synth import write_tsv_dataset

    if args.examples < 10:
        raise UserError(f"--examples must be at least 10 (10% is held out), got {args.examples}")
    info = write_tsv_dataset(args.out, args.examples, args.seed)

    def ne(v: float | None) -> str:  # None where a split's labels are all the same
        return "n/a" if v is None else f"{v:.4f}"

    print(f"wrote {args.out}/train.tsv, eval.tsv, teacher.json: mean CTR "
          f"{info['mean_ctr']:.4f}, teacher NE train {ne(info['train_ne'])} "
          f"eval {ne(info['eval_ne'])}")
    return 0


def _bench_hogwild(args: argparse.Namespace) -> int:
    from shadowsync.bench.hogwild import run_hogwild_bench

    run_hogwild_bench(args.out, examples=args.examples, repeats=args.repeats)
    return 0


def _bench_sync(args: argparse.Namespace) -> int:
    from shadowsync.bench.sync import run_sync_bench

    run_sync_bench(args.out, examples=args.examples, repeats=args.repeats,
                   slow_net=not args.no_slow_net, quality_examples=args.quality_examples,
                   full=args.full, slow_net_only=args.slow_net_only)
    return 0


def _bench_embedding(args: argparse.Namespace) -> int:
    from shadowsync.bench.embedding import run_embedding_bench

    run_embedding_bench(args.out, steps=args.steps, repeats=args.repeats)
    return 0


def _bench_scale(args: argparse.Namespace) -> int:
    from pathlib import Path

    from shadowsync.bench.scale import require_scipy, run_scale_bench

    require_scipy()
    if args.examples < 5_000 or args.repeats < 1:
        raise UserError("--examples must be >= 5000 and --repeats >= 1")
    if args.points and not Path(args.points).is_file():
        raise UserError(f"--points: no such file {args.points}")
    run_scale_bench(args.out, per_trainer=args.examples, repeats=args.repeats,
                    quick=args.quick, netns=not args.no_netns, points_from=args.points)
    return 0


def _bench_switch(args: argparse.Namespace) -> int:
    from shadowsync.bench.switch import VARIANTS, run_switch_bench

    if not 0 < args.share < 1:
        raise UserError(f"--share must be in (0, 1), got {args.share}")
    if args.no_ctr and args.no_digits and args.slow_link is None:
        raise UserError("bench switch: --no-ctr and --no-digits leave nothing to run")
    if args.trainers < 2 or args.repeats < 1:
        raise UserError("--trainers must be >= 2 and --repeats >= 1")
    if args.slow_link is not None and not args.slow_link > 0:
        raise UserError(f"--slow-link must be > 0 (Mbit/s), got {args.slow_link}")
    variants = tuple(v.strip() for v in (args.variants or "").split(",") if v.strip())
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise UserError(f"--variants: {', '.join(unknown)} not among {', '.join(VARIANTS)}")
    run_switch_bench(args.out, trainers=args.trainers, digits_examples=args.digits_examples,
                     ctr_examples=args.ctr_examples, share=args.share, repeats=args.repeats,
                     ctr=not args.no_ctr, ctr_trainers=args.ctr_trainers,
                     digits=not args.no_digits, full=args.full, slow_link=args.slow_link,
                     variants=variants)
    return 0


def _switch_search(args: argparse.Namespace) -> int:
    from pathlib import Path

    from shadowsync.config import load_config
    from shadowsync.switch_search import run_search

    if not args.config:
        raise UserError("switch search: --config JOB.toml is required (the recurring job)")
    if args.seeds < 1 or not 0 < args.min_share <= 0.5 or not args.tolerance >= 0:
        raise UserError("switch search: needs --seeds >= 1, --min-share in (0, 0.5] and "
                        "--tolerance >= 0")
    if args.search_probes < 2:
        raise UserError("switch search: --search-probes must be >= 2 (full BSP and one share)")
    cfg = load_config(argparse.Namespace(config=args.config))
    name = args.name or Path(args.config).stem
    out = args.out or f"runs/switch-search-{name}"
    r = run_search(cfg, name, args.tolerance, args.seeds, args.min_share, args.store, out,
                   probes=args.search_probes)
    for share in sorted((float(k) for k in r.points), reverse=True):
        print(f"share {share:<8g} mean {r.metric} {r.mean(share):.4f}  "
              f"{', '.join(f'{v:.4f}' for v in r.points[f'{share:g}'])}")
    print(f"chosen BSP share: {r.share:g} (full BSP {r.bsp_mean:.4f}, tolerance "
          f"{r.tolerance:g}) after {r.wall_s / 60:.1f} min; stored in {args.store}/{name}.json "
          f"(plot {name}.png beside it; the curve also in {out}/curve.json, .png); use it with "
          f"--switch-at auto --job-name {name}")
    return 0


def _bench_faults(args: argparse.Namespace) -> int:
    from shadowsync.bench.faults import SCENARIOS, run_faults_bench

    if args.examples < 20_000 or args.repeats < 1 or args.soak_s < 0:
        raise UserError("--examples must be >= 20000, --repeats >= 1 and --soak-s >= 0")
    names = SCENARIOS if args.scenarios == "all" else \
        tuple(s.strip() for s in args.scenarios.split(",") if s.strip())
    unknown = [s for s in names if s not in SCENARIOS]
    if unknown:
        raise UserError(f"--scenarios: unknown {', '.join(unknown)} (choose from "
                        f"{', '.join(SCENARIOS)})")
    run_faults_bench(args.out, examples=args.examples, repeats=args.repeats,
                     scenarios=names, soak_s=args.soak_s)
    return 0


def _bench_data(args: argparse.Namespace) -> int:
    from shadowsync.bench.data import run_data_bench

    run_data_bench(args.out, lines=args.lines, repeats=args.repeats)
    return 0


def _bench_realdata(args: argparse.Namespace) -> int:
    from shadowsync.bench.realdata import run_realdata_bench

    if args.seeds < 1 or args.epochs < 1:
        raise UserError("--seeds and --epochs must be >= 1")
    run_realdata_bench(args.out, seeds=args.seeds, epochs=args.epochs, val_share=args.val_share,
                       early_stop=args.early_stop, eval_points=args.eval_points,
                       multi_hot=args.multi_hot)
    return 0


OUT_HELP = "output directory (bench.json, runs.jsonl, plots)"
REPEATS_HELP = "interleaved repeats of every variant (medians and spread over them)"


def interrupted_line(e: Interrupted) -> str:
    if e.checkpoint is None:
        return f"stopped by {e}; no checkpoint was saved, nothing to resume"
    from pathlib import Path

    run = Path(e.checkpoint).parent.parent
    return (f"stopped by {e}; checkpoint saved in {e.checkpoint}; resume with: "
            f"shadowsync train --resume {run}")


class HelpFormatter(argparse.HelpFormatter):
    """Shows an option's default after its help, unless the help already says it or there is
    none to show (a flag, an option that is off unless given)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if ("default" in text or default in (None, False, argparse.SUPPRESS)
                or not action.option_strings):
            return text
        return f"{text} (default: %(default)s)"

    def _get_default_metavar_for_optional(self, action: argparse.Action) -> str:
        default = super()._get_default_metavar_for_optional(action)
        return {int: "N", float: "X"}.get(action.type, default)  # type: ignore[call-overload]


class Parser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line, with the closest option or choice
    where the user mistyped one, instead of the usage block."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        hint = suggestion(message, self)
        sys.stderr.write(f"{self.prog}: error: {message}{hint} (see: {self.prog} --help)\n")
        sys.exit(2)


def _option_strings(parser: argparse.ArgumentParser) -> set[str]:
    """Every long option of this parser and of the commands under it."""
    found = {o for a in parser._actions for o in a.option_strings if o.startswith("--")}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _option_strings(sub)
    return found


def suggestion(message: str, parser: argparse.ArgumentParser) -> str:
    """'; did you mean --sync?' for a mistyped option, or the closest valid choice."""
    if message.startswith("unrecognized arguments:"):
        words = [w.split("=")[0] for w in message.split(":", 1)[1].split() if w.startswith("--")]
        known = sorted(_option_strings(parser))
        close = [m[0] for w in words if (m := difflib.get_close_matches(w, known, n=1))]
        return f"; did you mean {', '.join(close)}?" if close else ""
    choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if choice:
        options = re.findall(r"'([^']*)'", choice[2]) or choice[2].split(", ")
        close = difflib.get_close_matches(choice[1], options, n=1)
        return f"; did you mean '{close[0]}'?" if close else ""
    return ""


def build_parser() -> argparse.ArgumentParser:
    from shadowsync import __version__
    from shadowsync.config import add_config_arguments

    parser = Parser(prog="shadowsync", description=__doc__)
    parser.add_argument("--version", action="version", version=f"shadowsync {__version__}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser(
        "train", help="train a DLRM or your own model (default: synthetic data, ~1 minute)",
        description="Train on this machine. Options come from their defaults, then --config "
        "FILE.toml, then the command line; every run writes the resolved options to "
        "OUT/config.toml, which --config reads back.")
    add_config_arguments(train)
    train.add_argument("--print-config", action="store_true",
                       help="print the options as a TOML file for --config, and exit")
    train.set_defaults(func=_train)

    ev = sub.add_parser(
        "eval", help="score a checkpoint on data: NE, AUC, calibration (accuracy for digits)",
        description="Load a checkpoint (a run directory means its newest) and score it.")
    ev.add_argument("--checkpoint", required=True, metavar="DIR",
                    help="a run directory or one of its checkpoint/step-N directories")
    ev.add_argument("--data", required=True, metavar="DATA",
                    help="what train --data takes: every row is scored ('synthetic': the "
                    "held-out rows of the run's built-in data)")
    ev.add_argument("--predictions", metavar="OUT.npy",
                    help="also write the predictions (one per row, in the data's order)")
    ev.add_argument("--skip-bad-lines", action="store_true",
                    help="skip malformed data lines and count them instead of stopping")
    ev.set_defaults(func=_eval)

    exp = sub.add_parser(
        "export", help="write a checkpoint's model as a torch.export program (.pt2) that "
        "loads with torch alone, and its feature schema beside it",
        description="torch.export.load(FILE).module()(dense, sparse) gives logits; the "
        "schema (feature names, table sizes, dense width) goes to FILE.schema.json.")
    exp.add_argument("--checkpoint", required=True, metavar="DIR",
                     help="a run directory or one of its checkpoint/step-N directories")
    exp.add_argument("--out", required=True, metavar="FILE.pt2",
                     help="the program to write (.pt2); its schema goes to FILE.pt2.schema.json")
    exp.set_defaults(func=_export)

    data = sub.add_parser("data", help="data tools").add_subparsers(dest="data_cmd", required=True)
    synth = data.add_parser("synth", help="write planted-teacher data in Criteo TSV format")
    synth.add_argument("--out", required=True, help="output directory (train.tsv, eval.tsv, "
                       "teacher.json)")
    synth.add_argument("--examples", type=int, default=1_000_000,
                       help="examples in all, the last 10%% written to eval.tsv")
    synth.add_argument("--seed", type=int, default=0, help="seed of the teacher and the rows")
    synth.set_defaults(func=_synth)
    prep = data.add_parser("prepare", help="a real public data set (movielens100k) as "
                           "Parquet + schema.toml, or arrays, with a fixed train/eval split")
    prep.add_argument("name", choices=("movielens100k",), help="the data set")
    prep.add_argument("--out", required=True, help="output directory")
    prep.add_argument("--seed", type=int, default=0, help="seed of the train/eval split")
    prep.add_argument("--format", default="parquet", choices=("parquet", "arrays"),
                      help="Parquet files and schema.toml, or array directories")
    prep.add_argument("--multi-hot", action=argparse.BooleanOptionalAction, default=True,
                      help="declare list features (movie genres) in the schema")
    prep.set_defaults(func=_prepare)

    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench", required=True)
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
    sw = bench.add_parser("switch", help="BSP, ASP and Sync-Switch, with and without a straggler")
    sw.add_argument("--out", default="runs/bench-switch", help=OUT_HELP)
    sw.add_argument("--trainers", type=int, default=4, help="trainers of the digits job")
    sw.add_argument("--digits-examples", type=int, default=None,
                    help="examples per digits run (default 96k)")
    sw.add_argument("--ctr-examples", type=int, default=None,
                    help="examples per ctr run (default 100k, with --full 200k)")
    sw.add_argument("--ctr-trainers", type=int, default=2, help="trainers of the ctr job")
    sw.add_argument("--share", type=float, default=0.5,
                    help="BSP share of the digits switch plan (the quota of the online policies)")
    sw.add_argument("--repeats", type=int, default=3, help=REPEATS_HELP)
    sw.add_argument("--full", action="store_true",
                    help="also DDP, the offline plan and elastic under the straggler, greedy "
                    "and elastic under a 30 ms push delay on 1 and on 2 trainers, BSP, ASP and "
                    "the offline plan on a jittered network, and the configuration ablation, "
                    "on digits; ctr at 200k examples")
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
    faults = bench.add_parser("faults", help="a run stopped by SIGINT / SIGTERM and resumed, "
                              "processes killed, a NaN rolled back, each next to the same run "
                              "uninterrupted; then a memory soak")
    faults.add_argument("--out", default="runs/bench-faults", help=OUT_HELP)
    faults.add_argument("--examples", type=int, default=300_000, help="examples per run")
    faults.add_argument("--repeats", type=int, default=1, help=REPEATS_HELP)
    faults.add_argument("--scenarios", default="all",
                        help="comma list of: sigint-resume, sigterm-resume, kill-trainer, "
                        "kill-worker, kill-embedding-server, kill-dense-server, nan-rollback "
                        "(default: all)")
    faults.add_argument("--soak-s", type=float, default=600.0,
                        help="seconds of training of the memory soak (0: none)")
    faults.set_defaults(func=_bench_faults)
    switch = sub.add_parser("switch", help="Sync-Switch tools").add_subparsers(
        dest="switch_cmd", required=True)
    ss = switch.add_parser(
        "search", help="find the smallest BSP share that keeps full BSP's metric",
        description="Run the job at full BSP, then with the BSP share halving from 50%, "
        "SEEDS runs per point, until a share misses --tolerance of full BSP's mean final "
        "metric (accuracy: absolute; NE: relative); then bisect between it and the last share "
        "that passed until --search-probes points are measured; keep the smallest share that "
        "passed. Later runs use it with --sync switch --switch-at auto --job-name NAME.")
    ss.add_argument("--config", metavar="JOB.toml", help="the job (as `train --config` reads)")
    ss.add_argument("--name", help="name to store the result under (default: the file's stem)")
    ss.add_argument("--tolerance", type=float, default=0.005,
                    help="how far a share's mean metric may fall from full BSP's (accuracy: "
                    "absolute, as a fraction; NE: relative)")
    ss.add_argument("--seeds", type=int, default=2, help="runs per point (R)")
    ss.add_argument("--min-share", type=float, default=1 / 16,
                    help="the smallest BSP share tried")
    ss.add_argument("--search-probes", type=int, default=6,
                    help="points measured in all, full BSP included")
    ss.add_argument("--store", default="runs/switch-search",
                    help="directory of the stored results that --switch-at auto reads")
    ss.add_argument("--out", help="where the runs go (default: runs/switch-search-NAME)")
    ss.set_defaults(func=_switch_search)
    data_bench = bench.add_parser("data", help="TSV conversion and cache reader speed")
    data_bench.add_argument("--out", default="runs/bench-data", help=OUT_HELP)
    data_bench.add_argument("--lines", type=int, default=500_000,
                            help="lines of the Criteo TSV file converted and read")
    data_bench.add_argument("--repeats", type=int, default=3, help=REPEATS_HELP)
    data_bench.set_defaults(func=_bench_data)
    real = bench.add_parser("realdata", help="MovieLens 100K: the default job, 1 local "
                            "trainer and a plain PyTorch DeepFM, AUC / NE / time side by side")
    real.add_argument("--out", default="runs/bench-realdata", help=OUT_HELP)
    real.add_argument("--seeds", type=int, default=3, help="seeds of every learner")
    real.add_argument("--epochs", type=int, default=10, help="passes over the training rows")
    real.add_argument("--val-share", type=float, default=0.1,
                      help="validation tail of the training rows")
    real.add_argument("--early-stop", type=int, default=4,
                      help="validations without improvement before stopping")
    real.add_argument("--eval-points", type=int, default=2, help="validations an epoch")
    real.add_argument("--multi-hot", default="auto", choices=("auto", "on", "off"),
                      help="genres as a multi-hot feature (auto: when the data has them)")
    real.set_defaults(func=_bench_realdata)
    for _, leaf in _leaves(parser):
        leaf.set_defaults(parser_of_command=leaf)
    return parser


def _leaves(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()):
    """(command words, parser) of every command that takes options (no subcommands)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield words, parser
    for action in subs:
        for name, sub in action.choices.items():
            yield from _leaves(sub, (*words, name))


def main(argv: list[str] | None = None) -> int:
    warnings.filterwarnings("ignore", message=".*ProcessGroupGloo.*")
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # told by the command they were given to, which knows its own options
        args.parser_of_command.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return args.func(args)
    except UserError as e:
        print(f"shadowsync: error: {e}", file=sys.stderr)
        return e.exit_code
    except Interrupted as e:
        _ignore_more_signals()
        print(f"shadowsync: {interrupted_line(e)}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:  # before the job's processes took over the signals
        _ignore_more_signals()
        print("shadowsync: stopped by SIGINT while starting; nothing new was saved",
              file=sys.stderr)
        return 130


def _ignore_more_signals() -> None:
    """The run is stopped: a second Ctrl-C while this process exits changes nothing."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


if __name__ == "__main__":
    sys.exit(main())
