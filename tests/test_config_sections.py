"""TrainConfig is made of sections; flat option names are still accepted wherever users
write them (flags, keywords, flat TOML files, checkpoints written before sections)."""

import argparse
import dataclasses
import json

import pytest

from shadowsync.checkpoint.store import CONFIG, FORMAT, MANIFEST, saved_config
from shadowsync.config import (
    ClusterConfig,
    SyncConfig,
    TrainConfig,
    add_config_arguments,
    config_from_options,
    config_to_dict,
    config_to_toml,
    load_config,
)
from shadowsync.errors import UserError

# The options of the version before sections, in its order: each must stay a flag.
FLAT_OPTIONS = [
    "task", "data", "schema", "eval_data", "examples", "epochs", "val_share", "early_stop",
    "weight_average_from", "skip_bad_lines", "buckets", "no_buckets", "seed", "model",
    "embedding_dim", "table_size",
    "tables", "admit_after",
    "evict", "table_memory", "bottom_mlp", "top_mlp",
    "id_bias", "interaction", "optimizer", "lr", "embedding_lr", "embedding_initial_accumulator",
    "multi_hot_initial_accumulator",
    "embedding_weight_decay", "multi_hot_weight_decay", "warmup_steps", "lr_decay_share",
    "lr_decay_floor",
    "lr_decay_on_plateau", "batch_size", "workers", "trainers", "embedding_servers",
    "dense_servers", "row_split_limit", "embedding_transport", "prefetch", "embedding_placement",
    "sync", "sync_groups",
    "sync_interval", "sync_budget", "sync_every", "sync_dtype", "sync_transport", "write_back",
    "block_momentum", "block_lr", "nesterov", "elastic_alpha", "sync_warmup_rounds", "momentum",
    "switch_plan",
    "switch_momentum", "switch_scale_lr", "switch_compensate_momentum", "switch_policy",
    "switch_detector", "switch_patience", "switch_at", "job_name", "straggler_fallback",
    "straggler", "addr", "port", "rpc_port", "out", "log_every", "eval_points", "progress",
    "log_level", "checkpoint_every", "keep_checkpoints", "checkpoint_dir", "max_restarts",
    "resume", "warm_start", "on_divergence", "inject_nan_at", "tensorboard",
]

# What the version before sections wrote as a checkpoint's config.toml (before id_bias
# existed, so without it: such a run had no id bias).
OLD_FLAT_TOML = """\
task = "ctr"
data = "synthetic"
epochs = 1
val_share = 0.0
skip_bad_lines = false
seed = 0
model = "dlrm"
embedding_dim = 16
table_size = [10, 20]
bottom_mlp = [64]
top_mlp = [128, 64]
optimizer = "adagrad"
lr = 0.1
embedding_lr = 0.2
embedding_initial_accumulator = 0.05
embedding_weight_decay = 0.0
warmup_steps = 300
lr_decay_share = 0.3
lr_decay_floor = 0.3
lr_decay_on_plateau = false
batch_size = 256
workers = 1
trainers = 3
embedding_servers = 1
row_split_limit = 1000000
embedding_transport = "auto"
sync = "s-ma"
sync_groups = []
sync_interval = "auto"
sync_budget = 0.03
sync_every = 20
sync_dtype = "fp32"
sync_transport = "auto"
write_back = "delta"
block_lr = 1.0
nesterov = false
elastic_alpha = 0.5
momentum = 0.9
switch_plan = "bsp:0.1,asp"
switch_momentum = "keep"
switch_scale_lr = true
switch_compensate_momentum = false
switch_policy = "plan"
switch_detector = "k=1.5,m=3,window=5"
addr = "127.0.0.1"
out = "runs/old"
log_every = 50000
eval_points = 8
progress = false
log_level = "info"
checkpoint_every = "300s"
keep_checkpoints = 2
max_restarts = 3
on_divergence = "stop"
tensorboard = false
"""


def parse(argv):
    p = argparse.ArgumentParser()
    add_config_arguments(p)
    return load_config(p.parse_args(argv))


def test_every_flag_of_the_flat_version_is_still_a_flag():
    p = argparse.ArgumentParser()
    add_config_arguments(p)
    flags = {s for a in p._actions for s in a.option_strings if s.startswith("--")}
    assert {f"--{name.replace('_', '-')}" for name in FLAT_OPTIONS} <= flags
    assert set(config_to_dict(TrainConfig())) == set(FLAT_OPTIONS)


def test_flags_land_in_their_sections():
    cfg = parse(["--sync", "s-ma", "--sync-every", "7", "--data", "x.tsv", "--model", "m:f",
                 "--out", "o", "--keep-checkpoints", "5", "--switch-plan", "bsp:0.5,asp",
                 "--trainers", "4", "--straggler", "trainer=1,slowdown=2,start=0,duration=1"])
    assert (cfg.sync.mode, cfg.sync.every, cfg.data.path, cfg.model.name) == ("s-ma", 7, "x.tsv",
                                                                              "m:f")
    assert (cfg.output.dir, cfg.checkpoint.keep, str(cfg.switch.plan)) == ("o", 5, "bsp:0.5,asp")
    assert cfg.cluster.trainers == 4 and str(cfg.testing.straggler).startswith("trainer=1")


def test_toml_sections_and_flat_keys_in_one_file(tmp_path):
    f = tmp_path / "job.toml"
    f.write_text('trainers = 3\nsync-interval = 0.5\ndata = "rows.tsv"\n\n'
                 '[sync]\nmode = "s-ma"\nevery = 20\n\n[optim]\nlr = 1\n\n'
                 '[model]\nname = "dlrm"\ntable_size = 50\n\n[checkpoint]\nkeep = 4\n')
    cfg = parse(["--config", str(f), "--sync-every", "30"])
    assert cfg.cluster.trainers == 3 and cfg.data.path == "rows.tsv"
    assert cfg.sync.mode == "s-ma" and cfg.sync.interval.seconds == 0.5
    assert cfg.sync.every == 30  # the command line wins over the file
    assert cfg.optim.lr == 1.0 and isinstance(cfg.optim.lr, float)
    assert cfg.model.table_size == [50] and cfg.checkpoint.keep == 4


@pytest.mark.parametrize("text, message", [
    ("[sync]\nevry = 3\n", r"job.toml: unknown option 'sync.evry'; did you mean 'sync.every'"),
    ("[cluster]\nworkers = \"two\"\n", r"job.toml: option 'cluster.workers' must be int"),
    ("[sync]\nmode = \"fastest\"\n", r"--sync: 'fastest' is not one of"),
    ("[optim]\noptimizer = \"adam\"\n", r"--optimizer: 'adam' is not one of adagrad, sgd"),
    ("[cluser]\nworkers = 2\n", r"job.toml: unknown option 'cluser'; did you mean 'cluster'"),
])
def test_section_mistakes_are_one_line(tmp_path, text, message):
    f = tmp_path / "job.toml"
    f.write_text(text)
    with pytest.raises(UserError, match=message):
        parse(["--config", str(f)])


def test_the_written_toml_has_sections_and_reads_back(tmp_path):
    cfg = TrainConfig(trainers=3, sync="s-easgd", sync_groups=["bottom=s-ma"], lr=0.1,
                      table_size=[10, 20], out="runs/x", progress=False)
    text = config_to_toml(cfg)
    assert "[sync]\nmode = \"s-easgd\"\ngroups = [\"bottom=s-ma\"]" in text
    assert "\n[cluster]\n" in text and "trainers = 3" in text
    f = tmp_path / "job.toml"
    f.write_text(text)
    assert parse(["--config", str(f)]) == cfg


def test_flat_keywords_sections_and_replace_agree():
    flat = TrainConfig(trainers=3, sync="s-ma", sync_every=20)
    sectioned = TrainConfig(cluster=ClusterConfig(trainers=3), sync=SyncConfig(mode="s-ma",
                                                                             every=20))
    assert flat == sectioned == TrainConfig.from_flat(trainers=3, sync="s-ma", sync_every=20)
    assert config_from_options(trainers=3, sync="s-ma", sync_every=20) == flat
    changed = dataclasses.replace(flat, sync_every=7, workers=2)
    assert (changed.sync.every, changed.cluster.workers, changed.sync.mode) == (7, 2, "s-ma")
    assert (flat.sync.every, flat.cluster.workers) == (20, 1)  # the original is untouched
    # a flat option named as its section (--data, --model, --sync) changes only that option
    moved = dataclasses.replace(changed, sync="s-bmuf", data="rows.tsv", model="m:f")
    assert (moved.sync.mode, moved.sync.every, moved.cluster.workers) == ("s-bmuf", 7, 2)
    assert (moved.data.path, moved.model.name, changed.data.path) == ("rows.tsv", "m:f",
                                                                      "synthetic")
    with pytest.raises(UserError, match="--sync-every must be positive"):
        dataclasses.replace(flat, sync_every=0)
    with pytest.raises(UserError, match="unknown option 'wokers'; did you mean 'workers'"):
        config_from_options(wokers=2)


def test_a_flat_read_says_where_the_option_went():
    with pytest.raises(AttributeError, match=r"cfg\.cluster\.trainers"):
        getattr(TrainConfig(), "trainers")  # noqa: B009


def test_a_checkpoint_written_before_sections_loads(tmp_path):
    step = tmp_path / "run" / "checkpoint" / "step-1000"
    step.mkdir(parents=True)
    (step / MANIFEST).write_text(json.dumps({"format": FORMAT, "step": 1000}))
    (step / CONFIG).write_text(OLD_FLAT_TOML)
    cfg = saved_config(step)
    assert (cfg.sync.mode, cfg.sync.every, cfg.cluster.trainers) == ("s-ma", 20, 3)
    assert cfg.model.table_size == [10, 20] and cfg.optim.lr == 0.1
    assert cfg.model.id_bias is False  # predates the option: such runs had no id bias
    assert cfg.output.dir == "runs/old" and cfg.output.progress is False
    # a checkpoint holds resolved options: what --val-share adapts is filled in
    # its recorded --sync-budget (then the default) is kept, not today's default
    assert cfg == TrainConfig(trainers=3, sync="s-ma", sync_every=20, table_size=[10, 20],
                              lr=0.1, out="runs/old", progress=False, id_bias=False,
                              sync_budget=0.03).adapted()
