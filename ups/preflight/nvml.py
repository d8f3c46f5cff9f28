"""What NVML (nvidia-ml-py) says about the GPUs, without creating a CUDA context."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any


@dataclass(kw_only=True, slots=True)
class GpuInfo:
    index: int
    name: str
    memory_total: int
    memory_free: int
    processes: list[dict[str, Any]] = field(default_factory=list)
    """Compute processes already holding memory on this GPU: ``{"pid", "used_bytes"}``."""
    ecc_uncorrected: int | None = None
    """Volatile uncorrected ECC errors since the driver loaded; None where NVML has none."""
    retired_pages_pending: bool | None = None
    row_remap_failure: bool | None = None
    row_remap_pending: bool | None = None


@dataclass(kw_only=True, slots=True)
class NvmlFacts:
    available: bool
    error: str | None = None
    driver: str | None = None
    cuda_driver: str | None = None
    """Highest CUDA version the driver supports, like ``"12.8"``."""
    gpus: list[GpuInfo] = field(default_factory=list)


def _optional(fn: Any, *args: Any) -> Any:
    """NVML calls that are unsupported on some GPUs raise; those facts are just unknown."""
    try:
        return fn(*args)
    except Exception:  # pynvml raises NVMLError_NotSupported and friends
        return None


def read_nvml() -> NvmlFacts:
    """Query NVML once; ``available=False`` with the reason when it does not initialise."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # no driver / library: a normal state on a CPU host
        return NvmlFacts(available=False, error=f"{type(exc).__name__}: {exc}")
    try:
        facts = NvmlFacts(available=True)
        facts.driver = str(_optional(pynvml.nvmlSystemGetDriverVersion))
        code = _optional(pynvml.nvmlSystemGetCudaDriverVersion)
        if code:
            facts.cuda_driver = f"{code // 1000}.{code % 1000 // 10}"
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            info = GpuInfo(
                index=i,
                name=str(pynvml.nvmlDeviceGetName(h)),
                memory_total=int(mem.total),
                memory_free=int(mem.free),
            )
            procs = _optional(pynvml.nvmlDeviceGetComputeRunningProcesses, h) or []
            info.processes = [{"pid": p.pid, "used_bytes": p.usedGpuMemory} for p in procs]
            info.ecc_uncorrected = _optional(
                pynvml.nvmlDeviceGetTotalEccErrors,
                h,
                pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                pynvml.NVML_VOLATILE_ECC,
            )
            pending = _optional(pynvml.nvmlDeviceGetRetiredPagesPendingStatus, h)
            info.retired_pages_pending = None if pending is None else bool(pending)
            remap = _optional(pynvml.nvmlDeviceGetRemappedRows, h)
            if remap is not None:
                # (corrected rows, uncorrected rows, pending, failure)
                info.row_remap_pending = bool(remap[2])
                info.row_remap_failure = bool(remap[3])
            facts.gpus.append(info)
        return facts
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
