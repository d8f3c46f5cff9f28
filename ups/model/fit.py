"""Whether the model config fits the tasks' grids: pure logic on their sizes, no torch.

``ups launch`` asks before anything starts (``ups.train.startcheck``) and
:func:`ups.model.build_model` asks again, so both refuse with the same words.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from ups.config import ModelConfig


class Grid(Protocol):
    """A task's name and grid sizes (a ``TaskShape`` or the data's ``TaskInfo``)."""

    @property
    def name(self) -> str: ...
    @property
    def spatial(self) -> tuple[int, ...]: ...


def model_problems(grids: Iterable[Grid], cfg: ModelConfig) -> list[str]:
    """Every way the model config does not fit the tasks' grids (empty when it fits)."""
    problems = []
    for grid in grids:
        key, patch = ("model.patch_1d", cfg.patch_1d)
        if len(grid.spatial) == 2:
            key, patch = ("model.patch_2d", cfg.patch_2d)
        elif len(grid.spatial) != 1:
            problems.append(f"task {grid.name!r}: {len(grid.spatial)}-D grids are not supported")
            continue
        bad = [size for size in grid.spatial if size % patch]
        if bad:
            problems.append(
                f"{key}={patch} does not divide task {grid.name!r}'s grid {grid.spatial} "
                "(after reduced_resolution); pick a divisor or change reduced_resolution"
            )
    return problems
