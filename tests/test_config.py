"""Options come from defaults, then a TOML file, then the command line."""

import argparse

import pytest

from shadowsync.config import TrainConfig, add_config_arguments, load_config
from shadowsync.errors import UserError


def parse(argv):
    p = argparse.ArgumentParser()
    add_config_arguments(p)
    return load_config(p.parse_args(argv))


def test_defaults():
    cfg = parse([])
    assert cfg == TrainConfig()


def test_toml_fills_and_command_line_wins(tmp_path):
    f = tmp_path / "job.toml"
    f.write_text('workers = 3\nlr = 1\ntop-mlp = [8, 4]\nsync = "s-ma"\nsync_interval = 0.5\n')
    cfg = parse(["--config", str(f), "--workers", "5"])
    assert cfg.cluster.workers == 5 and cfg.optim.lr == 1.0 and cfg.model.top_mlp == [8, 4]
    assert cfg.sync.mode == "s-ma" and cfg.sync.interval.seconds == 0.5


def test_unknown_toml_key_is_named(tmp_path):
    f = tmp_path / "job.toml"
    f.write_text("wokers = 3\n")
    with pytest.raises(UserError,
                       match=r"job.toml: unknown option 'wokers'; did you mean 'workers'"):
        parse(["--config", str(f)])


def test_wrong_type_in_toml(tmp_path):
    f = tmp_path / "job.toml"
    f.write_text('workers = "two"\n')
    with pytest.raises(UserError, match="option 'workers' must be int"):
        parse(["--config", str(f)])


@pytest.mark.parametrize("argv, message", [
    (["--workers", "0"], "--workers must be positive"),
    (["--lr", "-1"], "--lr must be a positive number"),
    (["--embedding-lr", "0"], "--embedding-lr must be a positive number"),
    (["--embedding-initial-accumulator", "-0.1"], "--embedding-initial-accumulator must be"),
    (["--embedding-initial-accumulator", "nan"], "--embedding-initial-accumulator must be"),
    (["--sync-interval", "soon"], "--sync-interval must be 'auto'"),
    (["--lr-decay-share", "1.5"], r"--lr-decay-share must be in \[0, 1\], got 1.5"),
    (["--lr-decay-floor", "nan"], "--lr-decay-floor must be in"),
    (["--sync-budget", "2"], "--sync-budget must be in"),
])
def test_bad_values_name_the_option(argv, message):
    with pytest.raises(UserError, match=message):
        parse(argv)


def test_missing_config_file():
    with pytest.raises(UserError, match="nope.toml: no such file"):
        parse(["--config", "nope.toml"])


def test_toml_round_trip(tmp_path):
    cfg = TrainConfig(workers=3, sync="s-bmuf", sync_groups=["bottom=s-easgd"], lr=0.1,
                      out="runs/x", progress=False)
    from shadowsync.config import config_to_toml

    f = tmp_path / "job.toml"
    f.write_text(config_to_toml(cfg))
    assert parse(["--config", str(f)]) == cfg


def test_print_config_then_config_file_resolves_the_same(tmp_path, capsys):
    from shadowsync.cli import build_parser, main

    argv = ["--trainers", "3", "--sync", "s-easgd", "--table-size", "10,20", "--lr", "0.1",
            "--sync-groups", "bottom=s-ma", "--no-progress", "-v"]
    assert main(["train", *argv, "--print-config"]) == 0
    job = tmp_path / "job.toml"
    job.write_text(capsys.readouterr().out)
    direct = load_config(build_parser().parse_args(["train", *argv]))
    again = load_config(build_parser().parse_args(["train", "--config", str(job)]))
    assert again == direct
    assert again.model.table_size == [10, 20] and again.output.log_level == "debug"
    assert main(["train", "--config", str(job), "--print-config"]) == 0
    assert capsys.readouterr().out == job.read_text()


def test_help_groups_options_and_shows_defaults(capsys):
    from shadowsync.cli import main

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    for title in ("data:", "model and optimisation:", "cluster:", "synchronization:", "output:"):
        assert title in text
    assert "(default: s-bmuf)" in text and "(default: 100000)" in text


def test_version(capsys):
    from shadowsync import __version__
    from shadowsync.cli import main

    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.strip() == f"shadowsync {__version__}"


def test_tensorboard_without_the_package_is_one_line(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(UserError, match=r"--tensorboard needs the tensorboard package"):
        TrainConfig(tensorboard=True)
