"""Expected all-reduce bus bandwidth (large messages) per GPU model and count."""

from __future__ import annotations

from dataclasses import dataclass

FLOOR_FACTOR = 0.9
"""Fail below 0.9x the expected bandwidth, like nccl-tests' ``NCCL_TESTS_MIN_BW``."""


@dataclass(frozen=True, slots=True)
class Expected:
    label: str
    must: tuple[str, ...]
    """Substrings the NVML GPU name must contain."""
    must_not: tuple[str, ...]
    count: int
    busbw_gbps: float


TABLE: tuple[Expected, ...] = (
    Expected("8x H100 SXM", ("H100",), ("PCIe", "NVL"), 8, 460.0),
    Expected("8x H200", ("H200",), (), 8, 430.0),
    Expected("8x A100 SXM", ("A100-SXM",), (), 8, 228.0),
    Expected("2x H100 PCIe with NVLink bridge", ("H100", "PCIe"), (), 2, 116.0),
)


def lookup(gpu_name: str, count: int) -> Expected | None:
    """The table row for ``count`` GPUs named ``gpu_name``, or None when there is none."""
    for row in TABLE:
        if (
            row.count == count
            and all(s in gpu_name for s in row.must)
            and not any(s in gpu_name for s in row.must_not)
        ):
            return row
    return None


def floor_gbps(gpu_name: str, count: int, override: float | None) -> tuple[float | None, str]:
    """The busbw floor and where it came from; ``(None, reason)`` when nothing applies."""
    if override is not None:
        return override, "set by --min-busbw / preflight.min_busbw_gbps"
    row = lookup(gpu_name, count)
    if row is None:
        return None, f"no reference bandwidth for {count}x {gpu_name}; pass --min-busbw to gate"
    return round(row.busbw_gbps * FLOOR_FACTOR, 1), (
        f"0.9x the {row.busbw_gbps:g} GB/s expected for {row.label}"
    )
