"""Helpers for the fault tests: strict outcome reading, per-rank events, survivors."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import made_once_per_run, rank_events, tiny_config, torchrun


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


PREEMPTED_AT = 5
"""The step at which :func:`preempted_run`'s rank 0 receives SIGTERM."""


@dataclass
class Preempted:
    output_dir: Path
    returncode: int


def preempted_run(factory: pytest.TempPathFactory, tiny_data: dict[str, Path]) -> Preempted:
    """The output directory (and torchrun's exit code) of a 12-step run under bare torchrun
    whose rank 0 got SIGTERM at step :data:`PREEMPTED_AT` (``sigterm@0:5``): the preempted
    state every test that resumes such a run starts from. Made once per test run;
    read-only, so a test that resumes it works on its own copy (:func:`copy_of`)."""

    def preempt(root: Path) -> None:
        config = root / "config.yaml"
        config.write_text(yaml.safe_dump(preempted_config(root / "runs", tiny_data)))
        done = torchrun(config, env={"UPS_FAULTS": f"sigterm@0:{PREEMPTED_AT}"})
        (root / "returncode").write_text(str(done.returncode))

    root = made_once_per_run(factory, "preempted-at-5", preempt)
    return Preempted(root / "runs", int((root / "returncode").read_text()))


def preempted_config(
    output_dir: Path, tiny_data: dict[str, Path], **distributed: Any
) -> dict[str, Any]:
    """:func:`preempted_run`'s config, writing to ``output_dir`` (``distributed`` settings
    aside, which a resume may change)."""
    return tiny_config(output_dir, tiny_data, training={"max_steps": 12}, distributed=distributed)


def copy_of(output_dir: Path, dest: Path) -> Path:
    """A copy of a shared run's ``output_dir`` at ``dest`` (its `latest` link is relative),
    for a test that continues the run."""
    shutil.copytree(output_dir, dest, symlinks=True)
    return dest
