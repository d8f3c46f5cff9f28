"""The order the side-by-side workers take tests in (tests/scheduling.py): longest first."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.scheduling import UNKNOWN_S, longest_first, unit_of


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
