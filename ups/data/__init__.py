"""PDEBench data: file checks and one-step pair datasets, demo data synthesis, sharded loaders."""

from ups.data.loader import MultiTaskLoader, ShardedSampler, build_eval_loader, build_loader
from ups.data.pdebench import DataError, PDEBenchDataset, TaskInfo, inspect_task

__all__ = [
    "DataError",
    "MultiTaskLoader",
    "PDEBenchDataset",
    "ShardedSampler",
    "TaskInfo",
    "build_eval_loader",
    "build_loader",
    "inspect_task",
]
