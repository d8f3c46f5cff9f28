"""The latent operator model: per-task encoders and decoders around a shared transformer."""

from ups.model.operator import (
    LatentOperator,
    TaskShape,
    build_model,
    model_problems,
    task_shapes,
)

__all__ = ["LatentOperator", "TaskShape", "build_model", "model_problems", "task_shapes"]
