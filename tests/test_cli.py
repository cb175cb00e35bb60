"""The command line reads well: every option explained with its default, options grouped by
topic, one line for a mistake (with the closest option or choice), and a summary table with
only the metrics that apply, whose throughput says what it measures."""

from __future__ import annotations

import argparse
import json
import os

import pytest

from shadowsync.cli import HelpFormatter, _leaves, build_parser, main
from shadowsync.config import TESTING
from shadowsync.train.report import format_table


def _options(parser: argparse.ArgumentParser):
    return [a for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS]


def test_every_option_of_every_command_has_help_and_shows_its_default():
    formatter = HelpFormatter("x")
    commands = list(_leaves(build_parser()))
    assert {" ".join(w) for w, _ in commands} >= {
        "train", "eval", "data synth", "bench sync", "bench switch", "bench faults",
        "bench scale", "bench embedding", "bench hogwild", "bench data", "switch search"}
    for words, parser in commands:
        for action in _options(parser):
            where = f"{' '.join(words)} {action.option_strings[-1]}"
            assert action.help, f"{where} has no help text"
            if words == ("train",):  # defaults of train come from TrainConfig, in the text
                continue
            if action.default not in (None, False) and not isinstance(action,
                                                                     argparse._HelpAction):
                assert "default" in formatter._get_help_string(action), where
    train = dict(commands)[("train",)].format_help()
    assert "--sync-every N" in train and "(default: 50)" in train
    assert "(default: s-bmuf)" in train and "(default: 300s)" in train


def _group_of(parser: argparse.ArgumentParser, flag: str) -> str:
    for group in parser._action_groups:
        if any(flag in a.option_strings for a in group._group_actions):
            return group.title
    raise AssertionError(flag)


def test_testing_and_checkpoint_options_have_their_own_groups():
    train = dict(_leaves(build_parser()))[("train",)]
    for flag in ("--inject-nan-at", "--straggler"):
        assert _group_of(train, flag) == TESTING
    for flag in ("--checkpoint-every", "--keep-checkpoints", "--resume", "--max-restarts",
                 "--on-divergence"):
        assert _group_of(train, flag) == "checkpoints and recovery"
    assert _group_of(train, "--out") == "output" and _group_of(train, "--sync") == \
        "synchronization"
    text = train.format_help()
    assert text.index("checkpoints and recovery:") < text.index("testing (")


def test_help_shows_percent_signs_once():
    for _, parser in _leaves(build_parser()):
        assert "%%" not in parser.format_help()
    train = dict(_leaves(build_parser()))[("train",)].format_help()
    assert "the last 10% of --data" in " ".join(train.split())


def _error_line(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "usage:" not in err, err
    return err


def test_a_mistyped_option_gets_one_line_with_the_closest_option(capsys):
    err = _error_line(capsys, ["train", "--snyc", "s-ma"])
    assert err.startswith("shadowsync train: error: unrecognized arguments: --snyc s-ma")
    assert "did you mean --sync?" in err
    err = _error_line(capsys, ["bench", "sync", "--repets", "2"])
    assert "did you mean --repeats?" in err and err.startswith("shadowsync bench sync:")


def test_a_bad_choice_is_one_line_not_the_usage_block(capsys):
    err = _error_line(capsys, ["train", "--sync", "bogus"])
    assert "argument --sync: invalid choice: 'bogus'" in err and "did you mean" not in err
    assert "did you mean 's-ma'?" in _error_line(capsys, ["train", "--sync", "s-mma"])
    assert "did you mean 'train'?" in _error_line(capsys, ["trian"])


def test_the_summary_table_has_no_row_for_a_metric_that_does_not_apply():
    table = format_table({"examples": 1000, "eval_ne": 0.8, "teacher_eval_ne": None,
                          "ne_vs_teacher": None}, ["examples", "eval_ne", "teacher_eval_ne",
                                                   "ne_vs_teacher", "eval_auc"])
    assert table.split("\n") == ["  examples         1,000", "  eval_ne          0.8000"]


@pytest.mark.timeout(150)
def test_eps_is_training_throughput_and_total_s_the_whole_run(quiet_arrays_run):
    """On a user's arrays: no teacher rows, no `None`; eps = examples / wall_s, where wall_s
    leaves out start-up and the end, which total_s (the whole run) includes."""
    out, res, outer = quiet_arrays_run
    assert res.returncode == 0, res.stderr[-2000:]
    assert "None" not in res.stdout and "teacher" not in res.stdout
    rows = dict(line.split() for line in res.stdout.strip().splitlines())
    assert {"eps", "wall_s", "total_s", "eval_ne"} <= set(rows)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["eps"] == pytest.approx(summary["examples"] / summary["wall_s"], rel=0.01)
    # The run's start (imports, data checks, the model built and checked) and its end are in
    # total_s only, which the caller's own clock bounds from above.
    assert summary["wall_s"] < summary["total_s"] <= outer
    assert summary["total_s"] - summary["wall_s"] > 0.05
    # The worker's CPU while it trained: some, and no more than the machine's cores gave.
    assert 0 < summary["train_cpu_s"] <= (os.cpu_count() or 1) * summary["wall_s"]
