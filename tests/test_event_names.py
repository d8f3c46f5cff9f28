"""Event names are identifiers (snake_case), so `launch.log` can be filtered by event; the
sentence for people goes in a field. Read from the source: every logging call whose first
argument is the event, in the packages listed below."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CHECKED = ["ups/deploy", "ups/preflight"]
"""Packages whose events follow the rule (the trainer's already do; ups/launch's prose
events are still to convert)."""

_LEVELS = {"debug", "info", "warning", "error", "exception", "critical", "msg"}
_LOGGER = re.compile(r"(^|\.)_?log(ger)?$|get_logger\(")
_EVENT = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*")


def _events(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in _LEVELS or not _LOGGER.search(ast.unparse(node.func.value)):
            continue
        first = node.args[0] if node.args else None
        name = first.value if isinstance(first, ast.Constant) else ast.unparse(first or node)
        found.append((node.lineno, str(name)))
    return found


@pytest.mark.parametrize("package", CHECKED)
def test_every_event_name_is_snake_case(package: str) -> None:
    events = [
        (f"{path.relative_to(REPO)}:{line}", name)
        for path in sorted((REPO / package).rglob("*.py"))
        for line, name in _events(path)
    ]
    assert events, f"no log calls found in {package}: the reader is broken"
    bad = [f"{where}: {name!r}" for where, name in events if not _EVENT.fullmatch(name)]
    assert not bad, "event names must be snake_case identifiers:\n" + "\n".join(bad)


def test_the_reader_sees_a_prose_event(tmp_path: Path) -> None:
    """The check can fail: a sentence as the event name is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text('log.warning("ssh connect failed, retrying", host="h")\n')
    assert _events(bad) == [(1, "ssh connect failed, retrying")]
    assert not _EVENT.fullmatch(_events(bad)[0][1])
