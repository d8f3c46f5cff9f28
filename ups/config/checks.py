"""The config problems beyond the schema: near-miss keys, and the files a config names.

They are found from the raw YAML data too, so a config whose other sections fail the
schema still gets its missing data file reported in the same error (``load_config``).
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Callable, Sequence
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from ups.config.schema import CacheConfig, Config, TaskConfig

DataCheck = Callable[[TaskConfig], object]
"""Opens a task's file and raises ``ValueError`` naming what does not match its layout
(``ups.data.pdebench.inspect_task``); passed in, so this package never imports torch."""


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model inside ``X``, ``list[X]`` or ``X | None``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (list, Union, types.UnionType):
        for arg in get_args(annotation):
            if (model := _model_in(arg)) is not None:
                return model
    return None


def _section(loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The model that holds the key at ``loc`` (``("training", "bach_size")`` -> training's)."""
    model: type[BaseModel] | None = Config
    for part in loc[:-1]:
        if isinstance(part, int) or model is None:
            continue  # a list index: the list's item model is already the current one
        field = model.model_fields.get(part)
        model = _model_in(field.annotation) if field is not None else None
    return model


def unknown_key(loc: Sequence[int | str]) -> str:
    """Why ``loc`` was refused, with the key it most likely meant."""
    model = _section(loc)
    names = list(model.model_fields) if model is not None else []
    close = difflib.get_close_matches(str(loc[-1]), names, n=1, cutoff=0.6)
    if close:
        meant = ".".join([*map(str, loc[:-1]), close[0]])
        return f"unknown key; did you mean {meant}?"
    where = ".".join(map(str, loc[:-1])) or "the top level"
    return f"unknown key (the keys of {where} are: {', '.join(names)})"


def _valid_tasks(data: dict[str, Any]) -> list[tuple[int, TaskConfig]]:
    """The tasks that pass the schema on their own, with their index."""
    found = []
    tasks = data.get("tasks")
    for i, raw in enumerate(tasks if isinstance(tasks, list) else []):
        try:
            found.append((i, TaskConfig.model_validate(raw)))
        except ValidationError:
            continue  # its own problems come from the schema
    return found


def file_problems(
    data: dict[str, Any], *, check_files: bool = True, check_data: DataCheck | None = None
) -> list[str]:
    """Duplicate task names; with ``check_files`` missing data files, files that do not
    match their layout (with ``check_data``) and a missing cache directory. From the raw
    config data, so the rest of the config need not be valid."""
    problems = []
    seen: set[str] = set()
    for i, task in _valid_tasks(data):
        if task.name in seen:
            problems.append(f"tasks.{i}.name: duplicate task name {task.name!r}")
        seen.add(task.name)
        if not check_files:
            continue
        if not task.path.is_file():
            problems.append(
                f"tasks.{i}.path: data file {str(task.path)!r} does not exist "
                "(run `ups data synth` for the demo data, or fix the path)"
            )
        elif check_data is not None:
            try:
                check_data(task)
            except ValueError as exc:
                problems.append(f"tasks.{i}.path ({task.name}): {exc}")
    if not check_files:
        return problems
    try:
        cache = CacheConfig.model_validate(data.get("cache", {}))
    except ValidationError:
        return problems
    if cache.enabled and not cache.dir.is_dir():
        problems.append(
            f"cache.dir: cache directory {str(cache.dir)!r} does not exist "
            "(build it with `ups cache build CONFIG` or set cache.enabled=false)"
        )
    return problems
