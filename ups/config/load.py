"""Load a run config from YAML plus ``--set key.path=value`` overrides.

Every problem is collected and raised as one :class:`ConfigError` whose lines each
name the key path, so a user fixes a config in one pass, not one error per run.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ups.config.schema import Config


class ConfigError(ValueError):
    """The run config is invalid; the message lists every problem with its key path."""

    def __init__(self, source: str, problems: Sequence[str]) -> None:
        self.source = source
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(
            f"invalid config {source}: {len(self.problems)} problem(s)\n{lines}\n"
            "Fix the keys above in the YAML file or the --set overrides and run again."
        )


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-4`` as a float (YAML 1.1 wants ``1.0e-4``)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+][0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def _yaml_load(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)


def parse_overrides(items: Iterable[str]) -> list[tuple[list[str | int], Any]]:
    """Parse ``a.b.c=value`` strings; the value is read as YAML (``1e-4``, ``true``, ``[1, 2]``)."""
    parsed: list[tuple[list[str | int], Any]] = []
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError("--set", [f"{item!r}: expected KEY.PATH=VALUE"])
        path: list[str | int] = [int(p) if p.isdigit() else p for p in key.strip().split(".")]
        parsed.append((path, _yaml_load(raw) if raw.strip() else None))
    return parsed


def _apply(data: dict[str, Any], path: list[str | int], value: Any) -> str | None:
    node: Any = data
    dotted = ".".join(map(str, path))
    for i, part in enumerate(path[:-1]):
        nxt = path[i + 1]
        if isinstance(part, int):
            if not isinstance(node, list) or part >= len(node):
                return f"{dotted}: index {part} does not exist"
            node = node[part]
            continue
        if not isinstance(node, dict):
            return f"{dotted}: {'.'.join(map(str, path[:i]))} is not a mapping"
        node = node.setdefault(part, [] if isinstance(nxt, int) else {})
    last = path[-1]
    if isinstance(last, int):
        if not isinstance(node, list) or last >= len(node):
            return f"{dotted}: index {last} does not exist"
        node[last] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        return f"{dotted}: parent is not a mapping"
    return None


def _format_errors(err: ValidationError) -> list[str]:
    problems = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling against ups/config/schema.py)"
        elif e["type"] == "value_error":
            msg = msg.removeprefix("Value error, ")
        elif "input" in e and e["type"] != "missing":
            shown = repr(e["input"])
            msg = f"{msg} (got {shown[:60]})"
        problems.append(f"{loc}: {msg}")
    return problems


def _semantic_problems(cfg: Config, check_files: bool) -> list[str]:
    problems = []
    seen: set[str] = set()
    for i, task in enumerate(cfg.tasks):
        if task.name in seen:
            problems.append(f"tasks.{i}.name: duplicate task name {task.name!r}")
        seen.add(task.name)
        if check_files and not task.path.is_file():
            problems.append(
                f"tasks.{i}.path: data file {str(task.path)!r} does not exist "
                "(run `ups data synth` for the demo data, or fix the path)"
            )
    if cfg.cache.enabled and check_files and not cfg.cache.dir.is_dir():
        problems.append(
            f"cache.dir: cache directory {str(cfg.cache.dir)!r} does not exist "
            "(build it with `ups cache build CONFIG` or set cache.enabled=false)"
        )
    return problems


def load_config(
    path: str | Path, overrides: Iterable[str] = (), *, check_files: bool = True
) -> Config:
    """Read, override and validate a run config. Raises :class:`ConfigError`."""
    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(source, [f"cannot read the file: {exc.strerror}"]) from None
    try:
        data = _yaml_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(source, [f"not valid YAML: {exc}"]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(source, ["(top level): expected a mapping of sections"])
    problems = [p for key, value in parse_overrides(overrides) if (p := _apply(data, key, value))]
    if problems:
        raise ConfigError(source, problems)
    try:
        cfg = Config.model_validate(data)
    except ValidationError as err:
        raise ConfigError(source, _format_errors(err)) from None
    problems = _semantic_problems(cfg, check_files)
    if problems:
        raise ConfigError(source, problems)
    return cfg
