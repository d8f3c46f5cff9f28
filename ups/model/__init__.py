"""The latent operator model: per-task encoders and decoders around a shared transformer.

The model needs torch; :mod:`ups.model.fit` (whether a config fits the data's grids) does
not, so the model is imported on first use and ``ups launch`` checks the fit without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ups.model.fit import model_problems
    from ups.model.operator import LatentOperator, TaskShape, build_model, task_shapes

_HOME = {
    "LatentOperator": "ups.model.operator",
    "TaskShape": "ups.model.operator",
    "build_model": "ups.model.operator",
    "model_problems": "ups.model.fit",
    "task_shapes": "ups.model.operator",
}

__all__ = ["LatentOperator", "TaskShape", "build_model", "model_problems", "task_shapes"]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'ups.model' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)
