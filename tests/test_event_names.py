"""Event names are identifiers (snake_case), so `launch.log` can be filtered by event; the
sentence for people goes in a field (``text``, which the console shows in the name's place).
Read from the source: every logging call in `ups` whose first argument is the event."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CHECKED = ["ups"]
"""Everything ups emits."""

_LEVELS = {"debug", "info", "warning", "error", "exception", "critical", "msg", "log"}
_LOGGER = re.compile(r"(^|\.)_?log(ger)?$|get_logger\(")
_EVENT = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*")


def _events(path: Path) -> list[tuple[int, str]]:
    found = []
    tree = ast.parse(path.read_text())
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _is_getattr_of_logger(node.func):
            found.append((node.lineno, _name(node.args[0] if node.args else None, node)))
            continue
        method = node.func if isinstance(node, ast.Call) else node
        if not isinstance(method, ast.Attribute) or method.attr not in _LEVELS:
            continue
        if not _LOGGER.search(ast.unparse(method.value)):
            continue
        if not isinstance(node, ast.Call):
            if id(node) not in called:  # `level = log.info; level(...)`: unreadable here
                found.append((node.lineno, f"<{ast.unparse(node)} called indirectly>"))
            continue
        args = node.args[1:] if method.attr == "log" else node.args  # log.log(level, event)
        found.append((node.lineno, _name(args[0] if args else None, node)))
    return found


def _is_getattr_of_logger(func: ast.expr) -> bool:
    """``getattr(log, level)``, called with the event: how a level chosen at run time reads."""
    return (
        isinstance(func, ast.Call)
        and isinstance(func.func, ast.Name)
        and func.func.id == "getattr"
        and bool(func.args)
        and bool(_LOGGER.search(ast.unparse(func.args[0])))
    )


def _name(first: ast.expr | None, call: ast.Call) -> str:
    return str(first.value) if isinstance(first, ast.Constant) else ast.unparse(first or call)


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


def test_the_reader_sees_every_way_an_event_is_logged(
    tmp_path: Path,
) -> None:
    """An f-string event, ``log.log(level, event)``, ``getattr(log, level)(event)`` and a
    logger method passed around (whose event the source cannot show) are all read, and
    only the identifier passes."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        'log.info(f"run {x}", x=1)\n'
        'log.log(30, "run_ended", text="run failed")\n'
        "level = log.warning\n"
        'level("run ended")\n'
        'getattr(log, "error")("outcome written", path="p")\n'
    )
    events = _events(bad)
    assert sorted(events) == [
        (1, "f'run {x}'"),
        (2, "run_ended"),
        (3, "<log.warning called indirectly>"),
        (5, "outcome written"),
    ]
    assert [name for _, name in events if _EVENT.fullmatch(name)] == ["run_ended"]
