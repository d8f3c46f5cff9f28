"""The order the side-by-side workers take tests in: the longest first.

``scripts/test.sh`` runs pytest-xdist with ``--dist loadgroup``: each test is a unit of work
of its own, except tests marked ``xdist_group`` (a module whose module-scoped fixture is
expensive: a private Docker engine, three training runs shared by every test), which stay
together on one worker. A worker takes the next unit when it runs out, so the run ends
when its last unit does: a 150 s test started last adds 150 s to the wall time. Units are
therefore handed out longest first (longest-processing-time scheduling), from the
durations a previous full run measured (``tests/durations.json``). A test that is not in
the file yet counts as :data:`UNKNOWN_S`, so new tests run early rather than last.

``pytest --store-durations`` (``make test-durations``) updates the file from the run it
ends: each test's setup, call and teardown summed, rounded to a tenth of a second; tests
the run did not measure keep their entry while their file exists.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

DURATIONS = Path(__file__).with_name("durations.json")
UNKNOWN_S = 30.0
"""Seconds assumed for a test the file does not know: longer than most, so it runs early."""

_measured: dict[str, float] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--store-durations",
        action="store_true",
        help=f"write each test's measured seconds to {DURATIONS.name} (the order of the next "
        "side-by-side run)",
    )


def unit_of(item: pytest.Item) -> str:
    """The unit of work xdist's ``loadgroup`` hands out: the group, else the test itself."""
    mark = item.get_closest_marker("xdist_group")
    if mark is None:
        return item.nodeid
    return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))


def longest_first(items: list[Any], seconds: dict[str, float]) -> list[Any]:
    """``items`` with their units ordered by total seconds, longest first (stable, and the
    tests of one unit kept in their collected order)."""
    totals: dict[str, float] = {}
    for item in items:
        unit = unit_of(item)
        totals[unit] = totals.get(unit, 0.0) + seconds.get(item.nodeid, UNKNOWN_S)
    rank = {unit: i for i, unit in enumerate(sorted(totals, key=lambda u: -totals[u]))}
    return sorted(items, key=lambda item: rank[unit_of(item)])


def _known() -> dict[str, float]:
    try:
        data = json.loads(DURATIONS.read_text())
    except FileNotFoundError:
        return {}
    return {str(k): float(v) for k, v in data.items()}


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Reorder for the workers (every worker collects, and gets the same order)."""
    if getattr(config.option, "dist", "no") != "no" or hasattr(config, "workerinput"):
        items[:] = longest_first(items, _known())


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when in ("setup", "call", "teardown"):
        _measured[report.nodeid] = _measured.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if not config.getoption("store_durations") or hasattr(config, "workerinput"):
        return  # the controller (or a run without xdist) writes it, once
    merged = _known()
    merged.update({k: round(v, 1) for k, v in _measured.items()})
    root = Path(str(config.rootpath))
    kept = {k: v for k, v in merged.items() if (root / k.split("::")[0]).exists()}
    DURATIONS.write_text(json.dumps(kept, indent=1, sort_keys=True) + "\n")
