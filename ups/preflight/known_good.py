"""Known-good burn-in figures per GPU model: the best published or measured values, not the spec.

One device name finds one row (:func:`lookup`), and every burn-in figure asks that row
through :func:`known_good`, so a device is named the same way in every figure's message.
A row holds points, each with its source: published measurements, and measurements of ups's
own (the GPU suite's results in benchmarks/results/). A figure's known-good value is its
best point. A model not in the table gets no floor: its figures are still measured and
recorded (the host ledger), never refused. All-reduce bus bandwidth has its own table
(:mod:`ups.preflight.thresholds`). A ``step`` point holds only for the workload it was
measured on (:func:`ups.preflight.figures.workload`: model, tasks, batch, precision); for
any other run ``preflight.known_good`` gives it.
"""

from __future__ import annotations

from dataclasses import dataclass

STAS00 = "stas00/ml-engineering compute/accelerator/README.md (maximum achievable matmul FLOPS)"
ZZC = "zzc0721/torch-performance-test-data"
H100_RUN = (
    "ups GPU suite on an NVIDIA H100 80GB HBM3 (driver 580.159.04, torch 2.11.0+cu130), "
    "2026-11-27: benchmarks/results/gpu-suite-h100-2026-11-27-run2.json, step burn-in"
)
DEMO_BF16 = "09df54f83187"
"""The workload digest of configs/demo.yaml with ``training.precision: bf16`` (the GPU
suite's burn-in); tests/test_burn_in.py keeps it equal to the config's."""


@dataclass(frozen=True, slots=True)
class Point:
    figure: str
    """``matmul_bf16`` (``matmul_`` and the precision), ``h2d``, ``step``."""
    value: float
    source: str
    workload: str | None = None
    """``step`` only: the workload digest it was measured on."""


@dataclass(frozen=True, slots=True)
class KnownGood:
    label: str
    """How the message names the model ("an RTX 4090")."""
    must: tuple[str, ...]
    """Substrings the device name (``torch.cuda.get_device_name``) must contain."""
    must_not: tuple[str, ...]
    points: tuple[Point, ...]

    def best(self, figure: str, workload: str | None = None) -> Point | None:
        """The highest point for ``figure`` (of ``workload``, for a step), or None."""
        found = [p for p in self.points if p.figure == figure and p.workload == workload]
        return max(found, key=lambda p: p.value, default=None)


def _bf16(tflops: float, source: str) -> Point:
    return Point("matmul_bf16", tflops, source)


TABLE: tuple[KnownGood, ...] = (
    KnownGood("an H100 SXM", ("H100",), ("PCIe", "NVL"), (
        _bf16(795.0, f"{STAS00}: 80% of 989"),
        _bf16(670.7, H100_RUN),
        Point("h2d", 54.83, f"{H100_RUN} (pinned, 256 MiB copies)"),
        Point("step", 5345.0, f"{H100_RUN} (configs/demo.yaml, bf16)", DEMO_BF16),
    )),
    KnownGood("an A100 SXM", ("A100", "SXM"), (), (_bf16(271.0, f"{STAS00}: 87% of 312"),)),
    KnownGood("an A100 PCIe", ("A100", "PCIe"), (), (_bf16(253.0, f"{STAS00}: 81% of 312"),)),
    KnownGood("an RTX 4090", ("4090",), (), (
        _bf16(165.0, f"{ZZC} issue 78: 151-165 at 2048-10240"),
    )),
    KnownGood("an RTX 5090", ("5090",), (), (
        _bf16(240.0, f"{ZZC} issue 96 (179 on another: #200)"),
    )),
)  # fmt: skip


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


def known_good(
    device_name: str | None, figure: str, workload: str | None = None
) -> tuple[float | None, str]:
    """The known-good value of ``figure`` on ``device_name`` (None: the CPU) and how the
    message names the device: the row's label wherever the device has a row, whether or not
    that row has this figure."""
    row = lookup(device_name)
    if row is None:
        return None, device_name or "this CPU"
    point = row.best(figure, workload)
    return (None if point is None else point.value), row.label


def bf16_tflops(device_name: str) -> float | None:
    """The row's known-good bf16 matmul TFLOP/s (offer ranking's compute estimate)."""
    return known_good(device_name, "matmul_bf16")[0]
