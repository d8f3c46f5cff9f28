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

from ups.config.checks import DataCheck, file_problems, unknown_key
from ups.config.schema import Config

_FIX_KEYS = "Fix the keys above in the YAML file or the --set overrides and run again."


class ConfigError(ValueError):
    """The run config is invalid; the message lists every problem with its key path."""

    def __init__(self, source: str, problems: Sequence[str], fix: str = _FIX_KEYS) -> None:
        self.source = source
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        count = f"{len(self.problems)} problem(s)"
        super().__init__(f"invalid config {source}: {count}\n{lines}\n{fix}")


class ConfigFileError(ConfigError):
    """The config file itself cannot be read or parsed: no key is wrong yet."""

    def __init__(self, source: str, problem: str, fix: str) -> None:
        self.source = source
        self.problems = [problem]
        ValueError.__init__(self, f"config file {source}: {problem}. {fix}")


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
            msg = unknown_key(e["loc"])
        elif e["type"] == "value_error":
            msg = msg.removeprefix("Value error, ")
        elif "input" in e and e["type"] != "missing":
            shown = repr(e["input"])
            msg = f"{msg} (got {shown[:60]})"
        problems.append(f"{loc}: {msg}")
    return problems


def _read(path: str | Path) -> dict[str, Any]:
    """The file's YAML mapping. Raises :class:`ConfigFileError`."""
    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        if isinstance(exc, FileNotFoundError):
            fix = "Check the path; the shipped run configs are in configs/ (configs/demo.yaml)."
        elif isinstance(exc, IsADirectoryError):
            fix = "Give the path of a run config YAML file in it, e.g. configs/demo.yaml."
        else:
            fix = "Make it readable by this user, or copy it somewhere that is."
        raise ConfigFileError(source, f"cannot read it ({why})", fix) from None
    try:
        data = _yaml_load(text)
    except yaml.YAMLError as exc:
        raise ConfigFileError(
            source, f"not valid YAML: {' '.join(str(exc).split())}", "Fix the syntax there."
        ) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigFileError(
            source,
            f"expected a mapping of sections (run:, tasks:, training: ...), got a "
            f"{type(data).__name__}",
            "See configs/demo.yaml for the shape of a run config.",
        )
    return data


def load_config(
    path: str | Path,
    overrides: Iterable[str] = (),
    *,
    check_files: bool = True,
    check_data: DataCheck | None = None,
) -> Config:
    """Read, override and validate a run config. Raises :class:`ConfigError` listing every
    problem: bad overrides, the schema's, and (``check_files``) the data files and the
    cache directory, whatever else is wrong; ``check_data`` also opens each data file that
    exists and checks it against its layout."""
    source = str(path)
    data = _read(path)
    problems = [p for key, value in parse_overrides(overrides) if (p := _apply(data, key, value))]
    if problems:
        raise ConfigError(source, problems)
    cfg: Config | None = None
    try:
        cfg = Config.model_validate(data)
    except ValidationError as err:
        problems = _format_errors(err)
    problems += file_problems(data, check_files=check_files, check_data=check_data)
    if problems or cfg is None:
        raise ConfigError(source, problems)
    return cfg
