"""The `shadowsync` command: train, generate data, run benchmarks."""

from __future__ import annotations

import argparse
import atexit
import difflib
import logging
import os
import re
import signal
import sys
import tempfile
import warnings
from pathlib import Path
from typing import NoReturn

import shadowsync.forkserver as forkserver
from shadowsync import __version__
from shadowsync.api import run
from shadowsync.bench.commands import add_bench_commands
from shadowsync.checkpoint.storage import local_copy, location
from shadowsync.checkpoint.store import CONFIG, find_checkpoint
from shadowsync.config import add_config_arguments, load_config
from shadowsync.data.infer import infer_schema
from shadowsync.data.prepare import prepare
from shadowsync.data.synth import write_tsv_dataset
from shadowsync.data.zipf import ZipfConfig, write_days
from shadowsync.errors import UserError
from shadowsync.inference import export
from shadowsync.lifecycle.stop import Interrupted
from shadowsync.logs import setup_logging
from shadowsync.runners.switch.search import MIN_SHARE_FLOOR
from shadowsync.switch_search import run_search
from shadowsync.train.report import format_table

SUMMARY_KEYS = [
    "examples", "wall_s", "eps", "total_s", "train_ne", "train_loss", "eval_ne", "eval_accuracy",
    "teacher_eval_ne", "ne_vs_teacher",
    "eval_auc", "eval_logloss", "calibration", "trainers", "workers", "sync",
    "syncs_per_min", "sync_blocked_fraction", "skipped_lines",
]


def _train(args: argparse.Namespace) -> int:
    if args.resume and not args.config:  # the checkpoint's options are the base
        step_config = find_checkpoint(args.resume, "--resume") / CONFIG
        with tempfile.TemporaryDirectory(prefix="shadowsync-") as tmp:  # a URL's: a copy
            args.config = str(local_copy(step_config, Path(tmp)))
            cfg = load_config(args)
    elif args.warm_start:  # the run's options, where these do not say
        from shadowsync.cluster.job import warm_start_options  # start-up cost: torch

        cfg = load_config(args, absent=warm_start_options(args.warm_start))
    else:
        cfg = load_config(args)
    if args.print_config:
        sys.stdout.write(cfg.to_toml())
        return 0
    setup_logging(cfg.output.log_level, "launcher")
    _, summary = run(cfg)
    logging.getLogger("shadowsync").info("done, outputs in %s/", summary["out"])
    print(format_table(summary, SUMMARY_KEYS))
    best = summary.get("best")
    if best:  # --val-share: which model the run keeps, and why it stopped
        kind = (f"the average of {best['averaged']} epoch ends to epoch"
                if best.get("averaged") else "epoch")
        print(f"  best model: {kind} {best.get('epoch')} ({best.get('examples', 0):,} examples), "
              f"validation NE {best.get('val_ne', float('nan')):.4f} AUC "
              f"{best.get('val_auc', float('nan')):.4f}"
              f"{'; stopped early' if summary.get('early_stopped') else ''}"
              f"; last model's eval AUC {summary.get('last_eval_auc', float('nan')):.4f}")
    ids = summary.get("dynamic_tables")
    if ids:  # --tables dynamic: what the id maps did
        print(f"  dynamic tables: {ids['admitted']:,} ids admitted, {ids['evicted']:,} rows "
              f"evicted, {ids['live']:,} of {ids['capacity']:,} rows in use; "
              f"{ids['rejected']:,} of {ids['lookups']:,} lookups read the default row")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from shadowsync.evaluation import evaluate_checkpoint  # start-up cost: torch

    result = evaluate_checkpoint(args.checkpoint, args.data, args.predictions,
                                 args.skip_bad_lines, model=args.model)
    keys = ["examples", "ne", "auc", "logloss", "calibration", "accuracy", "checkpoint",
            "predictions"]
    print(format_table(result, keys))
    return 0


def _export(args: argparse.Namespace) -> int:
    result = export(args.checkpoint, args.out, model=args.model)
    print(format_table(result, ["out", "schema", "bytes", "load_s", "export_s", "checkpoint"]))
    return 0


def _schema(args: argparse.Namespace) -> int:
    sys.stdout.write(infer_schema(args.file, args.label))
    return 0


def _prepare(args: argparse.Namespace) -> int:
    info = prepare(args.name, args.out, args.seed, args.format, args.multi_hot,
                   args.min_word_count, args.buckets)
    for part, f in info["files"].items():
        print(f"{part}: {f['path']} ({f['rows']:,} rows, click rate {f['click_rate']:.3f})")
    if args.format == "parquet":
        print(f"schema: {info['schema']}")
    return 0


def _synth(args: argparse.Namespace) -> int:
    if args.examples < 10:
        raise UserError(f"--examples must be at least 10 (10% is held out), got {args.examples}")
    if args.ids == "zipf":
        return _synth_zipf(args)
    info = write_tsv_dataset(args.out, args.examples, args.seed)

    def ne(v: float | None) -> str:  # None where a split's labels are all the same
        return "n/a" if v is None else f"{v:.4f}"

    print(f"wrote {args.out}/train.tsv, eval.tsv, teacher.json: mean CTR "
          f"{info['mean_ctr']:.4f}, teacher NE train {ne(info['train_ne'])} "
          f"eval {ne(info['eval_ne'])}")
    return 0


def _synth_zipf(args: argparse.Namespace) -> int:
    if args.days < 1 or args.vocab < 1 or not 0 <= args.drift <= 1:
        raise UserError("--days and --vocab must be >= 1 and --drift in [0, 1]")
    info = write_days(args.out, args.examples, args.days, args.seed,
                      ZipfConfig(vocab=args.vocab, drift=args.drift))
    for day, d in info["days"].items():
        print(f"wrote {args.out}/{day}: {args.examples:,} rows, {d['distinct_ids']:,} distinct "
              f"ids, mean CTR {d['mean_ctr']:.4f}, teacher NE on its last 10% "
              f"{d['teacher_eval_ne']:.4f}")
    return 0


def _switch_search(args: argparse.Namespace) -> int:
    if not args.config:
        raise UserError("switch search: --config JOB.toml is required (the recurring job)")
    if args.seeds < 1 or not MIN_SHARE_FLOOR <= args.min_share <= 0.5:
        raise UserError(f"switch search: needs --seeds >= 1 and --min-share in "
                        f"[{MIN_SHARE_FLOOR:g}, 0.5]")
    if args.tolerance is not None and not args.tolerance >= 0:
        raise UserError("switch search: needs --tolerance >= 0")
    if args.tolerance is None and args.seeds < 2:
        raise UserError("switch search: the default tolerance is BSP's seed-to-seed spread, "
                        "which needs --seeds >= 2 (or give --tolerance)")
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


def interrupted_line(e: Interrupted) -> str:
    if e.kept is not None:
        return f"stopped by {e}; what it finished is kept in {e.kept}"
    if e.checkpoint is None:
        return f"stopped by {e}; no checkpoint was saved, nothing to resume"
    root = location(e.checkpoint).parent
    run = root.parent if isinstance(root, Path) and root.name == "checkpoint" else root
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

    def __init__(self, *args: object, **kwargs: object) -> None:
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
    """The whole command line: one phase per command group."""
    parser = Parser(prog="shadowsync", description=__doc__)
    parser.add_argument("--version", action="version", version=f"shadowsync {__version__}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_train(sub)
    _add_eval_export(sub)
    _add_data(sub)
    add_bench_commands(sub)
    _add_switch(sub)
    for _, leaf in _leaves(parser):
        leaf.set_defaults(parser_of_command=leaf)
    return parser


def _add_train(sub: argparse._SubParsersAction) -> None:
    """`shadowsync train`: every option of the configuration."""
    train = sub.add_parser(
        "train", help="train a DLRM or your own model (default: synthetic data, ~1 minute)",
        description="Train on this machine. Options come from their defaults, then --config "
        "FILE.toml, then the command line; every run writes the resolved options to "
        "OUT/config.toml, which --config reads back.")
    add_config_arguments(train)
    train.add_argument("--print-config", action="store_true",
                       help="print the options as a TOML file for --config, and exit")
    train.set_defaults(func=_train)


def _add_eval_export(sub: argparse._SubParsersAction) -> None:
    """`shadowsync eval` and `shadowsync export`: a checkpoint scored or exported."""
    ev = sub.add_parser(
        "eval", help="score a checkpoint on data: NE, AUC, calibration (accuracy for digits)",
        description="Load a checkpoint (a run directory means its newest) and score it.")
    ev.add_argument("--checkpoint", required=True, metavar="DIR",
                    help="a run directory or one of its checkpoint/step-N directories (a path "
                    "or an fsspec URL)")
    ev.add_argument("--data", required=True, metavar="DATA",
                    help="what train --data takes: every row is scored ('synthetic': the "
                    "held-out rows of the run's built-in data)")
    ev.add_argument("--predictions", metavar="OUT.npy",
                    help="also write the predictions (one per row, in the data's order)")
    ev.add_argument("--skip-bad-lines", action="store_true",
                    help="skip malformed data lines and count them instead of stopping")
    ev.set_defaults(func=_eval)
    model_help = ("MODULE:FUNCTION: the dense model's factory, for a run whose --model was "
                  "defined in a script or notebook (or cannot be imported from here)")
    ev.add_argument("--model", metavar="MODULE:FUNCTION", help=model_help)

    exp = sub.add_parser(
        "export", help="write a checkpoint's model as a torch.export program (.pt2) that "
        "loads with torch alone, and its feature schema beside it",
        description="torch.export.load(FILE).module()(dense, sparse) gives logits; the "
        "schema (feature names, table sizes, dense width) goes to FILE.schema.json.")
    exp.add_argument("--checkpoint", required=True, metavar="DIR",
                     help="a run directory or one of its checkpoint/step-N directories")
    exp.add_argument("--out", required=True, metavar="FILE.pt2",
                     help="the program to write (.pt2); its schema goes to FILE.pt2.schema.json")
    exp.add_argument("--model", metavar="MODULE:FUNCTION", help=model_help)
    exp.set_defaults(func=_export)


def _add_data(sub: argparse._SubParsersAction) -> None:
    """`shadowsync data synth|prepare`: the built-in and the public data sets."""
    data = sub.add_parser("data", help="data tools").add_subparsers(dest="data_cmd", required=True)
    synth = data.add_parser("synth", help="write planted-teacher data in Criteo TSV format")
    synth.add_argument("--out", required=True, help="output directory (train.tsv, eval.tsv, "
                       "teacher.json)")
    synth.add_argument("--examples", type=int, default=1_000_000,
                       help="examples in all, the last 10%% written to eval.tsv")
    synth.add_argument("--seed", type=int, default=0, help="seed of the teacher and the rows")
    synth.add_argument("--ids", choices=("hashed", "zipf"), default="hashed",
                       help="hashed: Criteo TSV whose ids fit 100,000-row tables; zipf: array "
                       "directories OUT/day0, day1... of raw 63-bit ids, Zipf over --vocab "
                       "values a feature, drifting by day (for --tables dynamic)")
    synth.add_argument("--days", type=int, default=1, help="zipf: days of --examples rows each")
    synth.add_argument("--vocab", type=int, default=10_000_000,
                       help="zipf: distinct values a feature draws from")
    synth.add_argument("--drift", type=float, default=0.2,
                       help="zipf: share of each day's ids that are new that day")
    synth.set_defaults(func=_synth)
    schema = data.add_parser(
        "schema", help="print a schema for a Parquet or CSV file, read off its columns: "
        "floats dense, integers and strings raw ids for --tables dynamic",
        description="shadowsync data schema FILE > schema.toml; then train --data FILE "
        "--schema schema.toml --tables dynamic (or --schema auto, the same schema).")
    schema.add_argument("file", help="a .parquet or .csv file, or a directory of them")
    schema.add_argument("--label", help="the label column (default: the first of label, "
                        "click, clicked, target, y)")
    schema.set_defaults(func=_schema)
    prep = data.add_parser("prepare", help="a real public data set as Parquet + schema.toml, "
                           "or arrays, with a fixed train/eval split")
    prep.add_argument("name", help="the data set: movielens100k (ratings as clicks), adult "
                      "(census income), clothing-reviews (recommended or not)")
    prep.add_argument("--out", required=True, help="output directory")
    prep.add_argument("--seed", type=int, default=0, help="seed of the train/eval split")
    prep.add_argument("--format", default="parquet", choices=("parquet", "arrays"),
                      help="Parquet files and schema.toml, or array directories")
    prep.add_argument("--multi-hot", action=argparse.BooleanOptionalAction, default=True,
                      help="declare list features (movie genres, review words) in the schema")
    prep.add_argument("--min-word-count", type=int, default=5,
                      help="clothing-reviews: keep the words seen at least this many times in "
                      "the training rows (1: every word, the long tail included)")
    prep.add_argument("--buckets", type=int, default=128,
                      help="give each dense feature a categorical feature NAME_quantile: its "
                      "value's bucket among up to this many quantile buckets of the training "
                      "rows (edges kept in the schema; 0: none)")
    prep.set_defaults(func=_prepare)


def _add_switch(sub: argparse._SubParsersAction) -> None:
    """`shadowsync switch search`: the offline search of the BSP share."""
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
    ss.add_argument("--tolerance", type=float, default=None,
                    help="how far a share's mean metric may fall from full BSP's (accuracy: "
                    "absolute, as a fraction; NE: relative); default: the spread of full "
                    "BSP's own seeds (max - min; NE: over their mean)")
    ss.add_argument("--seeds", type=int, default=2, help="runs per point (R)")
    ss.add_argument("--min-share", type=float, default=MIN_SHARE_FLOOR,
                    help=f"the smallest BSP share tried (at least {MIN_SHARE_FLOOR:g})")
    ss.add_argument("--search-probes", type=int, default=6,
                    help="points measured in all, full BSP included")
    ss.add_argument("--store", default="runs/switch-search",
                    help="directory of the stored results that --switch-at auto reads")
    ss.add_argument("--out", help="where the runs go (default: runs/switch-search-NAME)")
    ss.set_defaults(func=_switch_search)


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
    # torch's C++ warnings (an RPC peer's connection closing as a job ends on an error) would
    # bury the one line that says what went wrong; errors still print. Read once, when the
    # job's processes load torch, so it is set before any of them starts.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
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
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_and_exit(argv: list[str] | None = None) -> NoReturn:
    """The `shadowsync` command: `main`, then an exit that skips the interpreter's teardown.

    Why: with torch loaded, tearing the interpreter down took about a second after the work
    was done, and the fork server, seeing its launcher gone, as long again; a script or a
    test waiting for the command waited for both. The exit handlers still run (they flush the
    logs and release what multiprocessing holds); the fork server is done with and ended."""
    code = main(argv)
    forkserver.stop()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run_and_exit()
