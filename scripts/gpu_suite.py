"""GPU truth in one call: run every CUDA path of ups on this machine and write the results.

    bash scripts/gpu-suite.sh            # on the GPU machine (docs/gpu.md: the one device call)
    bash scripts/gpu-suite.sh --cpu      # anywhere: CUDA-only steps say "skipped: no CUDA"

Each step runs in its own processes under a deadline, whatever the others did, and is
recorded as passed, failed (with the reason) or skipped (with the reason), with its
duration. Results: strict JSON with the device, driver and torch/CUDA/NCCL versions, in
``--results-dir`` (default ``benchmarks/results``) and in ``$OUT`` when it is set. The
steps and what each checks are listed in docs/gpu.md. Exit 0 when no step failed, 1
otherwise, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RUNTIME_IMPORTS = (
    "yaml h5py numpy rich psutil pynvml structlog pydantic tenacity wandb fabric docker vastai"
)
"""What ups imports at run time; the carried wheels must make all of it importable."""
BAND = 0.20
"""A CUDA run's held-out rel-L2 matches CPU's when within 20% of it, per task. A first
bound, from no GPU measurement yet: tighten it from the numbers the first GPU run records."""
CUDA_TEST_FILES = (
    # The tests whose code branches on torch.cuda.is_available() (besides `-m gpu` ones).
    "tests/test_preflight_versions_gpu.py",
    "tests/test_preflight_allreduce.py",
    "tests/test_preflight_cache.py",
    "tests/test_train_precision.py",
)


class StepFailed(Exception):
    """The step ran and found something wrong: its message is the reason recorded, with
    whatever it measured before (``details``)."""

    def __init__(self, reason: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.details = details or {}


class StepKnown(StepFailed):
    """The step failed for a known cause outside ups (a torch bug that its minimal
    reproduction shows on this machine): recorded as ``known``, neither passed nor failed."""


@dataclass
class Step:
    name: str
    timeout_s: float
    cuda_only: bool
    run: Callable[[Suite], dict[str, Any]]
    summary: str


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Suite:
    args: argparse.Namespace
    cuda: bool
    work: Path
    started: float = field(default_factory=time.monotonic)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    preflight: tuple[int, dict[str, Any], str] | None = None
    """The one ``ups-preflight --json`` run's exit code, report and the step that ran it
    (:func:`_one_preflight`)."""
    port: int = field(default_factory=lambda: _free_port())
    """The master port of every run and preflight here: a free one, not 29500, since the
    ``--cpu`` mode runs beside other tests (CI's side-by-side workers) that may hold it."""

    def remaining(self) -> float:
        return self.args.budget_s - (time.monotonic() - self.started)

    def say(self, text: str) -> None:
        print(text, flush=True)
        if self.log_path is not None:
            with self.log_path.open("a") as fh:
                fh.write(text + "\n")

    def sh(self, cmd: list[str], timeout: float, **kw: Any) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` in its own session; past ``timeout`` the whole group is killed."""
        timeout = min(timeout, max(self.remaining(), 1.0))
        proc = subprocess.Popen(
            cmd, cwd=kw.pop("cwd", REPO), env=kw.pop("env", self.env), text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            raise StepFailed(
                f"timed out after {timeout:.0f} s: {' '.join(cmd)[:200]}; last output: "
                f"{(out or '')[-600:]}"
            ) from None
        if self.log_path is not None:
            with self.log_path.open("a") as fh:
                fh.write(f"$ {' '.join(cmd)}\n{out}\n")
        return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


# --- set-up: wheels, entry points ---


def _can_install_here() -> bool:
    """The carried wheels are CPython 3.12 manylinux x86_64 ones (the GPU machine's)."""
    return sys.version_info[:2] == (3, 12) and platform.machine() == "x86_64"


def _check_wheel_tags(wheels: list[Path]) -> list[str]:
    from packaging.tags import compatible_tags, cpython_tags
    from packaging.utils import parse_wheel_filename

    platforms = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
    platforms += [f"manylinux_2_{n}_x86_64" for n in range(5, 35)] + ["linux_x86_64"]
    platforms += ["manylinux1_x86_64", "manylinux2010_x86_64"]
    wanted = set(cpython_tags((3, 12), platforms=platforms))
    wanted |= set(compatible_tags((3, 12), "cp312", platforms=platforms))
    bad = []
    for wheel in wheels:
        name, _, _, tags = parse_wheel_filename(wheel.name)
        if name.startswith(("torch", "nvidia-", "triton")):
            bad.append(f"{wheel.name} must not travel (the GPU machine's own build is used)")
        elif not tags & wanted:
            bad.append(f"{wheel.name} does not install on CPython 3.12 manylinux x86_64")
    return bad


def step_wheels(s: Suite) -> dict[str, Any]:
    """Install the carried wheels (offline, no dependencies resolved, torch untouched) into
    a folder of their own, then check that everything ups imports at run time imports."""
    wheels = sorted(s.args.wheels.glob("*.whl")) if s.args.wheels.is_dir() else []
    details: dict[str, Any] = {"wheels_dir": str(s.args.wheels), "wheels": len(wheels)}
    site = s.work / "site"
    if wheels:
        bad = _check_wheel_tags(wheels)
        if bad:
            raise StepFailed("; ".join(bad))
        if _can_install_here():
            pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
            cmd = [*pip, "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(site)]
            cmd += [str(w) for w in wheels]
            proc = s.sh(cmd, 120)
            if proc.returncode != 0:
                raise StepFailed(f"pip install of the carried wheels failed: {proc.stdout[-800:]}")
            details["installed_to"] = str(site)
        else:
            details["installed_to"] = None
            details["note"] = (
                f"tags checked; not installed: this is Python {platform.python_version()} on "
                f"{platform.machine()}, the wheels are for CPython 3.12 x86_64"
            )
    probe = (
        "import importlib, sys\n"
        + "".join(f"importlib.import_module({m!r})\n" for m in RUNTIME_IMPORTS.split())
        + "import ups.train.main, ups.preflight.cli\nprint(sys.version)\n"
    )
    proc = s.sh([sys.executable, "-c", probe], 120)
    if proc.returncode != 0:
        raise StepFailed(
            f"ups does not import here ({proc.stdout.strip().splitlines()[-1:]}): carry the "
            "wheels from scripts/gpu-wheels.sh (--wheels DIR)"
        )
    details["imports"] = RUNTIME_IMPORTS.split()
    return details


def _entry_points(s: Suite) -> Path:
    """``ups``, ``ups-preflight``, ``ups-train`` from pyproject.toml, run from the source tree."""
    bindir = s.work / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    for name, target in scripts.items():
        module, func = target.split(":")
        path = bindir / name
        path.write_text(
            f"#!{sys.executable}\nimport sys\nfrom {module} import {func}\nsys.exit({func}())\n"
        )
        path.chmod(0o755)
    return bindir


# --- preflight ---


def _preflight(s: Suite, *args: str, timeout: float = 150) -> tuple[int, dict[str, Any]]:
    cmd = ["ups-preflight", "--json", "--events", "off", "--master-port", str(s.port), *args]
    proc = s.sh(cmd, timeout)
    try:
        report: dict[str, Any] = json.loads(proc.stdout[proc.stdout.index("{") :])
    except ValueError:
        raise StepFailed(f"ups-preflight printed no JSON report: {proc.stdout[-800:]}") from None
    return proc.returncode, report


def _check(report: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in report["checks"] if c["name"] == name)
    return found


def _one_preflight(s: Suite, step: str) -> tuple[int, dict[str, Any], str]:
    """``ups-preflight --json`` with every check, as a user runs it once, the cache check
    pointed at a tensor file saved after ``.cpu()``: run by the first step that asks (the
    ``preflight``, ``versions`` and ``cache-cpu-file`` steps each judge their own checks of
    this one report), then kept for the others. Returns the exit code, the report and the
    step that ran it."""
    if s.preflight is None:
        device = "cuda:0" if s.cuda else "cpu"
        path = s.work / "cache-cpu" / "latents_cpu.pt"
        _save_tensor(s, path, f"torch.randn(8, 4, device={device!r}).cpu()")
        s.preflight = (*_preflight(s, "--cache-path", str(path.parent)), step)
    return s.preflight


def step_preflight(s: Suite) -> dict[str, Any]:
    rc, report, _ = _one_preflight(s, "preflight")
    checks = {
        c["name"]: {k: c[k] for k in ("status", "message", "value")} for c in report["checks"]
    }
    # versions fails outside the supported range by design: the versions step judges it.
    failed = [
        f"{n}: {c['message']}"
        for n, c in checks.items()
        if c["status"] == "fail" and n != "versions"
    ]
    any_fail = any(c["status"] == "fail" for c in checks.values())
    if failed or rc != int(any_fail):
        raise StepFailed(f"preflight exit {rc}: " + ("; ".join(failed) or "no check failed"))
    return {"checks": checks}


def step_versions(s: Suite) -> dict[str, Any]:
    """This torch against pins.toml and the supported range: the pinned release passes;
    another one inside the range warns naming both (exit 0); outside the range fails."""
    import torch

    from ups.pins import matches
    from ups.torchcompat import in_supported_range

    pin = str(tomllib.loads((REPO / "pins.toml").read_text())["versions"]["torch"])
    running = str(torch.__version__)
    drift = not matches(pin, running)
    rc, report, by = _one_preflight(s, "versions")
    check = _check(report, "versions")
    others_failed = any(c["status"] == "fail" for c in report["checks"] if c["name"] != "versions")
    torch_status = check["details"]["components"]["torch"]["status"]
    details = {"pinned_torch": pin, "running_torch": running, "drift": drift,
               "supported": check["details"].get("supported_torch"),
               "status": check["status"], "message": check["message"],
               "preflight_run_by": by}  # fmt: skip
    # The exit code is the whole report's: 1 when any check failed (the preflight step names
    # another check's failure); for versions alone it is what the range and the pin say.
    if not in_supported_range(running):
        want = (1, "fail", "fail")
    elif drift:
        want = (int(others_failed), "warn", "warn")
    else:  # CUDA/cuDNN may still differ from the pins: warn
        want = (int(others_failed), check["status"], "pass")
    wanted = f"torch: pinned {pin}, running {running}" if want[1] == "warn" else ""
    if (rc, check["status"], torch_status) != want or wanted not in check["message"]:
        raise StepFailed(
            f"torch {running} vs pin {pin}: expected exit {want[0]} and {want[2]} for torch; "
            f"got {rc}, {torch_status}: {check['message']}"
        )
    return details


def _save_tensor(s: Suite, path: Path, expr: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    code = f"import torch; torch.save({{'latents': {expr}}}, {str(path)!r})"
    proc = s.sh([sys.executable, "-c", code], 120)
    if proc.returncode != 0:
        raise StepFailed(f"could not save {path}: {proc.stdout[-600:]}")


def step_cache_cpu_file(s: Suite) -> dict[str, Any]:
    _, report, by = _one_preflight(s, "cache-cpu-file")
    check = _check(report, "cache")
    path = s.work / "cache-cpu" / "latents_cpu.pt"
    if check["status"] != "pass":
        raise StepFailed(f"a .cpu() tensor file should pass: {check['message']}")
    return {"file": str(path), "message": check["message"], "preflight_run_by": by}


def step_cache_cuda_file(s: Suite) -> dict[str, Any]:
    path = s.work / "cache-cuda" / "latents_cuda0.pt"
    _save_tensor(s, path, "torch.randn(8, 4, device='cuda:0')")
    rc, report = _preflight(s, "--only", "cache", "--cache-path", str(path.parent), timeout=90)
    check = _check(report, "cache")
    if rc != 1 or check["status"] != "fail" or str(path) not in check["message"]:
        raise StepFailed(f"a cuda:0 tensor file should fail naming {path}: {check['message']}")
    return {"file": str(path), "message": check["message"], "hint": check.get("hint")}


# --- tests ---


def step_pytest_cuda(s: Suite) -> dict[str, Any]:
    workers = str(min(8, os.cpu_count() or 1))
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", workers, "-rfEs"]
    # `-m gpu` over the files that hold gpu-marked tests only: collecting every test file
    # would import the dev-only packages (jsonschema) the GPU machine does not carry.
    marked = sorted(
        str(f.relative_to(REPO))
        for f in (REPO / "tests").glob("test_*.py")
        if "mark.gpu" in f.read_text()
    )
    runs = {
        "-m gpu": [*base, "-m", "gpu", *marked],
        "CUDA-branching files": [*base, *CUDA_TEST_FILES],
    }
    details: dict[str, Any] = {}
    bad = []
    for label, cmd in runs.items():
        proc = s.sh(cmd, 150)
        summary = proc.stdout.strip().splitlines()[-25:]
        details[label] = {"exit_code": proc.returncode, "summary": summary}
        if proc.returncode != 0:
            bad.append(f"pytest {label} exit {proc.returncode}: {summary[-1] if summary else ''}")
    if bad:
        raise StepFailed("; ".join(bad))
    return details


# --- training ---


def step_data(s: Suite) -> dict[str, Any]:
    out = s.work / "data"
    if s.cuda:
        code = "from pathlib import Path; from ups.data.synth import synthesize; "
        code += f"synthesize(Path({str(out)!r}))"
    else:  # tiny grids: CI's CPU runs them in seconds
        code = (
            "from pathlib import Path; from ups.data.synth import Sizes, synthesize; "
            f"synthesize(Path({str(out)!r}), sizes=Sizes(n_1d=24, x_1d=64, n_darcy=48, "
            "hw_darcy=16, n_dr=4, hw_dr=16))"
        )
    proc = s.sh([sys.executable, "-c", code], 180)
    if proc.returncode != 0:
        raise StepFailed(f"demo data synthesis failed: {proc.stdout[-800:]}")
    return {"dir": str(out), "files": sorted(p.name for p in out.iterdir())}


def _config(s: Suite, name: str, backend: str, sets: dict[str, Any], faults: list[Any]) -> Path:
    import yaml

    cfg = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    for task in cfg["tasks"]:
        task["path"] = str(s.work / "data" / Path(task["path"]).name)
    cfg["run"]["output_dir"] = str(s.work / "runs" / name)
    cfg["distributed"] = {"backend": backend, "nproc_per_node": 1, "master_port": s.port}
    cfg["wandb"] = {"mode": "disabled"}
    training = cfg["training"]
    training.update(max_steps=s.args.train_steps, log_every=10)
    if not s.cuda:
        cfg["model"].update(latent_dim=16, depth=1, heads=2)
        training.update(batch_size=8)
    for key, value in sets.items():
        section, leaf = key.split(".")
        cfg.setdefault(section, {})[leaf] = value
    if faults:
        cfg["faults"] = faults
    path = s.work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _train(
    s: Suite, name: str, backend: str, sets: dict[str, Any], faults: list[Any] | None = None
) -> tuple[dict[str, Any], Path]:
    """One torchrun rank of the real trainer; returns outcome.json and the run directory."""
    config = _config(s, name, backend, sets, faults or [])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
           "--monitor-interval=0.2", "-m", "ups.train.main", str(config)]  # fmt: skip
    proc = s.sh(cmd, 240)
    runs = [p for p in (s.work / "runs" / name).iterdir() if p.is_dir() and not p.is_symlink()]
    outcome_file = runs[0] / "outcome.json" if runs else None
    if outcome_file is None or not outcome_file.is_file():
        raise StepFailed(f"{name}: no outcome.json (exit {proc.returncode}): {proc.stdout[-800:]}")
    outcome: dict[str, Any] = json.loads(outcome_file.read_text())
    if proc.returncode != 0 or outcome["outcome"] != "finished":
        raise StepFailed(
            f"{name}: exit {proc.returncode}, {outcome['outcome']}: {outcome['reason']}"
        )
    return outcome, runs[0]


def _summary(outcome: dict[str, Any]) -> dict[str, Any]:
    keep = ("outcome", "reason", "step", "metrics", "training")
    return {k: outcome.get(k) for k in keep}


def step_burn_in(s: Suite) -> dict[str, Any]:
    """The burn-in rows (docs/burn-in.md) on this device, in bf16 on CUDA: each figure with
    its known-good value and ratio, for the known-good table's row of this device."""
    sets = {"training.precision": "bf16"} if s.cuda else {}
    config = _config(s, "burn-in", "nccl" if s.cuda else "gloo", sets, [])
    start = time.monotonic()
    rc, report = _preflight(
        s, "--config", str(config), "--only", "burnin", "--burn-in", "warn", timeout=150
    )
    wall = time.monotonic() - start
    figures = {
        c["name"]: {
            "value": c["value"],
            "unit": c["unit"],
            "known_good": c["details"].get("known_good"),
            "ratio": c["details"].get("ratio"),
            "status": c["status"],
            "message": c["message"],
        }
        for c in report["checks"]
        if c["name"] != "config"
    }
    if rc != 0:
        failed = [f"{n}: {f['message']}" for n, f in figures.items() if f["status"] == "fail"]
        raise StepFailed(f"burn-in exit {rc}: " + "; ".join(failed))
    rows_s = round(sum(c["duration_s"] for c in report["checks"] if c["name"] != "config"), 3)
    return {"figures": figures, "rows_s": rows_s, "wall_s": round(wall, 3)}


def step_train_cpu(s: Suite) -> dict[str, Any]:
    """The CPU reference: the same config, seed and steps on gloo."""
    outcome, _ = _train(s, "train-cpu", "gloo", {})
    return _summary(outcome)


def _band(s: Suite, metrics: dict[str, float]) -> dict[str, Any]:
    ref = s.results.get("train-cpu", {})
    if ref.get("status") != "passed":
        raise StepFailed("no CPU reference: step train-cpu did not pass")
    cpu = ref["details"]["metrics"]
    out = {}
    for key, value in cpu.items():
        if not key.endswith("/rel_l2"):  # the held-out error, not the untrained baseline
            continue
        ratio = metrics[key] / value
        out[key] = {"cpu": value, "cuda": metrics[key], "ratio": ratio,
                    "inside": abs(ratio - 1) <= BAND}  # fmt: skip
    return out


def _cuda_run(precision: str, *, band: bool, **extra: Any) -> Callable[[Suite], dict[str, Any]]:
    def run(s: Suite) -> dict[str, Any]:
        sets = {"training.precision": precision, **extra}
        outcome, _ = _train(s, f"train-cuda-{precision}{'-compile' if extra else ''}", "nccl", sets)
        details = _summary(outcome)
        details["band"] = _band(s, outcome["metrics"])
        if outcome["training"]["precision"] != precision:
            raise StepFailed(f"outcome says precision {outcome['training']['precision']}")
        if extra and not outcome["training"]["compiled"]:
            raise StepFailed("compile: true but the outcome says the model was not compiled")
        outside = {k: v for k, v in details["band"].items() if not v["inside"]}
        if band and outside:
            raise StepFailed(f"held-out error outside CPU's ±{BAND:.0%} band: {outside}")
        return details

    return run


def _events(run_dir: Path, name: str) -> list[dict[str, Any]]:
    found = []
    for line in (run_dir / "logs" / "rank0.jsonl").read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("event") == name:
            found.append(event)
    return found


def step_oom(s: Suite) -> dict[str, Any]:
    """A real CUDA out-of-memory error at one step (fault ``alloc``: half the free memory
    held, then more than the device has): that step is skipped, its memory is released,
    the run finishes."""
    outcome, run_dir = _train(s, "oom-real", "nccl", {}, [{"kind": "alloc", "rank": 0, "step": 3}])
    fault, skipped = _events(run_dir, "fault_alloc"), _events(run_dir, "step_skipped")
    if len(fault) != 1 or len(skipped) != 1:
        raise StepFailed(f"expected one alloc fault and one skipped step, got {len(fault)} and "
                         f"{len(skipped)}: {outcome['reason']}")  # fmt: skip
    before, after = fault[0]["allocated_bytes"], skipped[0]["cuda_allocated_bytes"]
    details = {
        **_summary(outcome),
        "skip_reason": skipped[0]["reason"],
        "allocated_before_bytes": before,
        "allocated_after_skip_bytes": after,
        "reserved_after_skip_bytes": skipped[0]["cuda_reserved_bytes"],
        "device_total_bytes": fault[0]["total_bytes"],
    }
    if "out of memory" not in skipped[0]["reason"].lower():
        raise StepFailed(f"the skip does not name the out-of-memory error: {skipped[0]['reason']}")
    if after > before + (64 << 20):
        raise StepFailed(f"memory not released after the skip: {before} bytes allocated before "
                         f"the fault, {after} after")  # fmt: skip
    return details


def step_throughput(s: Suite) -> dict[str, Any]:
    """benchmarks/bench_step.py: the ups step (oom_policy skip and fail) vs a plain loop on
    the same model and batches, in rotating order, one rank; NVML utilisation on CUDA."""
    out = s.work / "throughput"
    config = _config(s, "throughput", "nccl" if s.cuda else "gloo", {}, [])
    if s.cuda:
        cases = ["ddp:demo:fp32", "ddp:100m:fp32", "ddp:100m:bf16"]
        sizing = ["--steps", "30", "--warmup", "5", "--util-seconds", "3"]
    else:
        cases = ["ddp:tiny:fp32"]
        sizing = ["--steps", "4", "--warmup", "1", "--util-seconds", "0"]
    cmd = [sys.executable, str(REPO / "benchmarks" / "bench_step.py"), "--config", str(config),
           "--nproc", "1", "--backend", "nccl" if s.cuda else "gloo", "--repeats", "1",
           *sizing, "--cases", *cases, "--out", str(out)]  # fmt: skip
    proc = s.sh(cmd, 300)
    table = out.with_suffix(".txt")
    if not table.is_file():  # no case's numbers at all
        raise StepFailed(f"bench_step failed (exit {proc.returncode}): {proc.stdout[-800:]}")
    results = json.loads(out.with_suffix(".json").read_text())
    details = {"table": table.read_text().splitlines(), "cases": results}
    failed = [f"{r['case']}: {r['failed']}" for r in results if r.get("failed")]
    if proc.returncode != 0 or failed:
        raise StepFailed(f"bench_step exit {proc.returncode}; failed case(s), the others' "
                         f"numbers kept: {'; '.join(failed)[:1500]}", details)  # fmt: skip
    return details


KNOWN_COMPILE_BUG = (
    "a torch bug, not ups's: inductor predicts a channels-last gradient for a transposed "
    "conv's channels-last input where the CUDA backend returns it contiguous "
    "(https://github.com/pytorch/pytorch/issues/171622, "
    "https://github.com/pytorch/pytorch/issues/197514)"
)


def step_compile(s: Suite) -> dict[str, Any]:
    """``training.compile: true`` on CUDA. When it fails with inductor's stride assertion,
    the minimal reproduction (scripts/repro_compile_conv_stride.py) runs on this machine:
    if it fails the same way, the step is ``known`` (the cause is torch's), not passed."""
    try:
        return _cuda_run("fp32", band=False, **{"training.compile": True})(s)
    except StepFailed as exc:
        if "expected size" not in str(exc) or "stride" not in str(exc):
            raise
        failure = str(exc)
    proc = s.sh([sys.executable, str(REPO / "scripts" / "repro_compile_conv_stride.py")], 300)
    lines = proc.stdout.strip().splitlines()
    try:
        repro = json.loads(lines[-1])
    except (IndexError, ValueError):
        repro = {"output": proc.stdout[-800:]}
    details = {"ups": failure, "repro": repro, "repro_exit": proc.returncode}
    if proc.returncode == 1:
        raise StepKnown(f"{KNOWN_COMPILE_BUG}; scripts/repro_compile_conv_stride.py reproduces "
                        f"it here: {repro.get('error')}", details)  # fmt: skip
    raise StepFailed(f"{failure} (the torch bug's reproduction did not fail here: exit "
                     f"{proc.returncode}, so the cause is not known)", details)  # fmt: skip


STEPS: tuple[Step, ...] = (
    # Ordered so that a run cut short by --budget-s loses the least: the CUDA trainer, the
    # OOM and the throughput come before fp16, the test files and compile.
    Step("wheels", 150, False, step_wheels, "install the carried wheels; ups imports"),
    Step("preflight", 180, False, step_preflight, "ups-preflight --json, every check, once"),
    Step("versions", 60, False, step_versions, "torch vs pins.toml (warns) and the range (fails)"),
    Step("cache-cpu-file", 120, False, step_cache_cpu_file, "a .cpu() tensor file passes"),
    Step("cache-cuda-file", 120, True, step_cache_cuda_file, "a cuda:0 tensor file fails"),
    Step("data", 180, False, step_data, "demo data (tiny grids with --cpu)"),
    Step("burn-in", 180, False, step_burn_in, "burn-in figures vs known-good (bf16 on CUDA)"),
    Step("train-cpu", 240, False, step_train_cpu, "the CPU reference run (gloo)"),
    Step("train-cuda-fp32", 240, True, _cuda_run("fp32", band=True), "nccl, fp32, band vs CPU"),
    Step("train-cuda-bf16", 240, True, _cuda_run("bf16", band=True), "nccl, bf16, band vs CPU"),
    Step("oom-real", 240, True, step_oom, "a real CUDA OOM: step skipped, memory released"),
    Step("throughput", 360, False, step_throughput, "ups step vs plain loop, NVML util"),
    Step("train-cuda-fp16", 240, True, _cuda_run("fp16", band=False), "fp16 with its scaler"),
    Step("pytest-cuda", 300, True, step_pytest_cuda, "pytest -m gpu + CUDA-branching tests"),
    Step("train-cuda-compile", 360, True, step_compile, "compile: true (torch bugs: known)"),
)


# --- facts, results ---


def facts(cuda: bool) -> dict[str, Any]:
    """Device, driver and versions, for the results' header."""
    import torch

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "cuda": torch.version.cuda,
        "nccl": None,
        "cudnn": None,
        "device": None,
        "driver": None,
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
    }
    if cuda:
        info["device"] = torch.cuda.get_device_name(0)
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))  # type: ignore[no-untyped-call]  # unannotated in torch
        info["cudnn"] = torch.backends.cudnn.version()  # type: ignore[no-untyped-call]  # unannotated in torch
        try:
            import pynvml

            pynvml.nvmlInit()
            info["driver"] = pynvml.nvmlSystemGetDriverVersion()
            pynvml.nvmlShutdown()
        except Exception as exc:  # recorded, never fatal: the facts are a header
            info["driver"] = f"unknown ({exc})"
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    info["commit"] = commit.stdout.strip() if commit.returncode == 0 else None
    return info


def finite(value: Any) -> Any:
    """``value`` with every NaN/inf float made None: the results stay strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def write_results(s: Suite, head: dict[str, Any]) -> list[Path]:
    """Strict JSON (no NaN) into --results-dir and $OUT; rewritten after every step."""
    doc = {**head, "steps": list(s.results.values()),
           "counts": {k: sum(r["status"] == k for r in s.results.values())
                      for k in ("passed", "failed", "known", "skipped")}}  # fmt: skip
    text = json.dumps(finite(doc), indent=2, allow_nan=False, default=str) + "\n"
    name = "gpu-suite-cpu.json" if s.args.cpu else "gpu-suite.json"
    dirs = [s.args.results_dir] + ([Path(os.environ["OUT"])] if os.environ.get("OUT") else [])
    written = []
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
        (d / name).write_text(text)
        written.append(d / name)
        table = s.results.get("throughput", {}).get("details", {}).get("table")
        if table:
            (d / name.replace("suite", "step").replace(".json", ".txt")).write_text(
                "\n".join(table) + "\n"
            )
    return written


def _run_step(s: Suite, step: Step) -> dict[str, Any]:
    record: dict[str, Any] = {"name": step.name, "summary": step.summary}
    start = time.monotonic()
    if step.cuda_only and not s.cuda:
        record.update(status="skipped", reason="no CUDA", details={})
    elif s.remaining() < 15:
        record.update(status="skipped", reason="the suite's time budget is spent", details={})
    else:
        try:
            record.update(status="passed", reason=None, details=step.run(s))
        except StepKnown as exc:
            record.update(status="known", reason=str(exc), details=exc.details)
        except StepFailed as exc:
            record.update(status="failed", reason=str(exc), details=exc.details)
        except Exception as exc:  # a bug in the step itself: recorded, the next step runs
            record.update(status="failed", reason=f"{type(exc).__name__}: {exc}",
                          details={"traceback": traceback.format_exc()[-3000:]})  # fmt: skip
    record["duration_s"] = round(time.monotonic() - start, 2)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-suite.sh", description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="no GPU: CUDA-only steps are skipped")
    parser.add_argument("--wheels", type=Path, default=REPO / ".gpu-wheels",
                        help="folder of carried wheels (scripts/gpu-wheels.sh)")  # fmt: skip
    parser.add_argument("--results-dir", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--work", type=Path, help="scratch folder (default: a new one in /tmp)")
    parser.add_argument(
        "--budget-s", type=float, default=560.0, help="deadline of the whole suite in seconds"
    )
    parser.add_argument("--train-steps", type=int, help="steps per trainer run")
    parser.add_argument("--only", help="comma-separated step names (debugging)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))  # the steps read ups.pins and ups.torchcompat (stdlib only)
    names = [st.name for st in STEPS]
    only = [n for n in (args.only or "").split(",") if n]
    unknown = sorted(set(only) - set(names))
    if unknown:
        parser.error(f"unknown step(s) {', '.join(unknown)}; choose from {', '.join(names)}")
    import torch

    cuda = not args.cpu and torch.cuda.is_available()
    if not args.cpu and not cuda:
        parser.error("torch sees no CUDA device here; on a host without a GPU run with --cpu")
    args.train_steps = args.train_steps or (150 if cuda else 6)
    work = args.work or Path(tempfile.mkdtemp(prefix="ups-gpu-suite-"))
    work.mkdir(parents=True, exist_ok=True)
    s = Suite(args=args, cuda=cuda, work=work)
    s.log_path = Path(os.environ["OUT"]) / "gpu-suite.log" if os.environ.get("OUT") else None
    bindir = _entry_points(s)
    site = work / "site"
    s.env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "UPS_"))},
        "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]),
        "PYTHONUNBUFFERED": "1",
        "WANDB_MODE": "disabled",
        # The CPU reference run and the loader share the machine's cores with nothing else.
        "OMP_NUM_THREADS": str(min(8, os.cpu_count() or 1)),
    }
    head = {
        "schema_version": 1,
        "suite": "scripts/gpu-suite.sh" + (" --cpu" if args.cpu else ""),
        "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "facts": facts(cuda),
        "cpu_reference": "step train-cpu: the same config, seed and steps on gloo, in this run",
        "band": BAND,
    }
    s.say(f"ups GPU suite: {head['facts']['device'] or 'no CUDA (--cpu)'}, torch "
          f"{head['facts']['torch']}, work dir {work}")  # fmt: skip
    for step in STEPS:
        if only and step.name not in only:
            continue
        s.say(f"== {step.name}: {step.summary}")
        record = _run_step(s, step)
        s.results[step.name] = record
        reason = f": {record['reason']}" if record["reason"] else ""
        s.say(f"   {record['status']}{reason} ({record['duration_s']:.1f} s)")
        written = write_results(s, head)
    s.say("results: " + ", ".join(map(str, written)))
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if any(r["status"] == "failed" for r in s.results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
