"""The burn-in's figures as a deploy reads them back from a remote preflight table.

Deploy sees a remote preflight only as the text it printed (the table
:meth:`ups.preflight.result.Report.render_table` draws); this module is the one reader of
the figure rows in that text, beside the names that write them. Importing it costs
nothing (no torch).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, get_args

from ups.config.schema import Figure

if TYPE_CHECKING:
    from ups.config import Config

FIGURES: tuple[str, ...] = get_args(Figure)
"""Every figure, in the order the rows run; ``busbw`` is the all-reduce check's value."""
ROW_OF = {name: ("allreduce" if name == "busbw" else name) for name in FIGURES}
"""The preflight row that carries each figure."""
FLOOR_WORDS = "below the floor"
"""What a burn-in row's message says when its figure is under the floor."""
BURN_IN_ROWS = tuple(row for row in ROW_OF.values() if row != "allreduce")
"""The checks the burn-in adds (``preflight.burn_in`` other than ``off``)."""

# CHECK  STATUS  VALUE UNIT [vs KNOWN]  MESSAGE: one figure's row of the plain table.
_ROW = re.compile(
    r"^(?P<name>\w+)\s+(?P<status>PASS|WARN|FAIL|SKIP)\s+(?P<value>[-+0-9.e]+) (?P<unit>\S+)"
    r"(?: vs (?P<known>[-+0-9.e]+))?\s{2,}(?P<message>.*)$",
    re.MULTILINE,
)


@dataclass(frozen=True, slots=True)
class Row:
    name: str
    status: str
    value: float
    known: float | None
    message: str


def rows(report: str) -> dict[str, Row]:
    """The figure rows of a plain preflight table, by figure name."""
    out: dict[str, Row] = {}
    by_row = {row: name for name, row in ROW_OF.items()}
    for m in _ROW.finditer(report):
        name = by_row.get(m.group("name"))
        if name is None:
            continue
        try:
            value = float(m.group("value"))
            known = None if m.group("known") is None else float(m.group("known"))
        except ValueError:
            continue
        out[name] = Row(name, m.group("status").lower(), value, known, m.group("message"))
    return out


def figures(report: str) -> dict[str, Row]:
    """The figure rows of a plain preflight table; empty without a burn-in."""
    found = rows(report)
    if not any(name in found for name in BURN_IN_ROWS):
        return {}
    return found


def below_floor(report: str) -> dict[str, str]:
    """``{row: message}`` of the burn-in rows that failed by being below their floor (each
    message names the figure, its known-good value and the ratio)."""
    return {
        ROW_OF[r.name]: r.message
        for r in rows(report).values()
        if r.status == "fail" and r.name != "busbw" and FLOOR_WORDS in r.message
    }


def workload(cfg: Config) -> str:
    """What a ``step``/``loader`` figure depends on (model, tasks, batch, precision), as a
    short digest: figures of different workloads are never compared."""
    tasks = [t.model_dump(mode="json", exclude={"path"}) for t in cfg.tasks]
    key = {
        "model": cfg.model.model_dump(mode="json"),
        "tasks": tasks,
        "batch_size": cfg.training.batch_size,
        "precision": cfg.training.precision,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
