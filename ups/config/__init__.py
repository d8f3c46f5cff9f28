"""Typed run configuration: one YAML file per run, validated before anything starts."""

from ups.config.checks import DataCheck
from ups.config.load import ConfigError, ConfigFileError, load_config, parse_overrides
from ups.config.schema import (
    CacheConfig,
    CheckpointConfig,
    Config,
    DistributedConfig,
    FaultConfig,
    ModelConfig,
    RunConfig,
    TaskConfig,
    TrainingConfig,
    WandbConfig,
)

__all__ = [
    "CacheConfig",
    "CheckpointConfig",
    "Config",
    "ConfigError",
    "ConfigFileError",
    "DataCheck",
    "DistributedConfig",
    "FaultConfig",
    "ModelConfig",
    "RunConfig",
    "TaskConfig",
    "TrainingConfig",
    "WandbConfig",
    "load_config",
    "parse_overrides",
]
