"""Run ids: one generator and one validator for every place a run is named.

A run id becomes a directory name on this machine and on remote hosts, a docker
compose project name and a word in remote shell commands, so it is checked at the edge
(config load, CLI flags) against a strict pattern: letters, digits, ``_ . -``, starting
with a letter or digit, at most 128 characters. ``..`` and ``/`` can never appear.
"""

from __future__ import annotations

import datetime as dt
import os
import re

RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def run_id_problem(value: str) -> str | None:
    """Why ``value`` is not a valid run id or run name, or None when it is."""
    if not RUN_ID_PATTERN.fullmatch(value) or ".." in value:
        return (
            f"{value!r} is not a valid run id: use 1-128 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit (no '/', no '..', no spaces or shell characters)"
        )
    return None


def validate_run_id(value: str) -> str:
    """Return ``value`` unchanged, or raise ``ValueError`` saying what is allowed."""
    problem = run_id_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def new_run_id(name: str) -> str:
    """``<name>-<UTC yyyymmdd-hhmmss>-<4 hex>``: sortable by time, unique within a second."""
    stem = re.sub(r"\.{2,}", ".", _UNSAFE.sub("-", name)).strip("-.") or "run"
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    return f"{stem[:100]}-{stamp}-{os.urandom(2).hex()}"
