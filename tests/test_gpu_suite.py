"""The GPU suite (scripts/gpu-suite.sh) and its wheels (scripts/gpu-wheels.sh), checked on a
machine without a GPU: ``--cpu`` end to end, the wheels' size against the device limit."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch

from tests.conftest import REPO
from tests.fault_helpers import strict_json

CUDA_ONLY = {
    "cache-cuda-file",
    "pytest-cuda",
    "train-cuda-fp32",
    "train-cuda-bf16",
    "train-cuda-fp16",
    "train-cuda-compile",
    "oom-real",
}
EVERYWHERE = {
    "wheels",
    "preflight",
    "versions",
    "cache-cpu-file",
    "data",
    "burn-in",
    "train-cpu",
    "throughput",
}

JUDGE_THE_PREFLIGHT_REPORT = {"versions", "cache-cpu-file"}
"""Steps that judge their check of the preflight step's one ``ups-preflight`` report."""


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)  # dataclasses look their module up there
    spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "UPS_", "OUT"))}
    env.update(extra)
    return env


@pytest.mark.slow
def test_cpu_suite_runs_end_to_end_and_skips_only_the_cuda_steps(tmp_path: Path) -> None:
    """``gpu-suite.sh --cpu``: every CUDA-only step says "skipped: no CUDA", every other
    step passed, and the results (strict JSON, the same in --results-dir and $OUT) name the
    versions and each step's duration; ups-preflight runs twice, as a user would run it
    (once with every check: the preflight, versions and cache-cpu-file steps share its
    report) and for the burn-in."""
    out, results = tmp_path / "out", tmp_path / "results"
    out.mkdir()
    proc = subprocess.run(
        ["bash", "scripts/gpu-suite.sh", "--cpu", "--results-dir", str(results),
         "--wheels", str(tmp_path / "no-wheels")],
        capture_output=True, text=True, timeout=480, cwd=REPO, env=_env(OUT=str(out)),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    doc = strict_json(results / "gpu-suite-cpu.json")
    assert doc == strict_json(out / "gpu-suite-cpu.json")
    steps: dict[str, dict[str, Any]] = {s["name"]: s for s in doc["steps"]}
    assert set(steps) == CUDA_ONLY | EVERYWHERE
    for name in CUDA_ONLY:
        assert (steps[name]["status"], steps[name]["reason"]) == ("skipped", "no CUDA"), name
        assert f"== {name}:" in proc.stdout
    assert proc.stdout.count("skipped: no CUDA") == len(CUDA_ONLY)
    for name in EVERYWHERE:
        assert steps[name]["status"] == "passed", steps[name]
        if name in JUDGE_THE_PREFLIGHT_REPORT:  # no process of their own: nothing to time
            assert steps[name]["details"]["preflight_run_by"] == "preflight", steps[name]
            assert steps[name]["duration_s"] >= 0, steps[name]
        else:
            assert steps[name]["duration_s"] > 0, steps[name]
    assert doc["counts"] == {
        "passed": len(EVERYWHERE),
        "failed": 0,
        "known": 0,
        "skipped": len(CUDA_ONLY),
    }
    assert doc["facts"]["torch"] == str(torch.__version__)
    assert doc["facts"]["device"] is None and doc["facts"]["cuda"] is None
    assert "eval/advection/rel_l2" in steps["train-cpu"]["details"]["metrics"]
    burn_in = steps["burn-in"]["details"]["figures"]
    assert burn_in["matmul"]["unit"] == "GFLOP/s" and burn_in["step"]["value"] > 0
    assert burn_in["h2d"]["status"] == "skip"
    cases = steps["throughput"]["details"]["cases"]
    assert cases[0]["tries"][0]["plain samples/s"] > 0
    assert cases[0]["tries"][0]["ups fail samples/s"] > 0
    assert (out / "gpu-step-cpu.txt").is_file() and (out / "gpu-suite.log").is_file()
    ran = [Path(line.split()[1]).name for line in (out / "gpu-suite.log").read_text().splitlines()
           if line.startswith("$ ")]  # fmt: skip
    assert ran.count("ups-preflight") == 2, f"ups-preflight ran {ran.count('ups-preflight')} times"
    assert len(list(out.iterdir())) <= 8  # what comes back from the device machine


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="asserts the behaviour of a GPU-less host")
def test_suite_without_cuda_and_without_cpu_flag_says_how_to_run_it(tmp_path: Path) -> None:
    """On a host without a GPU the plain command stops at once (exit 2) naming --cpu."""
    proc = subprocess.run(
        ["bash", "scripts/gpu-suite.sh", "--results-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=REPO, env=_env(),
    )  # fmt: skip
    assert proc.returncode == 2
    assert "torch sees no CUDA device here; on a host without a GPU run with --cpu" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_gpu_wheels_download_stays_under_the_device_limit(tmp_path: Path) -> None:
    """gpu-wheels.sh (from PyPI) fetches CPython 3.12 manylinux wheels of what the GPU
    machine lacks, never torch or nvidia-*, under 64 MiB with the working tree, and prints
    the device call with the folder to carry."""
    dest = tmp_path / "wheels"
    proc = subprocess.run(
        ["bash", "scripts/gpu-wheels.sh", str(dest)],
        capture_output=True, text=True, timeout=420, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    wheels = sorted(dest.glob("*.whl"))
    names = {w.name.split("-")[0].lower() for w in wheels}
    assert {"structlog", "pydantic", "pydantic_core", "wandb", "fabric", "tenacity"} <= names
    assert not {n for n in names if n.startswith(("torch", "nvidia", "triton"))}
    wheels_mod = _script("gpu_wheels")
    assert not names & {n.replace("-", "_") for n in wheels_mod.ON_GPU_MACHINE}
    total = sum(w.stat().st_size for w in wheels) + wheels_mod.tree_bytes()
    assert total < 64 << 20, f"{total / 2**20:.1f} MiB"
    assert _script("gpu_suite")._check_wheel_tags(wheels) == []
    assert f'command: "bash scripts/gpu-suite.sh --wheels {dest}"' in proc.stdout
    assert f'carry:   ["{dest}"]' in proc.stdout


def test_wheel_tags_refuse_torch_and_other_pythons(tmp_path: Path) -> None:
    """Only wheels that install on CPython 3.12 manylinux x86_64 may travel, and never torch
    or nvidia-* (the GPU machine's own CUDA build must stay)."""
    names = [
        "structlog-26.1.0-py3-none-any.whl",
        "pydantic_core-2.50.5-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        "pydantic_core-2.50.5-cp311-cp311-manylinux2014_x86_64.whl",
        "cryptography-49.0.0-cp311-abi3-manylinux_2_28_x86_64.whl",
        "pynacl-1.6.2-cp38-abi3-macosx_10_10_universal2.whl",
        "torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl",
        "nvidia_nccl_cu13-2.28.0-py3-none-manylinux_2_18_x86_64.whl",
    ]
    problems = _script("gpu_suite")._check_wheel_tags([tmp_path / n for n in names])
    assert problems == [
        f"{names[2]} does not install on CPython 3.12 manylinux x86_64",
        f"{names[4]} does not install on CPython 3.12 manylinux x86_64",
        f"{names[5]} must not travel (the GPU machine's own build is used)",
        f"{names[6]} must not travel (the GPU machine's own build is used)",
    ]


def test_alloc_fault_without_cuda_is_a_config_problem() -> None:
    """The real-OOM fault needs the CUDA allocator: without a CUDA device it is refused up
    front; with one (or with kind oom) it is not."""
    from ups.config import Config
    from ups.train.startcheck import device_problems

    task = {"name": "a", "layout": "single_1d", "path": "a.h5"}

    def armed(kind: str) -> Config:
        fault = {"kind": kind, "rank": 0, "step": 3}
        return Config.model_validate({"tasks": [task], "faults": [fault]})

    assert device_problems(armed("alloc"), cuda=False) == [
        "faults: kind alloc needs CUDA (it makes the CUDA allocator itself run out of "
        "memory); use kind oom on this host"
    ]
    assert device_problems(armed("alloc"), cuda=True) == []
    assert device_problems(armed("oom"), cuda=False) == []


def test_results_file_stays_strict_json_with_non_finite_numbers() -> None:
    """A NaN or inf in a step's details (a diverged run's metric) is written as null, so the
    results file is still strict JSON and the suite still writes it."""
    suite = _script("gpu_suite")
    clean = suite.finite({"a": [1.0, math.nan], "b": {"c": math.inf, "d": "x"}})
    assert clean == {"a": [1.0, None], "b": {"c": None, "d": "x"}}


PROBE = """import os, sys
with open(os.environ["BENCH_SITE_PROBE"], "a") as fh:
    fh.write(" ".join(sys.argv) + "\\n")
"""


@pytest.mark.slow
def test_bench_step_keeps_the_callers_path_and_each_cases_numbers(
    tmp_path: Path, make_config: Any
) -> None:
    """benchmarks/bench_step.py (the suite's ``throughput``): its ranks import from the
    caller's PYTHONPATH too (on the GPU machine the carried wheels live only there; a
    folder's sitecustomize.py records each process that saw it), and a case that fails
    (fp16 on gloo, which the trainer refuses) is marked failed with its reason in the
    table while the other case keeps its numbers; exit 1."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(PROBE)
    probe, out = tmp_path / "probe.txt", tmp_path / "bench"
    config = make_config(training={"batch_size": 4})
    proc = subprocess.run(
        [sys.executable, "benchmarks/bench_step.py", "--config", str(config), "--nproc", "1",
         "--backend", "gloo", "--steps", "2", "--warmup", "1", "--repeats", "1",
         "--util-seconds", "0", "--cases", "ddp:tiny:fp16", "ddp:tiny:fp32", "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=REPO,
        env=_env(PYTHONPATH=str(site), BENCH_SITE_PROBE=str(probe)),
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "1 case(s) failed: ddp:tiny:fp16 (this)" in proc.stderr
    rank = f"{REPO / 'benchmarks' / 'bench_step.py'} --worker "  # not torchrun's `-m ...`
    workers = [line for line in probe.read_text().splitlines() if line.startswith(rank)]
    assert len(workers) == 2, probe.read_text()  # the one rank of each case
    rows = {r["case"]: r for r in strict_json(out.with_suffix(".json"))}
    assert "training.precision: fp16 needs CUDA" in rows["ddp:tiny:fp16"]["failed"]
    assert rows["ddp:tiny:fp16"]["tries"] == []
    assert rows["ddp:tiny:fp32"]["failed"] is None
    assert rows["ddp:tiny:fp32"]["tries"][0]["plain samples/s"] > 0
    table = out.with_suffix(".txt").read_text()
    assert "| this | ddp | tiny | fp16 | FAILED: training.precision: fp16 needs CUDA" in table
    fp32 = next(line for line in table.splitlines() if "| tiny | fp32 |" in line)
    assert fp32.count("|") == 13 and "FAILED" not in fp32


def test_compile_failing_on_a_reproduced_torch_bug_is_known_not_passed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``train-cuda-compile`` when the compiled run fails with inductor's stride assertion:
    the suite runs the minimal reproduction; where it fails the same way (exit 1: the torch
    bug is on this machine) the step is ``known`` with the upstream links and both errors,
    counted apart and not failing the suite; where it does not, the step fails. A FAKE of
    the two processes (the CUDA run and the reproduction), which need a GPU."""
    suite = _script("gpu_suite")
    said = ("torch.compile failed before the first step on rank(s) [0] (rank 0: AssertionError: "
            "expected size 64==64, stride 64==1 at dim=1; ...)")  # fmt: skip

    def compiled_run(*_a: Any, **_k: Any) -> Any:
        def run(_s: Any) -> dict[str, Any]:
            raise suite.StepFailed(f"train-cuda-fp32-compile: exit 1, failed: {said}")

        return run

    monkeypatch.setattr(suite, "_cuda_run", compiled_run)
    args = SimpleNamespace(budget_s=60.0, cpu=False, results_dir=tmp_path)
    s = suite.Suite(args=args, cuda=True, work=tmp_path)  # type: ignore[arg-type]
    step = next(st for st in suite.STEPS if st.name == "train-cuda-compile")
    repro = {"torch": "2.11.0+cu130", "error": "AssertionError: expected size 64==64"}
    records = {}
    for rc in (1, 0):  # the reproduction failed the same way / ran clean

        def sh(self: Any, cmd: list[str], timeout: float, rc: int = rc) -> Any:
            out = json.dumps({**repro, "reproduced": rc == 1}) + "\n"
            return subprocess.CompletedProcess(cmd, rc, out, "")

        monkeypatch.setattr(suite.Suite, "sh", sh)
        records[rc] = suite._run_step(s, step)
    known, failed = records[1], records[0]
    assert known["status"] == "known", known
    assert "https://github.com/pytorch/pytorch/issues/171622" in known["reason"]
    assert known["details"]["repro"]["reproduced"] is True
    assert known["details"]["ups"].endswith(said)
    assert failed["status"] == "failed" and "the cause is not known" in failed["reason"]
    s.results[step.name] = known
    suite.write_results(s, {"schema_version": 1})
    doc = strict_json(tmp_path / "gpu-suite.json")
    assert doc["counts"] == {"passed": 0, "failed": 0, "known": 1, "skipped": 0}
