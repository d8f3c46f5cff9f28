"""Check results as data: what every check returns and what the CLI renders.

The JSON form (``Report.to_json``) is a stable schema, ``schema_version`` 1, documented in
docs/preflight.md. Fields are only ever added, never renamed or removed, within a version.
"""

from __future__ import annotations

import datetime as dt
import socket
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ups import jsonio
from ups.console import render_text

SCHEMA_VERSION = 1

Scalar = str | int | float | bool | None


class Status(StrEnum):
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"


_SEVERITY = (Status.SKIP, Status.PASS, Status.WARN, Status.FAIL)


def worst(statuses: list[Status]) -> Status:
    """The most severe status (fail > warn > pass > skip); pass for an empty list."""
    return max(statuses, key=_SEVERITY.index, default=Status.PASS)


@dataclass(kw_only=True, slots=True)
class CheckResult:
    """What one check measured and what it concluded."""

    name: str
    status: Status
    message: str
    """One sentence for people: what was measured and what it means."""
    value: Scalar = None
    """The measured value (a number where one makes sense, in ``unit``)."""
    threshold: Scalar = None
    """The value ``value`` was compared against, in ``unit``; None when nothing was compared."""
    unit: str | None = None
    hint: str | None = None
    """The fix, as a command to run or a config change; None when nothing needs fixing."""
    duration_s: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        data["duration_s"] = round(self.duration_s, 4)
        return data


@dataclass(kw_only=True, slots=True)
class Report:
    """All results of one preflight run, in the order the checks ran."""

    results: list[CheckResult]
    started_at: str = field(
        default_factory=lambda: dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    )
    duration_s: float = 0.0
    host: str = field(default_factory=socket.gethostname)

    def ok(self, strict: bool = False) -> bool:
        """True when nothing failed (and, with ``strict``, nothing warned)."""
        bad = {Status.FAIL, Status.WARN} if strict else {Status.FAIL}
        return not any(r.status in bad for r in self.results)

    def counts(self) -> dict[str, int]:
        return {s.value: sum(r.status is s for r in self.results) for s in Status}

    def get(self, name: str) -> CheckResult:
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(name)

    def to_dict(self, strict: bool = False) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "ok": self.ok(strict),
            "strict": strict,
            "host": self.host,
            "started_at": self.started_at,
            "duration_s": round(self.duration_s, 4),
            "counts": self.counts(),
            "checks": [r.to_dict() for r in self.results],
        }

    def to_json(self, strict: bool = False) -> str:
        return jsonio.dumps(self.to_dict(strict), indent=2)

    def render_table(self, strict: bool = False) -> str:
        """The report as plain text (files, pipes, launch.log): :meth:`renderable` unwrapped."""
        return render_text(self.renderable(strict))

    def renderable(self, strict: bool = False) -> RenderableType:
        """One row per check (status, value, message), the hints of what needs fixing, and
        the verdict; statuses in colour on a terminal. The one preflight renderer."""
        table = Table(box=None, pad_edge=False, header_style="bold")
        for name in ("CHECK", "STATUS", "VALUE", "MESSAGE"):
            table.add_column(name, overflow="fold")
        for r in self.results:
            status = Text(r.status.value.upper(), style=_STATUS_STYLE[r.status])
            table.add_row(r.name, status, _show_value(r), r.message)
        parts: list[RenderableType] = [table]
        fixes = [r for r in self.results if r.hint and r.status in {Status.FAIL, Status.WARN}]
        if fixes:
            parts.append(Text("\nHow to fix:"))
            parts.extend(Text(f"  {r.name}: {r.hint}") for r in fixes)
        c = self.counts()
        ok = self.ok(strict)
        verdict = Text("\npreflight ")
        verdict.append("OK" if ok else "NOT OK", style="bold green" if ok else "bold red")
        verdict.append(
            f": {c['pass']} pass, {c['warn']} warn, {c['fail']} fail, {c['skip']} skip in "
            f"{self.duration_s:.2f} s" + (" (strict)" if strict else "")
        )
        parts.append(verdict)
        return Group(*parts)


_STATUS_STYLE = {
    Status.PASS: "green",
    Status.WARN: "bold yellow",
    Status.FAIL: "bold red",
    Status.SKIP: "dim",
}


def _show_value(r: CheckResult) -> str:
    if r.value is None:
        return "-"
    value = f"{r.value:.3g}" if isinstance(r.value, float) else str(r.value)
    if r.unit:
        value += f" {r.unit}"
    if r.threshold is not None:
        t = f"{r.threshold:.3g}" if isinstance(r.threshold, float) else str(r.threshold)
        value += f" vs {t}"
    return value
