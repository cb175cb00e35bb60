"""The registry of sync modes: every --sync choice is one entry that knows its runner."""

import argparse

import pytest

from shadowsync.config import TrainConfig, add_config_arguments, load_config
from shadowsync.errors import UserError
from shadowsync.runners.build import group_syncs, needs_dense_servers
from shadowsync.spec.modes import MODES, SYNC_CHOICES
from shadowsync.train.tasks import build_dense_model, features_of


def parse(argv):
    p = argparse.ArgumentParser()
    add_config_arguments(p)
    return load_config(p.parse_args(argv))


def test_every_choice_is_an_entry_whose_builder_resolves():
    assert set(SYNC_CHOICES) == set(MODES)
    for mode in MODES.values():
        build = mode.build()
        assert (build is None) == (mode.name == "none")
        assert build is None or callable(build)
    assert {m.name for m in MODES.values() if m.lockstep} == {"ddp", "torch-fr-ma", "torchft-ma",
                                                              "bsp", "switch"}


@pytest.mark.parametrize("sync, need", [("s-easgd", True), ("fr-easgd", True), ("bsp", True),
                                        ("asp", True), ("switch", True), ("s-bmuf", False),
                                        ("ddp", False), ("none", False)])
def test_dense_servers_follow_the_mode(sync, need):
    cfg = TrainConfig(sync=sync)
    assert needs_dense_servers(cfg.sync, build_dense_model(cfg, features_of(cfg))) is need


def test_groups_take_rule_modes_only():
    model = build_dense_model(TrainConfig(), features_of(TrainConfig()))
    cfg = TrainConfig(sync="s-bmuf", sync_groups=["bottom=s-easgd"])
    assert group_syncs(cfg.sync, model) == {"bottom": "s-easgd"}
    assert needs_dense_servers(cfg.sync, model)
    with pytest.raises(UserError, match="'bsp' is not a rule"):
        group_syncs(TrainConfig(sync_groups=["top=bsp"]).sync, model)
    with pytest.raises(UserError, match="all groups must be background"):
        group_syncs(TrainConfig(sync="s-ma", sync_groups=["top=fr-ma"]).sync, model)
    with pytest.raises(UserError, match="cannot be combined with --sync bsp"):
        group_syncs(TrainConfig(sync="bsp", sync_groups=["top=s-ma"]).sync, model)


@pytest.mark.parametrize("argv, message", [
    (["--sync", "switch", "--switch-plan", "bsp:2"], "--switch-plan: share"),
    (["--momentum", "1.0"], "--momentum must be in"),
    (["--sync", "bsp", "--switch-momentum", "flip"], "--switch-momentum: 'flip'"),
])
def test_bad_protocol_options_name_the_option(argv, message):
    with pytest.raises((UserError, SystemExit)) as e:
        parse(argv)
    if e.type is UserError:
        assert message in str(e.value)


def test_task_choices_are_the_task_registry():
    from shadowsync.config import TASK_CHOICES
    from shadowsync.train.tasks import TASKS

    assert set(TASK_CHOICES) == set(TASKS)
    assert all(task.name == name for name, task in TASKS.items())


def test_a_task_says_what_eval_scores_and_how():
    """`shadowsync eval` asks the task: ctr re-plans generated rows (their held-out tenth)
    and scores a file whole; digits always re-plans its own rows; each scores its way."""
    import numpy as np

    from shadowsync.train.tasks import TASKS

    ctr, digits = TASKS["ctr"], TASKS["digits"]
    assert ctr.evaluation_data("synthetic", "synthetic") == "synthetic"
    assert ctr.evaluation_data("synthetic", "rows.tsv") is None
    assert digits.evaluation_data("digits", "anything") == "digits"
    pred, y = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]]), np.array([0.0, 0.0, 0.0])
    assert digits.metrics_of(pred, y) == {"accuracy": 2 / 3}
    assert ctr.metrics_of(np.array([0.5, 0.5]), np.array([0.0, 1.0]))["ne"] == \
        pytest.approx(1.0)
    assert (ctr.output, ctr.categorical, digits.output, digits.categorical) == \
        ("sigmoid", True, "softmax", False)


def test_averaging_clock_counts_only_the_calls_that_averaged():
    import time

    from shadowsync.runners.ddp import AveragingClock

    clock, calls = AveragingClock(), [0]

    def step() -> int:
        calls[0] += 1
        time.sleep(0.02 if calls[0] % 3 == 0 else 0.1)  # every third call "averages"
        return calls[0]

    timed = clock.timed(step, lambda: calls[0] % 3 == 0)
    assert [timed() for _ in range(6)] == [1, 2, 3, 4, 5, 6]
    assert 0.04 <= clock.take() < 0.4  # the two averaging calls, not the four others
    assert clock.take() == 0.0  # taken once


def test_what_the_code_asks_of_a_mode_is_a_registry_property():
    """The questions code used to answer from a mode's name, now answered by its entry."""
    stop_on_servers = {m.name for m in MODES.values() if not m.stops_alone}
    assert stop_on_servers == {m.name for m in MODES.values() if m.protocols} == {
        "bsp", "asp", "switch"}
    assert [m.name for m in MODES.values() if not m.synchronizes] == ["none"]
    assert [m.name for m in MODES.values() if m.can_switch] == ["switch"]
    assert sorted(m.name for m in MODES.values() if m.can_fall_back) == ["s-bmuf", "s-ma"]
    assert {m.name: m.rule for m in MODES.values() if m.family == "background"} == {
        "s-ma": "ma", "s-bmuf": "bmuf", "s-easgd": "easgd"}
    assert MODES["ddp"].build() is not MODES["torch-fr-ma"].build()


def test_the_table_of_modes_shows_every_mode_once():
    from shadowsync.config import SyncConfig
    from shadowsync.spec.modes import DEFAULT_MODE, TABLE, mode_table

    shown = [m for row in TABLE for m in row.modes]
    assert sorted(shown) == sorted(MODES) and len(shown) == len(set(shown))
    assert DEFAULT_MODE == SyncConfig().mode
    assert f"`{DEFAULT_MODE}` (default)" in mode_table()
