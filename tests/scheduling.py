"""The order the side-by-side workers take tests in: the longest first, once it can start.

``scripts/test.sh`` runs pytest-xdist with ``--dist loadgroup``: each test is a unit of work
of its own, except tests marked ``xdist_group`` (a module whose module-scoped fixture is
expensive: a private Docker engine, three training runs shared by every test), which stay
together on one worker. A worker takes the next unit when it runs out, so the run ends
when its last unit does: a 150 s test started last adds 150 s to the wall time. Units are
therefore handed out longest first (longest-processing-time scheduling), from the
durations a previous full run measured (``tests/durations.json``). A test that is not in
the file yet counts as :data:`UNKNOWN_S`, so new tests run early rather than last.

A unit that needs an install scripts/test.sh runs in the background (tests/background.py:
sshd, the Docker engine and image, Slurm) cannot start before that install ends: a worker
given it early would wait idle. :func:`schedule` therefore plays the run through with the
workers' count: each worker, when free, takes the longest unit that can start by then,
and only when none can, the one that can start first.

``pytest --store-durations`` (``make test-durations``) updates the file from the run it
ends: each test's setup, call and teardown summed, rounded to a tenth of a second; the
entries of files the run did not measure stay while the file exists (those of a file it
measured are replaced: a renamed test leaves no stale entry); each background job's
seconds from being asked for to its end, as ``scripts/test.sh::background[NAME]``, when
the run waited for it.

At the end of a run the terminal summary lists the slowest tests, each with its seconds
and the CPU seconds of its own processes (the test, its torchrun ranks, sshd sessions;
not containers, whose processes the engine starts); scripts/test.sh prints them in its
closing report.

``UPS_TEST_TIMELINE=DIR`` makes each worker append one JSON line per test to
``DIR/<worker pid>.jsonl`` (its node id, start and end): with the kernel's process
accounting, ``scripts/cpu_by_test.py`` then charges every process of the run, containers
and FAKE instances included, to the test it belongs to.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.background import expected_ready_s, job_dir, needs, took_s

DURATIONS = Path(__file__).with_name("durations.json")
UNKNOWN_S = 30.0
"""Seconds assumed for a test the file does not know: longer than most, so it runs early."""
JOB_KEY = "scripts/test.sh::background[{}]"
"""The durations.json key of a background job's seconds."""
SLOWEST = 15
"""How many of the slowest tests the terminal summary lists."""

_measured: dict[str, float] = {}
_cpu: dict[str, float] = {}
_cpu_at_setup: float = 0.0


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """With ``UPS_TEST_TIMELINE=DIR``: when this test ran, on which worker process."""
    timeline = os.environ.get("UPS_TEST_TIMELINE")
    start = time.time()
    try:
        return (yield)
    finally:
        if timeline:
            line = {"pid": os.getpid(), "id": item.nodeid, "start": start, "end": time.time()}
            Path(timeline).mkdir(parents=True, exist_ok=True)  # a new DIR: no internal error
            with open(Path(timeline) / f"{os.getpid()}.jsonl", "a") as f:
                f.write(json.dumps(line) + "\n")


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


def plain(nodeid: str) -> str:
    """A test's id without the ``@group`` xdist's loadgroup appends to a grouped test's (a
    test id has no other ``@``: xdist would read it as a group too)."""
    return nodeid.rsplit("@", 1)[0]


def schedule(
    items: list[Any],
    seconds: dict[str, float],
    workers: int = 1,
    ready_s: Callable[[Any], float] = lambda item: 0.0,
) -> list[Any]:
    """``items`` in the order ``workers`` side-by-side workers should take their units:
    each free worker takes the longest unit that can start by then (``ready_s(item)``:
    seconds from the start until a test can start), else the one that can start first.
    With every test ready at once this is longest first. Stable, and the tests of one unit
    are kept in their collected order."""
    totals: dict[str, float] = {}
    ready: dict[str, float] = {}
    for item in items:
        unit = unit_of(item)
        totals[unit] = totals.get(unit, 0.0) + seconds.get(plain(item.nodeid), UNKNOWN_S)
        ready[unit] = max(ready.get(unit, 0.0), ready_s(item))
    pending = sorted(totals, key=lambda u: -totals[u])
    free = [0.0] * max(1, workers)  # when each worker is free next
    order: list[str] = []
    while pending:
        worker = min(range(len(free)), key=free.__getitem__)
        now = free[worker]
        unit = next((u for u in pending if ready[u] <= now), None)
        if unit is None:
            unit = min(pending, key=lambda u: ready[u])  # the longest of the first ready
        pending.remove(unit)
        order.append(unit)
        free[worker] = max(now, ready[unit]) + totals[unit]
    rank = {unit: i for i, unit in enumerate(order)}
    return sorted(items, key=lambda item: rank[unit_of(item)])


def longest_first(items: list[Any], seconds: dict[str, float]) -> list[Any]:
    """``items`` with their units ordered by total seconds, longest first (stable, and the
    tests of one unit kept in their collected order)."""
    return schedule(items, seconds)


def _known() -> dict[str, float]:
    try:
        data = json.loads(DURATIONS.read_text())
    except FileNotFoundError:
        return {}
    return {str(k): float(v) for k, v in data.items()}


def _workers(config: pytest.Config) -> int:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        return int(workerinput["workercount"])
    count = getattr(config.option, "numprocesses", None)
    return count if isinstance(count, int) and count > 0 else 1


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Reorder for the workers (every worker collects, and gets the same order: what the
    order reads was all written before pytest started)."""
    if getattr(config.option, "dist", "no") != "no" or hasattr(config, "workerinput"):
        known = _known()
        last = {name: known.get(JOB_KEY.format(name), -1.0) for name in _job_names(items)}
        last = {name: s for name, s in last.items() if s >= 0}

        def ready_s(item: pytest.Item) -> float:
            return max((expected_ready_s(n, last) for n in needs(item)), default=0.0)

        items[:] = schedule(items, known, _workers(config), ready_s)


def _job_names(items: list[pytest.Item]) -> set[str]:
    return {name for item in items for name in needs(item)}


def _cpu_now() -> float:
    own, children = (resource.getrusage(w) for w in (resource.RUSAGE_SELF,
                                                      resource.RUSAGE_CHILDREN))  # fmt: skip
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    global _cpu_at_setup
    _cpu_at_setup = _cpu_now()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """The CPU seconds of the test's own processes (this one and every child it waited
    for) ride on the teardown report to the controller."""
    report = yield
    if call.when == "teardown":
        report.user_properties.append(("cpu_s", _cpu_now() - _cpu_at_setup))
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    nodeid = plain(report.nodeid)
    if report.when in ("setup", "call", "teardown"):
        _measured[nodeid] = _measured.get(nodeid, 0.0) + report.duration
    for key, value in report.user_properties:
        if key == "cpu_s":
            _cpu[nodeid] = float(value)


def slowest_lines() -> list[str]:
    """The slowest tests, one line each (seconds, CPU seconds, test), then the sum."""
    slowest = sorted(_measured.items(), key=lambda kv: -kv[1])[:SLOWEST]
    lines = [f"the {len(slowest)} slowest tests (s; CPU s of their processes, containers aside)"]
    for nodeid, seconds in slowest:
        cpu = f"{_cpu[nodeid]:7.1f}" if nodeid in _cpu else "      ?"
        lines.append(f"{seconds:7.1f} {cpu}  {nodeid}")
    total, cpu_total = sum(_measured.values()), sum(_cpu.values())
    lines.append(f"{total:7.1f} {cpu_total:7.1f}  all {len(_measured)} tests together")
    return lines


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The slowest tests, at the end of the output; under scripts/test.sh in its closing
    report instead (a file in its background directory), after pytest's own summary."""
    if hasattr(terminalreporter.config, "workerinput") or not _measured:
        return
    lines = slowest_lines()
    jobs = job_dir()
    if jobs is not None and jobs.is_dir():
        (jobs / "slowest.txt").write_text("\n".join(lines) + "\n")
        return
    terminalreporter.section(lines[0])
    for line in lines[1:]:
        terminalreporter.write_line(line)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if not config.getoption("store_durations") or hasattr(config, "workerinput"):
        return  # the controller (or a run without xdist) writes it, once
    measured_files = {k.split("::")[0] for k in _measured}
    merged = {  # a test gone from a file this run measured is gone (renamed or merged)
        k: v for k, v in _known().items() if k.split("::")[0] not in measured_files
    }
    merged.update({k: round(v, 1) for k, v in _measured.items()})
    merged.update({JOB_KEY.format(name): round(s, 1) for name, s in took_s().items()})
    root = Path(str(config.rootpath))
    kept = {k: v for k, v in merged.items() if (root / k.split("::")[0]).exists()}
    DURATIONS.write_text(json.dumps(kept, indent=1, sort_keys=True) + "\n")
