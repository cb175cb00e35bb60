"""Typed run configuration, filled from defaults, then a TOML file, then the command line.

`TrainConfig` (`train.py`) holds one section per part of the job (`sections.py`); the flags,
TOML keys and keyword options users write are derived from the sections (`options.py`).
"""

from shadowsync.config.options import (
    OPTIONS,
    add_config_arguments,
    config_from_options,
    config_to_dict,
    config_to_toml,
    default_out_dir,
    flat_options,
    load_config,
)
from shadowsync.config.plain import model_name
from shadowsync.config.sections import (
    DLRM,
    HELP_ORDER,
    SECTIONS,
    TESTING,
    CheckpointConfig,
    ClusterConfig,
    DataConfig,
    ModelConfig,
    OptimConfig,
    OutputConfig,
    SwitchConfig,
    SyncConfig,
    TestingConfig,
)
from shadowsync.config.train import FLAT, RunRecord, TrainConfig, unknown_option
from shadowsync.spec.tasks import TASK_CHOICES

__all__ = [
    "DLRM", "FLAT", "HELP_ORDER", "OPTIONS", "SECTIONS", "TASK_CHOICES", "TESTING",
    "CheckpointConfig", "ClusterConfig", "DataConfig", "ModelConfig", "OptimConfig",
    "OutputConfig", "RunRecord", "SwitchConfig", "SyncConfig", "TestingConfig", "TrainConfig",
    "add_config_arguments", "config_from_options", "config_to_dict", "config_to_toml",
    "default_out_dir", "flat_options", "load_config", "model_name", "unknown_option",
]
