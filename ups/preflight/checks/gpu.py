"""GPU visibility: expected count vs torch vs NVML vs CUDA_VISIBLE_DEVICES, plus GPU health."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ups.console.units import human_bytes
from ups.preflight.nvml import GpuInfo, NvmlFacts, read_nvml
from ups.preflight.options import Context
from ups.preflight.result import CheckResult, Status, worst

NO_GPU = "no GPU on this host; training will use gloo on CPU"


@dataclass(kw_only=True, slots=True)
class GpuFacts:
    torch_count: int
    torch_cuda: str | None
    """CUDA version torch was built for (None: CPU build)."""
    visible_devices: str | None
    """``CUDA_VISIBLE_DEVICES`` as set (None: unset)."""
    nvml: NvmlFacts


def gather(env: Mapping[str, str]) -> GpuFacts:
    import torch

    return GpuFacts(
        torch_count=torch.cuda.device_count(),
        torch_cuda=torch.version.cuda,
        visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
        nvml=read_nvml(),
    )


def _visible_count(visible: str | None) -> int | None:
    if visible is None:
        return None
    return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])


def job_gpus(gpus: list[Any], visible: str | None) -> list[Any]:
    """The NVML GPUs the job will use: those ``CUDA_VISIBLE_DEVICES`` names by index (what
    ``--gpus 0,1`` sets), or all of them when it is unset or names GPUs by UUID. Another
    job's processes on a GPU this job does not use are not this job's problem."""
    if visible is None:
        return gpus
    wanted = [d.strip() for d in visible.split(",") if d.strip()]
    if not all(d.isdigit() for d in wanted):
        return gpus
    by_index = {g.index: g for g in gpus}
    return [by_index[int(d)] for d in wanted if int(d) in by_index]


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split(".") if p.isdigit())


Problem = tuple[Status, str, str]
"""(status, what is wrong, the fix)."""


def evaluate(facts: GpuFacts, expected: int | None) -> CheckResult:
    """Judge the gathered facts (pure, so every branch is testable without a GPU)."""
    nvml = facts.nvml
    nvml_count = len(nvml.gpus) if nvml.available else None
    details: dict[str, Any] = {
        "expected": expected,
        "torch_count": facts.torch_count,
        "nvml_count": nvml_count,
        "cuda_visible_devices": facts.visible_devices,
        "torch_cuda": facts.torch_cuda,
        "driver": nvml.driver,
        "driver_cuda": nvml.cuda_driver,
        "nvml_error": nvml.error,
        "gpus": [asdict(g) for g in nvml.gpus],
    }
    seen = facts.torch_count
    if seen == 0 and not expected:
        return CheckResult(
            name="gpu",
            status=Status.SKIP,
            message=NO_GPU,
            value=0,
            threshold=expected,
            unit="GPUs",
            details=details,
        )
    # Health only of the GPUs this job uses (--gpus / CUDA_VISIBLE_DEVICES): another job's
    # leftovers on GPU 5 are not this job's problem.
    used_gpus = job_gpus(nvml.gpus, facts.visible_devices)
    details["job_gpus"] = [g.index for g in used_gpus]
    problems = [
        *_count_problems(facts, expected, nvml_count),
        *_cuda_problems(facts.torch_cuda, nvml.cuda_driver),
        *(p for g in used_gpus for p in _health_problems(g)),
    ]
    return CheckResult(
        name="gpu",
        status=worst([s for s, _, _ in problems]),
        message="; ".join(m for _, m, _ in problems) or _summary(facts, used_gpus),
        value=seen,
        threshold=expected,
        unit="GPUs",
        hint="; ".join(dict.fromkeys(h for _, _, h in problems)) or None,
        details=details,
    )


def _count_problems(facts: GpuFacts, expected: int | None, nvml_count: int | None) -> list[Problem]:
    """torch sees fewer GPUs than expected, or a different number than NVML / the env lists."""
    seen = facts.torch_count
    problems: list[Problem] = []
    if expected and seen < expected:
        why = ""
        if facts.torch_cuda is None:
            why = " (torch is a CPU build)"
        elif nvml_count:
            why = f" although NVML sees {nvml_count} (driver/CUDA mismatch or CUDA_VISIBLE_DEVICES)"
        problems.append(
            (
                Status.FAIL,
                f"expected {expected} GPU(s), torch sees {seen}{why}",
                "run on a host with the GPUs the config asks for, or lower "
                "distributed.nproc_per_node / --nproc-per-node",
            )
        )
    visible = _visible_count(facts.visible_devices)
    limit = visible if visible is not None else nvml_count
    if limit is not None and seen != limit:
        source = "CUDA_VISIBLE_DEVICES" if visible is not None else "NVML"
        problems.append(
            (
                Status.FAIL,
                f"torch sees {seen} GPU(s) but {source} lists {limit}",
                "check the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES; the torch CUDA build "
                "may be newer than the driver supports",
            )
        )
    return problems


def _cuda_problems(torch_cuda: str | None, driver_cuda: str | None) -> list[Problem]:
    """torch built for a newer CUDA than the driver supports (major: fail, minor: warn)."""
    if not (torch_cuda and driver_cuda):
        return []
    built, driver = _version_tuple(torch_cuda), _version_tuple(driver_cuda)
    if built[:1] > driver[:1]:
        return [
            (
                Status.FAIL,
                f"torch built for CUDA {torch_cuda}, driver supports {driver_cuda}",
                "use a host with a newer NVIDIA driver",
            )
        ]
    if built[:2] > driver[:2]:
        return [
            (
                Status.WARN,
                f"torch built for CUDA {torch_cuda}, driver supports only "
                f"{driver_cuda} (minor-version compatibility)",
                "prefer a host whose driver supports the image's CUDA version",
            )
        ]
    return []


def _health_problems(g: GpuInfo) -> list[Problem]:
    """One GPU: leftover processes holding memory (warn), ECC or remap trouble (fail)."""
    problems: list[Problem] = []
    if g.processes:
        used = sum(p["used_bytes"] or 0 for p in g.processes)
        pids = ",".join(str(p["pid"]) for p in g.processes)
        problems.append(
            (
                Status.WARN,
                f"GPU {g.index} already has {len(g.processes)} process(es) "
                f"holding {human_bytes(used)} (pid {pids})",
                f"stop the leftover processes: kill {pids.replace(',', ' ')}",
            )
        )
    if g.ecc_uncorrected:
        problems.append(
            (
                Status.FAIL,
                f"GPU {g.index} has {g.ecc_uncorrected} uncorrected ECC errors",
                "destroy this instance and rent another host",
            )
        )
    if g.retired_pages_pending or g.row_remap_pending or g.row_remap_failure:
        problems.append(
            (
                Status.FAIL,
                f"GPU {g.index} has pending page retirement / row remap (needs a GPU reset)",
                "destroy this instance and rent another host",
            )
        )
    return problems


def _summary(facts: GpuFacts, used_gpus: list[GpuInfo]) -> str:
    """What a healthy host shows: count, models, least free memory, driver."""
    nvml = facts.nvml
    names = sorted({g.name for g in used_gpus})
    summary = f"{facts.torch_count} GPU(s) visible" + (f": {', '.join(names)}" if names else "")
    if facts.visible_devices is not None and used_gpus:
        summary += f" (GPUs {','.join(str(g.index) for g in used_gpus)} of {len(nvml.gpus)})"
    if used_gpus:
        free = min(g.memory_free for g in used_gpus)
        summary += f", least free memory {human_bytes(free)}"
    if nvml.driver:
        summary += f", driver {nvml.driver} (CUDA {nvml.cuda_driver})"
    return summary


def run(ctx: Context) -> CheckResult:
    facts = gather(ctx.env)
    expected = ctx.expected_gpus
    if expected is None and facts.torch_count and ctx.nproc_per_node:
        # backend "auto" on a GPU host means nccl: one GPU per worker.
        expected = ctx.nproc_per_node
    return evaluate(facts, expected)
