"""Known-good burn-in figures per GPU model: the best published measurements, not the spec.

Every number carries its source. A model not in the table gets no floor: its figures are
still measured and recorded (the host ledger), never refused. All-reduce bus bandwidth
has its own table (:mod:`ups.preflight.thresholds`). A run's own figures (the data loader,
samples/s of its model) have no published value: ``preflight.known_good`` gives them.
"""

from __future__ import annotations

from dataclasses import dataclass

STAS00 = "stas00/ml-engineering compute/accelerator/README.md (maximum achievable matmul FLOPS)"
ZZC = "zzc0721/torch-performance-test-data"


@dataclass(frozen=True, slots=True)
class KnownGood:
    label: str
    """How the message names the model ("an RTX 4090")."""
    must: tuple[str, ...]
    """Substrings the device name (``torch.cuda.get_device_name``) must contain."""
    must_not: tuple[str, ...]
    tflops: dict[str, float]
    """Best achieved dense matmul TFLOP/s by precision (``bf16``, ``fp16``, ``fp32``)."""
    source: str
    h2d_gbps: float | None = None
    """Pinned host-to-device copy GB/s; None where nothing is published."""


TABLE: tuple[KnownGood, ...] = (
    KnownGood("an H100 SXM", ("H100",), ("PCIe", "NVL"), {"bf16": 795.0}, f"{STAS00}: 80% of 989"),
    KnownGood("an A100 SXM", ("A100", "SXM"), (), {"bf16": 271.0}, f"{STAS00}: 87% of 312"),
    KnownGood("an A100 PCIe", ("A100", "PCIe"), (), {"bf16": 253.0}, f"{STAS00}: 81% of 312"),
    KnownGood(
        "an RTX 4090", ("4090",), (), {"bf16": 165.0}, f"{ZZC} issue 78: 151-165 at 2048-10240"
    ),
    KnownGood(
        "an RTX 5090", ("5090",), (), {"bf16": 240.0}, f"{ZZC} issue 96 (179 on another: #200)"
    ),
)


def lookup(device_name: str | None) -> KnownGood | None:
    """The table row for ``device_name`` (None: the CPU), or None when there is none."""
    if device_name is None:
        return None
    for row in TABLE:
        if all(s in device_name for s in row.must) and not any(
            s in device_name for s in row.must_not
        ):
            return row
    return None


def matmul_tflops(device_name: str | None, precision: str) -> tuple[float | None, str]:
    """The known-good matmul TFLOP/s for ``precision`` and how the message names it."""
    row = lookup(device_name)
    if row is None or precision not in row.tflops:
        return None, device_name or "this CPU"
    return row.tflops[precision], row.label
