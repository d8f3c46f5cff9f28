"""Helpers for the fault tests: strict outcome reading, per-rank events, survivors."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tests.conftest import rank_events


def _no_constants(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name!r}")


def strict_json(path: Path) -> dict[str, Any]:
    """Parse ``path`` as strict JSON: a bare NaN/Infinity raises instead of loading."""
    data: dict[str, Any] = json.loads(path.read_text(), parse_constant=_no_constants)
    return data


def events(run_dir: Path, rank: int, name: str) -> list[dict[str, Any]]:
    return [e for e in rank_events(run_dir, rank) if e["event"] == name]


def survivors(marker: str) -> list[str]:
    """Processes (other than this one) whose command line mentions ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline:
            found.append(f"{entry.name}: {cmdline[:200]}")
    return found
