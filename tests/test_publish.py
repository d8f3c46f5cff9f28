"""Publishing the image: the GHCR workflow passes actionlint, and
`scripts/build-images.sh --push` pushes to a real registry (Debian's docker-registry on
loopback; this machine reaches no public registry, and the GPU base cannot be pulled). The
push path runs with a small image (`--no-build`: tag, push, digest as after a build): the
1.4 GB CPU image would only spend minutes in gzip, and every run builds that one anyway
(scripts/test.sh)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.deploy_fixtures import free_port

REPO = Path(__file__).resolve().parents[1]
WORKFLOW = REPO / ".github" / "workflows" / "publish-image.yml"
ACTIONLINT = Path(sys.executable).parent / "actionlint"
REGISTRY = shutil.which("docker-registry") or "/usr/bin/docker-registry"


def _actionlint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ACTIONLINT), "-no-color", str(path)], capture_output=True, text=True, timeout=60
    )


@pytest.mark.slow
def test_publish_workflow_passes_actionlint_and_a_broken_copy_does_not(tmp_path: Path) -> None:
    """actionlint accepts the workflow; the same file with a misspelt output reference
    fails, so the check is real."""
    ok = _actionlint(WORKFLOW)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    text = WORKFLOW.read_text()
    for action in ("docker/login-action", "docker/metadata-action", "docker/build-push-action"):
        assert f"uses: {action}@" in text
    broken = tmp_path / ".github" / "workflows" / "publish-image.yml"
    broken.parent.mkdir(parents=True)
    broken.write_text(text.replace("steps.meta.outputs.tags", "steps.meta.outputs.tag"))
    bad = _actionlint(broken)
    assert bad.returncode != 0 and "steps.meta" in bad.stdout, bad.stdout


@pytest.mark.slow
def test_build_args_carry_the_pinned_gpu_base() -> None:
    """The workflow's build args name the base:tag@digest of pins.toml and its versions."""
    out = subprocess.run(
        ["bash", str(REPO / "scripts" / "build-images.sh"), "--gpu", "--build-args"],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    args = dict(line.split("=", 1) for line in out.stdout.splitlines())
    pins = tomllib.loads((REPO / "pins.toml").read_text())
    image = pins["image"]
    assert args["BASE_IMAGE"] == f"{image['base']}:{image['tag']}@{image['digest']}"
    assert args["CUDA_VERSION"] == pins["versions"]["cuda"]
    assert args["TORCH_VERSION"] == pins["versions"]["torch"]


def _start_registry(root: Path, port: int) -> subprocess.Popen[bytes]:
    config = root / "registry.yml"
    config.write_text(
        "version: 0.1\n"
        f"storage:\n  filesystem:\n    rootdirectory: {root / 'store'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    log = (root / "registry.log").open("wb")
    proc = subprocess.Popen([REGISTRY, "serve", str(config)], stdout=log, stderr=log)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.1)  # polling for the registry to answer, bounded by the deadline
    proc.kill()
    raise AssertionError(f"docker-registry did not answer: {(root / 'registry.log').read_text()}")


def _small_image(root: Path, tag: str) -> None:
    """A one-file image (a few hundred bytes), imported without a registry or a build."""
    (root / "small").mkdir()
    (root / "small" / "hello.txt").write_text(f"pushed by tests/test_publish.py as {tag}\n")
    tar = subprocess.run(["tar", "-C", str(root / "small"), "-c", "hello.txt"],
                         capture_output=True, check=True, timeout=60)  # fmt: skip
    subprocess.run(["docker", "import", "-", tag], input=tar.stdout, capture_output=True,
                   check=True, timeout=120)  # fmt: skip


@pytest.mark.slow
@pytest.mark.docker
def test_build_images_push_reaches_a_registry(tmp_path: Path) -> None:
    """`build-images.sh --push 127.0.0.1:PORT/ups:TAG --no-build` tags the image built
    before, pushes it, and prints the digest the registry now serves for that tag; with
    --no-build and no such image it exits 1 naming the image and what to do."""
    if not Path(REGISTRY).exists():
        pytest.skip("docker-registry missing: apt-get install docker-registry")
    port = free_port()
    registry = _start_registry(tmp_path, port)
    tag = f"publish-{uuid.uuid4().hex[:8]}"
    local = f"ups:small-{tag}"
    ref = f"127.0.0.1:{port}/ups:{tag}"
    script = ["bash", str(REPO / "scripts" / "build-images.sh"), "--push", ref, "--no-build"]
    try:
        missing = subprocess.run(
            script, capture_output=True, text=True, timeout=120, cwd=REPO,
            env={**os.environ, "UPS_IMAGE_CPU": local},
        )  # fmt: skip
        assert missing.returncode == 1, missing.stderr
        assert f"there is no image {local} to push" in missing.stderr

        _small_image(tmp_path, local)
        out = subprocess.run(
            script, capture_output=True, text=True, timeout=300, cwd=REPO,
            env={**os.environ, "UPS_IMAGE_CPU": local},
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        digest = out.stdout.strip().rsplit("@", 1)[1]
        tags = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/ups/tags/list"))
        assert tags["tags"] == [tag]
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v2/ups/manifests/{tag}",
            headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"},
        )
        with urllib.request.urlopen(request) as response:
            assert response.headers["Docker-Content-Digest"] == digest
    finally:
        registry.terminate()
        registry.wait(timeout=10)
        subprocess.run(["docker", "rmi", local, ref], capture_output=True, timeout=120)
