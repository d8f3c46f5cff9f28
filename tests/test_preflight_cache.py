"""Cache check: files holding CUDA storages are found without a GPU and without running code."""

from __future__ import annotations

import io
import os
import pickle
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch

from tests.fixtures.preflight_helpers import run_check
from ups.preflight import Status
from ups.preflight.torchfile import scan_file

FIXTURE = Path(__file__).parent / "fixtures" / "cache_cuda" / "latents_cuda0.pt"


def test_fixture_is_tagged_for_cuda_by_torch_itself() -> None:
    """The crafted fixture is what torch.load sees as a cuda:0 file (map_location callback)."""
    seen: list[str] = []

    def record(storage: object, location: str) -> object:
        seen.append(location)
        return storage

    torch.load(FIXTURE, weights_only=True, map_location=record)
    assert seen and set(seen) == {"cuda:0"}
    assert {s.location for s in scan_file(FIXTURE).storages} == {"cuda:0"}


def test_cache_with_cuda_tensors_fails_with_the_rebuild_command(
    tmp_path: Path, make_config: Callable[..., Path]
) -> None:
    """A cache directory with a CUDA-tagged file fails, naming the file, device and fix."""
    cache = tmp_path / "cache"
    (cache / "advection").mkdir(parents=True)
    torch.save({"z": torch.zeros(3)}, cache / "advection" / "ok.pt")
    bad = cache / "advection" / "latents_cuda0.pt"
    shutil.copy(FIXTURE, bad)
    config = make_config(cache={"enabled": True, "dir": str(cache)})
    result = run_check("cache", config=config)
    assert result.status is Status.FAIL
    assert f"{bad} has storages on cuda:0" in result.message
    assert result.details["files_scanned"] == 2
    assert list(result.details["non_cpu_files"]) == [str(bad)]
    assert result.hint == f"rebuild the cache on CPU: ups cache build {config}"


def test_cache_of_cpu_tensors_passes(tmp_path: Path, make_config: Callable[..., Path]) -> None:
    """A cache of CPU tensors (and an extra .pt file named in the config) passes."""
    cache = tmp_path / "cache"
    cache.mkdir()
    torch.save({"z": torch.randn(2, 4), "ids": torch.arange(2)}, cache / "a.pt")
    extra = tmp_path / "stats.pt"
    torch.save(torch.ones(3), extra)
    config = make_config(cache={"enabled": True, "dir": str(cache), "extra_files": [str(extra)]})
    result = run_check("cache", config=config)
    assert result.status is Status.PASS, result.message
    assert result.details["files_scanned"] == 2


def test_extra_file_with_cuda_tensors_fails(tmp_path: Path) -> None:
    """A .pt file given on the command line (--cache-path) is scanned too."""
    result = run_check("cache", cache_paths=[FIXTURE])
    assert result.status is Status.FAIL
    assert "cuda:0" in result.message


def test_enabled_cache_without_directory_fails(
    tmp_path: Path, make_config: Callable[..., Path]
) -> None:
    """cache.enabled with a missing directory fails with the build command."""
    config = make_config(cache={"enabled": True, "dir": str(tmp_path / "nope")})
    result = run_check("cache", config=config)
    assert result.status is Status.FAIL
    assert "does not exist" in result.message
    assert result.hint is not None and "ups cache build" in result.hint


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_is_refused_and_never_runs(tmp_path: Path) -> None:
    """A .pt whose pickle would run a shell command is reported unsafe; the command never runs."""
    marker = tmp_path / "pwned"
    evil = tmp_path / "cache" / "evil.pt"
    evil.parent.mkdir()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("evil/data.pkl", pickle.dumps(_Payload(marker), protocol=2))
    evil.write_bytes(buf.getvalue())
    result = run_check("cache", cache_paths=[evil.parent])
    assert result.status is Status.FAIL
    assert "unsafe pickle" in result.message and "system" in result.message
    assert not marker.exists()


def test_reader_agrees_with_torch_load_on_every_storage(tmp_path: Path) -> None:
    """The restricted reader finds the same storages and device tags torch.load reports
    (weights_only, mmap, a map_location callback) for nested, shared and CUDA-tagged files."""
    shared = torch.arange(10.0)
    files = {
        "nested": {"a": [torch.ones(2), (torch.zeros(3, dtype=torch.int64),)], "b": {"c": 1}},
        "views": {"x": shared, "y": shared[2:5], "z": torch.randn(4, 4).t()},
    }
    paths = [FIXTURE]
    for name, obj in files.items():
        paths.append(tmp_path / f"{name}.pt")
        torch.save(obj, paths[-1])
    for path in paths:
        seen: list[str] = []

        def record(storage: object, location: str, seen: list[str] = seen) -> object:
            seen.append(location)
            return storage

        torch.load(path, weights_only=True, mmap=True, map_location=record)
        scan = scan_file(path)
        assert scan.error is None
        assert sorted(s.location for s in scan.storages) == sorted(seen), path
