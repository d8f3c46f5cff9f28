"""Versions vs pins.toml, and GPU visibility (real on this host; judged from NVML facts too)."""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO
from tests.fixtures.preflight_helpers import run_check
from ups.pins import cudnn_string, matches
from ups.preflight import Status
from ups.preflight.checks.gpu import GpuFacts, evaluate
from ups.preflight.checks.versions import judge
from ups.preflight.nvml import GpuInfo, NvmlFacts
from ups.torchcompat import in_supported_range, release


def test_repo_pins_judge_this_torch() -> None:
    """The repo's pins.toml against the installed torch: the pinned release passes; another
    release inside the supported range (the GPU machine's 2.11) warns naming both, never
    fails; CUDA parts skip on a CPU build."""
    result = run_check("versions", pins_path=REPO / "pins.toml")
    components = result.details["components"]
    pinned = components["torch"]["pinned"]
    assert in_supported_range(torch.__version__)
    if matches(pinned, torch.__version__):
        assert result.status is Status.PASS, result.message
        assert components["torch"]["status"] == "pass"
    else:
        assert result.status is Status.WARN, result.message
        assert f"torch: pinned {pinned}, running {torch.__version__}" in result.message
    if torch.version.cuda is None:
        for name in ("cuda", "cudnn", "nccl"):
            assert components[name]["status"] == "skip"
            assert components[name]["reason"] == "not available (CPU build of torch)"


def test_pin_mismatch_inside_the_range_warns_showing_both_versions(tmp_path: Path) -> None:
    """A torch pin that differs from the running torch, which is inside the supported range:
    a warning naming the pinned and the running version (ups runs), with the hint."""
    pins = tomllib.loads((REPO / "pins.toml").read_text())
    pins["versions"]["torch"] = "2.12.1"
    path = tmp_path / "pins.toml"
    path.write_text("[versions]\n" + "".join(f'{k} = "{v}"\n' for k, v in pins["versions"].items()))
    result = run_check("versions", pins_path=path)
    assert result.status is Status.WARN
    assert f"torch: pinned 2.12.1, running {torch.__version__}" in result.message
    assert "inside ups's supported range >=2.11,<2.16" in result.message
    assert result.hint is not None and "pins.toml" in result.hint


PINS = {"python": "3.12", "torch": "2.13.0", "cuda": "13.0", "cudnn": "9", "nccl": "2"}
GPU_MACHINE = {"python": "3.12.3", "torch": "2.11.0+cu130", "cuda": "13.0", "cudnn": "9.19.0",
               "nccl": "2.28.9"}  # fmt: skip


def test_versions_judged_against_pins_and_the_supported_range() -> None:
    """The pinned release passes; the GPU machine's 2.11 (inside the range) warns naming both
    torch versions; a torch outside the range (2.9, 2.16) fails naming the range and the pip
    install that fixes it; a CUDA that differs with torch inside the range only warns."""
    same = judge(PINS, {**GPU_MACHINE, "torch": "2.13.0+cu130"}, "pins.toml")
    assert same.status is Status.PASS, same.message

    older = judge(PINS, GPU_MACHINE, "pins.toml")
    assert older.status is Status.WARN
    assert "torch: pinned 2.13.0, running 2.11.0+cu130" in older.message
    assert older.details["components"]["torch"]["status"] == "warn"

    for outside in ("2.9.1+cu128", "2.16.0", "2.10.0"):
        result = judge(PINS, {**GPU_MACHINE, "torch": outside}, "pins.toml")
        assert result.status is Status.FAIL, outside
        assert f"torch: running {outside}, outside ups's supported range torch>=2.11,<2.16" in (
            result.message
        )
        assert result.hint is not None and "pip install 'torch==2.13.0'" in result.hint

    cuda = judge(PINS, {**GPU_MACHINE, "torch": "2.13.0+cu128", "cuda": "12.8"}, "pins.toml")
    assert cuda.status is Status.WARN and "cuda: pinned 13.0, running 12.8" in cuda.message


def test_supported_range_reads_release_numbers() -> None:
    """Local build tags, pre-releases and nightlies are judged by their release numbers."""
    assert release("2.11.0+cu130") == (2, 11, 0)
    assert release("2.16.0.dev20260101+cpu") == (2, 16, 0)
    assert release("2.15.0rc1") == (2, 15, 0)
    assert in_supported_range("2.11.0") and in_supported_range("2.15.0+cu130")
    assert in_supported_range("2.13.0+cpu")
    assert not in_supported_range("2.10.1") and not in_supported_range("2.16.0.dev20260101")


def test_missing_pins_file_fails(tmp_path: Path) -> None:
    """A pins file that cannot be read is a failure with the --pins hint."""
    result = run_check("versions", pins_path=tmp_path / "nope.toml")
    assert result.status is Status.FAIL
    assert result.hint is not None and "--pins" in result.hint


def test_version_matching_rules() -> None:
    """Pins match by leading components; local build tags are ignored; cuDNN codes decode."""
    assert matches("2.13.0", "2.13.0+cu130")
    assert matches("9", "9.10.2")
    assert matches("13.0", "13.0")
    assert not matches("13.0", "12.8")
    assert not matches("2.13.0", "2.13.1")
    assert cudnn_string(91002) == "9.10.2"
    assert cudnn_string(8902) == "8.9.2"


@pytest.mark.skipif(torch.cuda.is_available(), reason="asserts the behaviour of a GPU-less host")
def test_cpu_host_without_expected_gpus_skips() -> None:
    """With no GPU expected, a CPU host skips the GPU check and says training uses gloo."""
    result = run_check("gpu")
    assert result.status is Status.SKIP
    assert result.message == "no GPU on this host; training will use gloo on CPU"


@pytest.mark.skipif(torch.cuda.is_available(), reason="asserts the behaviour of a GPU-less host")
def test_expected_gpus_missing_fails(make_config: Callable[..., Path]) -> None:
    """Expecting GPUs (flag, or backend nccl in the config) on a host without any fails."""
    result = run_check("gpu", expected_gpus=2)
    assert result.status is Status.FAIL
    assert "expected 2 GPU(s), torch sees 0" in result.message
    config = make_config(distributed={"backend": "nccl", "nproc_per_node": 2})
    assert run_check("gpu", config=config).status is Status.FAIL


def _fake_gpu_facts(torch_count: int, gpus: list[GpuInfo], **kw: object) -> GpuFacts:
    """A FAKE: hand-written torch/NVML facts for GPUs this machine does not have, so the
    judgement logic is tested here; the real reading runs in the `gpu`-marked tests."""
    nvml = NvmlFacts(available=True, driver="570.1", cuda_driver=str(kw.pop("driver_cuda", "13.0")))
    nvml.gpus = gpus
    return GpuFacts(
        torch_count=torch_count,
        torch_cuda=str(kw.pop("torch_cuda", "13.0")),
        visible_devices=kw.pop("visible", None),  # type: ignore[arg-type]  # kw values are object
        nvml=nvml,
    )


def _fake_gpu(i: int, **kw: object) -> GpuInfo:
    """A FAKE GPU as NVML would describe it."""
    return GpuInfo(index=i, name="NVIDIA H100 80GB HBM3", memory_total=80 << 30,
                   memory_free=79 << 30, **kw)  # type: ignore[arg-type]  # fmt: skip  # kw values are object


def test_gpu_judgement_from_nvml_facts() -> None:
    """Healthy GPUs pass; torch/NVML disagreement, ECC errors, a too-old driver fail;
    processes already holding GPU memory warn with the pids to kill."""
    healthy = evaluate(_fake_gpu_facts(2, [_fake_gpu(0), _fake_gpu(1)]), expected=2)
    assert healthy.status is Status.PASS
    assert "2 GPU(s) visible: NVIDIA H100 80GB HBM3" in healthy.message

    mismatch = evaluate(_fake_gpu_facts(1, [_fake_gpu(0), _fake_gpu(1)]), expected=2)
    assert mismatch.status is Status.FAIL
    assert "although NVML sees 2" in mismatch.message

    masked = evaluate(_fake_gpu_facts(1, [_fake_gpu(0), _fake_gpu(1)], visible="0"), expected=1)
    assert masked.status is Status.PASS

    ecc = evaluate(_fake_gpu_facts(1, [_fake_gpu(0, ecc_uncorrected=3)]), expected=1)
    assert ecc.status is Status.FAIL and "3 uncorrected ECC errors" in ecc.message

    old = evaluate(_fake_gpu_facts(1, [_fake_gpu(0)], driver_cuda="12.4"), expected=1)
    assert old.status is Status.FAIL and "driver supports 12.4" in old.message

    busy = evaluate(
        _fake_gpu_facts(1, [_fake_gpu(0, processes=[{"pid": 4242, "used_bytes": 2 << 30}])]),
        expected=1,
    )
    assert busy.status is Status.WARN
    assert busy.hint is not None and "kill 4242" in busy.hint


def test_gpu_subset_checks_only_the_gpus_the_job_uses() -> None:
    """With CUDA_VISIBLE_DEVICES=2,3 (what `ups launch --gpus 2,3` sets) on an 8-GPU host,
    another job's process and a bad GPU outside the subset do not fail or warn this job;
    the same problems on a GPU of the subset do."""
    gpus = [_fake_gpu(i) for i in range(8)]
    gpus[0] = _fake_gpu(0, processes=[{"pid": 77, "used_bytes": 4 << 30}])
    gpus[5] = _fake_gpu(5, ecc_uncorrected=9)
    subset = evaluate(_fake_gpu_facts(2, gpus, visible="2,3"), expected=2)
    assert subset.status is Status.PASS, subset.message
    assert "(GPUs 2,3 of 8)" in subset.message
    assert subset.details["job_gpus"] == [2, 3]

    inside = evaluate(_fake_gpu_facts(2, gpus, visible="0,5"), expected=2)
    assert inside.status is Status.FAIL
    assert "GPU 5 has 9 uncorrected ECC errors" in inside.message
    assert "GPU 0 already has 1 process(es)" in inside.message

    everything = evaluate(_fake_gpu_facts(8, gpus), expected=8)
    assert everything.status is Status.FAIL and "GPU 5" in everything.message
