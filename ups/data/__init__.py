"""PDEBench data: file checks and one-step pair datasets, demo data synthesis, sharded loaders.

The loaders and datasets need torch; :mod:`ups.data.layouts` (the file checks) does not,
so they are imported on first use and ``ups launch`` checks data files without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ups.data.layouts import DataError, TaskInfo, inspect_task
    from ups.data.loader import MultiTaskLoader, ShardedSampler, build_eval_loader, build_loader
    from ups.data.pdebench import PDEBenchDataset

_HOME = {
    "DataError": "ups.data.layouts",
    "TaskInfo": "ups.data.layouts",
    "inspect_task": "ups.data.layouts",
    "MultiTaskLoader": "ups.data.loader",
    "ShardedSampler": "ups.data.loader",
    "build_eval_loader": "ups.data.loader",
    "build_loader": "ups.data.loader",
    "PDEBenchDataset": "ups.data.pdebench",
}

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


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'ups.data' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)
