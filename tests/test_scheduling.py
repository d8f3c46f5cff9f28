"""The order the side-by-side workers take tests in (tests/scheduling.py): longest first."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.scheduling import UNKNOWN_S, longest_first, schedule, unit_of


@dataclass
class _Mark:
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Item:
    nodeid: str
    group: str | None = None

    def get_closest_marker(self, name: str) -> _Mark | None:
        return _Mark((self.group,)) if name == "xdist_group" and self.group else None


def test_units_go_longest_first_and_a_group_counts_as_its_sum() -> None:
    items = [
        _Item("a.py::short"),
        _Item("b.py::one", "engines"),
        _Item("b.py::two", "engines"),
        _Item("c.py::long"),
        _Item("d.py::middle"),
    ]
    seconds = {"a.py::short": 1.0, "b.py::one": 40.0, "b.py::two": 40.0, "c.py::long": 70.0,
               "d.py::middle": 20.0}  # fmt: skip
    order = [i.nodeid for i in longest_first(items, seconds)]
    # the group (80 s in all) before the longest single test (70 s); its tests stay in order
    assert order == ["b.py::one", "b.py::two", "c.py::long", "d.py::middle", "a.py::short"]


def test_a_test_not_measured_yet_runs_early() -> None:
    items = [_Item("a.py::known_short"), _Item("a.py::new"), _Item("a.py::known_long")]
    seconds = {"a.py::known_short": 2.0, "a.py::known_long": UNKNOWN_S + 1}
    order = [i.nodeid for i in longest_first(items, seconds)]
    assert order == ["a.py::known_long", "a.py::new", "a.py::known_short"]


def test_the_unit_is_the_group_else_the_test() -> None:
    assert unit_of(_Item("x.py::t", "g")) == "g"  # type: ignore[arg-type]
    assert unit_of(_Item("x.py::t")) == "x.py::t"  # type: ignore[arg-type]


def test_a_unit_waiting_for_an_install_goes_where_it_can_start() -> None:
    """With two workers and the longest test's install ready only at 120 s, the workers
    first take what can start at once, then that test: nobody sits waiting for it."""
    items = [_Item("a.py::sixty"), _Item("b.py::hundred"), _Item("c.py::fifty"),
             _Item("d.py::thirty")]  # fmt: skip
    seconds = {"a.py::sixty": 60.0, "b.py::hundred": 100.0, "c.py::fifty": 50.0,
               "d.py::thirty": 30.0}  # fmt: skip
    ready = {"b.py::hundred": 120.0}
    order = schedule(items, seconds, workers=2, ready_s=lambda i: ready.get(i.nodeid, 0.0))
    assert [i.nodeid for i in order] == ["a.py::sixty", "c.py::fifty", "d.py::thirty",
                                         "b.py::hundred"]  # fmt: skip
    # ready at once: longest first, as before
    assert [i.nodeid for i in schedule(items, seconds, workers=2)] == [
        "b.py::hundred", "a.py::sixty", "c.py::fifty", "d.py::thirty"
    ]  # fmt: skip
