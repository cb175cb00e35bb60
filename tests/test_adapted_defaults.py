"""--val-share adapts the options it concerns where they are left open; without it, the
synthetic default job's settings stay as they were."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from shadowsync.config import (
    TrainConfig,
    add_config_arguments,
    config_from_options,
    config_to_toml,
)
from shadowsync.config.train import (
    BATCH_SIZE,
    DECAY_FLOOR,
    LR,
    PATIENCE_EPOCHS,
    VALIDATED_DECAY_FLOOR,
    VALIDATED_LR,
    VALIDATED_SYNC_STEPS,
    VALIDATIONS_PER_EPOCH,
)
from shadowsync.rules.bmuf import BlockwiseModelUpdateFiltering
from shadowsync.runners.build import rule_for
from shadowsync.spec.interval import SyncInterval
from shadowsync.train.schedule import LrSchedule


def _adapted(**options):
    c = TrainConfig(**options).adapted()
    return (c.output.eval_points, c.data.early_stop, c.optim.lr_decay_on_plateau,
            c.model.interaction, c.sync.block_momentum)


def test_without_val_share_the_default_job_is_unchanged():
    assert _adapted() == (8, 0, False, "dot", None)
    assert _adapted(epochs=5, data="x.parquet", schema="s.toml") == (8, 0, False, "dot", None)
    # None: the rule's own 1 - 1/trainers
    assert rule_for(TrainConfig().adapted().sync, 2, "bmuf").eta == 0.5


def test_val_share_turns_on_validation_stopping_decay_and_dot_cat():
    assert VALIDATIONS_PER_EPOCH == 4 and PATIENCE_EPOCHS == 3
    assert _adapted(val_share=0.1) == (4, 12, True, "dot+cat", 0.75)
    # the patience is counted in epochs: 3 epochs of the validations asked for
    assert _adapted(val_share=0.1, eval_points=2) == (2, 6, True, "dot+cat", 0.75)


def test_val_share_block_momentum_is_one_minus_one_over_twice_the_trainers():
    for trainers, eta in ((2, 0.75), (4, 0.875), (8, 0.9375)):
        cfg = TrainConfig(val_share=0.1, trainers=trainers).adapted()
        rule = rule_for(cfg.sync, trainers, "bmuf")
        assert isinstance(rule, BlockwiseModelUpdateFiltering) and rule.eta == eta
        # each block update is carried on 1/(1 - eta) = 2N times: twice the 1/N it lacks
        assert 1 / (1 - rule.eta) == 2 * trainers


@pytest.mark.parametrize("options, expected", [
    ({"early_stop": 0}, (4, 0, True, "dot+cat", 0.75)),  # 0: every epoch
    ({"early_stop": 5}, (4, 5, True, "dot+cat", 0.75)),
    ({"lr_decay_on_plateau": False, "interaction": "dot"}, (4, 12, False, "dot", 0.75)),
    ({"sync": "bsp"}, (4, 0, True, "dot+cat", 0.75)),  # workers under bsp cannot stop early
    ({"block_momentum": 0.5}, (4, 12, True, "dot+cat", 0.5)),
])
def test_what_is_given_wins(options, expected):
    assert _adapted(val_share=0.1, **options) == expected


def test_adapting_twice_changes_nothing_and_left_open_options_print_as_left_open():
    once = TrainConfig(val_share=0.1).adapted()
    assert once.adapted() == once
    printed = config_to_toml(TrainConfig(val_share=0.1))
    assert "interaction" not in printed and "early_stop" not in printed
    assert "block_momentum" not in printed
    assert 'interaction = "dot+cat"' in config_to_toml(once)  # what a run writes


def test_help_says_what_val_share_changes():
    # wide: argparse wraps lines at hyphens too (--lr-decay-floor)
    p = argparse.ArgumentParser(
        formatter_class=lambda prog: argparse.HelpFormatter(prog, width=10_000))
    add_config_arguments(p)
    text = " ".join(p.format_help().split())
    assert "changes the defaults of --eval-points (4 an epoch), --early-stop" in text
    assert "(default: dot+cat with --val-share, else dot)" in text
    assert "(default: on with --val-share)" in text
    assert "with --val-share 1 - 1/(2 x trainers)" in text
    assert ("--block-momentum (1 - 1/(2 x trainers)), --batch-size (256 / trainers), "
            "--lr (0.025), --lr-decay-floor (0.1), --embedding-weight-decay (1e-3, fixed "
            "tables), --sync-interval (20steps) and --weight-average-from (3)") in text
    assert ("(default: 3 with --val-share and fixed tables, but not under --sync bsp / asp / "
            "switch, whose dense servers train the model; 0: no average)") in text
    assert "(default: 0, off; 1e-3 with --val-share on fixed tables)" in text
    assert "(default: 0.3; 0.1 with --val-share)" in text
    assert "(default: 0.05; 0.025 with --val-share; either x sqrt(trainers)" in text
    assert "the default, 20steps with" in text
    assert "rounded down, so that each trainer takes as many steps an epoch as one" in text


def test_without_val_share_every_step_reads_256_examples_from_the_start():
    assert BATCH_SIZE == 256
    for options in ({}, {"trainers": 4}, {"epochs": 5, "data": "x.parquet"}):
        cfg = TrainConfig(**options)
        # known before `adapted`: code that reads the synthetic job's raw config sees it
        assert cfg.optim.batch_size == 256 and cfg.adapted().optim.batch_size == 256
    assert 'batch_size = 256' in config_to_toml(TrainConfig())


@pytest.mark.parametrize("trainers, batch", [(1, 256), (2, 128), (3, 85), (4, 64), (8, 32),
                                             (300, 1)])
def test_val_share_divides_the_batch_among_the_trainers(trainers, batch):
    cfg = TrainConfig(val_share=0.1, trainers=trainers)
    assert cfg.optim.batch_size is None  # left open until the job's options are resolved
    adapted = cfg.adapted()
    assert adapted.optim.batch_size == batch and adapted.adapted() == adapted
    # the trainers' steps together read at most 256 examples, and a larger batch would not
    assert trainers * batch <= 256 < trainers * (batch + 1) or batch == 1


def test_a_given_batch_size_wins_over_the_adapted_one():
    assert TrainConfig(val_share=0.1, trainers=2, batch_size=256).adapted().optim.batch_size == 256
    assert TrainConfig(val_share=0.1, trainers=2, batch_size=64).adapted().optim.batch_size == 64
    with pytest.raises(Exception, match="--batch-size"):
        TrainConfig(val_share=0.1, batch_size=0)


def test_val_share_paces_background_rounds_by_worker_steps():
    assert VALIDATED_SYNC_STEPS == 20
    # without --val-share: the CPU budget's pace, known before `adapted`
    assert str(TrainConfig().sync.interval) == "auto"
    assert TrainConfig().adapted().sync.interval == SyncInterval(None)
    cfg = TrainConfig(val_share=0.1)
    assert cfg.sync.interval is None  # left open until the job's options are resolved
    adapted = cfg.adapted()
    assert adapted.sync.interval.steps == 20 and adapted.adapted() == adapted
    assert 'interval = "20steps"' in config_to_toml(adapted)  # what a run writes
    for given in ("0.1", "auto", "5steps"):  # a given pace wins
        assert str(TrainConfig(val_share=0.1, sync_interval=given).adapted().sync.interval) \
            == given


def test_val_share_halves_the_dense_rate_and_lowers_the_decay_floor():
    assert (LR, DECAY_FLOOR) == (0.05, 0.3)
    assert (VALIDATED_LR, VALIDATED_DECAY_FLOOR) == (0.025, 0.1)
    # without --val-share: the synthetic job's rates, known before `adapted`
    for cfg in (TrainConfig(), TrainConfig().adapted()):
        assert (cfg.optim.lr, cfg.optim.lr_decay_floor) == (0.05, 0.3)
    cfg = TrainConfig(val_share=0.1)
    # left open until the job's options are resolved
    assert cfg.optim.lr is None and cfg.optim.lr_decay_floor is None
    adapted = cfg.adapted()
    assert (adapted.optim.lr, adapted.optim.lr_decay_floor) == (0.025, 0.1)
    assert adapted.adapted() == adapted
    assert LrSchedule.of(adapted.optim).over(100).decay(100) == pytest.approx(0.1)
    for given in (0.0, 0.3, 1.0):  # a given value wins
        given_cfg = TrainConfig(val_share=0.1, lr_decay_floor=given, lr=given + 0.5).adapted()
        assert (given_cfg.optim.lr, given_cfg.optim.lr_decay_floor) == (given + 0.5, given)
    with pytest.raises(Exception, match="--lr-decay-floor"):
        TrainConfig(val_share=0.1, lr_decay_floor=1.5)
    with pytest.raises(Exception, match="--lr must be"):
        TrainConfig(val_share=0.1, lr=0)


def test_averaging_without_block_momentum_raises_the_open_dense_rate_by_root_trainers():
    """s-ma, s-easgd, fr-ma and fr-easgd on Adagrad: LR x sqrt(N) (with --val-share,
    VALIDATED_LR x sqrt(N)); BMUF, DDP, none, SGD, --sync-groups and a given --lr: as they
    were."""
    for sync in ("s-ma", "s-easgd", "fr-ma", "fr-easgd"):
        for n in (2, 4):
            assert TrainConfig(sync=sync, trainers=n).optim.lr == pytest.approx(LR * n ** 0.5)
            validated = TrainConfig(sync=sync, trainers=n, val_share=0.1).adapted()
            assert validated.optim.lr == pytest.approx(VALIDATED_LR * n ** 0.5)
        assert TrainConfig(sync=sync, lr=0.05).optim.lr == 0.05
        assert TrainConfig(sync=sync, optimizer="sgd").optim.lr == LR
    for sync in ("s-bmuf", "fr-bmuf", "ddp", "none", "torch-fr-ma"):
        assert TrainConfig(sync=sync).optim.lr == LR
    assert TrainConfig(sync="s-ma", sync_groups=["top=s-bmuf"]).optim.lr == LR
    # a copy made with another --sync or --trainers gets that config's open rate; a rate
    # that was given stays
    assert config_from_options(sync="s-ma").optim.lr == pytest.approx(LR * 2 ** 0.5)
    assert config_from_options(sync="s-ma", lr=LR).optim.lr == LR
    assert dataclasses.replace(TrainConfig(sync="s-ma"), trainers=4).optim.lr == 2 * LR
    assert dataclasses.replace(TrainConfig(sync="s-ma"), sync="s-bmuf").optim.lr == LR
    assert dataclasses.replace(TrainConfig(lr=0.3), sync="s-ma").optim.lr == 0.3


def test_val_share_decays_the_single_ids_rows_of_fixed_tables_only():
    def decay(**options: object) -> object:
        cfg = TrainConfig(**options).adapted()
        return cfg.optim.table_optimizer([False, True, False])["weight_decay"]

    assert decay() == [0.0, 0.0, 0.0]  # the synthetic job: no decay
    assert decay(val_share=0.1, data="x.parquet") == [1e-3, 0.0, 1e-3]
    assert decay(val_share=0.1, data="x.parquet", embedding_weight_decay=0.01,
                 multi_hot_weight_decay=1e-4) == [0.01, 1e-4, 0.01]  # as given
    dynamic = TrainConfig(val_share=0.1, data="x.parquet", tables="dynamic").adapted()
    assert dynamic.optim.table_optimizer()["weight_decay"] == 0.0  # one pool, words too
