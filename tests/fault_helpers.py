"""Helpers for the fault tests: strict outcome reading, per-rank events, survivors, and the
runs several tests read (made once per test run)."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import made_once_per_run, only_run_dir, rank_events, tiny_config, torchrun


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


@dataclass
class Finished:
    """How a shared run under bare torchrun ended: its config, output directory, torchrun's
    exit code and output, and the processes (naming its config) that outlived it."""

    config: Path
    output_dir: Path
    returncode: int
    stdout: str
    stderr: str
    survivors: list[str]


CONSECUTIVE_SKIPS = {2: ("oom@1:2", "oom_ranks", [1]), 3: ("nan@0:3", "nonfinite_ranks", [0])}
""":func:`consecutive_skips_run`'s faults: step -> (fault, the skip's field, the ranks it names)."""


def consecutive_skips_run(factory: pytest.TempPathFactory, tiny_data: dict[str, Path]) -> Finished:
    """10 steps under bare torchrun with training.nonfinite=skip and
    training.max_consecutive_skips=2, where rank 1 runs out of memory at step 2 and rank 0's
    loss is NaN at step 3 (:data:`CONSECUTIVE_SKIPS`): two skips in a row, one of each kind,
    so the run fails at the limit only if both count. Made once per test run (the OOM and
    the NaN limit tests read it); read-only."""

    def train(root: Path) -> None:
        config = root / "config.yaml"
        config.write_text(yaml.safe_dump(tiny_config(
            root / "runs", tiny_data,
            training={"max_steps": 10, "nonfinite": "skip", "max_consecutive_skips": 2},
        )))  # fmt: skip
        faults = ",".join(fault for fault, _, _ in CONSECUTIVE_SKIPS.values())
        done = torchrun(config, env={"UPS_FAULTS": faults})
        (root / "finished.json").write_text(json.dumps({
            "returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr,
            "survivors": survivors(str(config)),
        }))  # fmt: skip

    root = made_once_per_run(factory, "consecutive-skips", train)
    got = json.loads((root / "finished.json").read_text())
    return Finished(root / "config.yaml", root / "runs", got["returncode"], got["stdout"],
                    got["stderr"], got["survivors"])  # fmt: skip


def assert_skip_counted(run: Finished, step: int) -> None:
    """Both ranks skipped :data:`CONSECUTIVE_SKIPS`' ``step``, naming the rank of its fault
    and counting it as the next skip in a row."""
    fault, field, ranks = CONSECUTIVE_SKIPS[step]
    in_a_row = sorted(CONSECUTIVE_SKIPS).index(step) + 1
    for rank in (0, 1):
        skips = [e for e in events(only_run_dir(run.output_dir), rank, "step_skipped")
                 if e["step"] == step]  # fmt: skip
        got = [(e.get(field), e.get("consecutive")) for e in skips]
        assert got == [(ranks, in_a_row)], f"{fault}: rank {rank} logged skips {got} at step {step}"
