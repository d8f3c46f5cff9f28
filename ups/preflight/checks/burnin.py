"""The burn-in: what this host delivers, one preflight row per figure (docs/burn-in.md).

Each row is the measured value, the known-good value for this device (the published table
in :mod:`ups.preflight.known_good`, or ``preflight.known_good``) and their ratio. Below
``preflight.burn_in_floor`` of known-good a row warns (``burn_in: warn``) or fails
(``enforce``, as on a rented host, where the failure is the host's fault). A device with
no known-good value gets no floor; its figures are still shown and recorded.

Every measurement runs for a fixed time budget, so the rows' cost is bounded: on a CPU
host all of them together take about ``CPU_BUDGET_S`` of compute (plus the disk's time to
write ``DISK_MB`` and read them back).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ups.preflight.figures import FLOOR_WORDS, workload
from ups.preflight.known_good import known_good
from ups.preflight.options import Context
from ups.preflight.result import CheckResult, Status

if TYPE_CHECKING:
    import torch

MATMUL_S = (0.12, 0.5)
"""Seconds of matmuls timed (CPU, GPU)."""
STEP_S = (0.25, 1.0)
"""Seconds of warm training steps timed (CPU, GPU), after one untimed warm-up step."""
CPU_STEP_BATCH = 8
"""Samples per task in a CPU host's steps: the run's whole batch there takes longer than
the budget (0.5 s a step for the demo's 2 x 32 on a busy 2-core host). samples/s of a
smaller batch understates a CPU's best figure, alike on every host measured this way."""
LOADER_S = 0.15
"""Seconds of data loading timed."""
WINDOWS = 5
"""Each timed loop is cut into this many windows; its figure is their median."""
DISK_MB = 16
COPY_MB = 256
CPU_BUDGET_S = MATMUL_S[0] + STEP_S[0] + LOADER_S
"""The compute the burn-in's timed loops take on a CPU host (0.52 s), without the
one warm-up step, the disk's wait and the first read of the data files."""


def _device() -> torch.device:
    import torch

    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def _device_name(device: torch.device) -> str | None:
    import torch

    return torch.cuda.get_device_name(device) if device.type == "cuda" else None


def _precision(ctx: Context, device: torch.device) -> str:
    """The run's precision on a GPU; a CPU is measured in fp32 (its autocast is not the
    run's speed there)."""
    if device.type != "cuda":
        return "fp32"
    return ctx.cfg.training.precision if ctx.cfg else "bf16"


def _timed(budget_s: float, once: Callable[[], float], sync: Callable[[], None]) -> float:
    """Run ``once`` (returning the work it did) untimed, then until ``budget_s`` passed;
    the median of the work per second of ``WINDOWS`` windows of the timed part. A window
    counts all its work over all its time, so a host slow most of the time shows it; the
    median leaves out a moment when something else took the host.

    On a CPU, torch runs one thread meanwhile, as each rank does under torchrun
    (``OMP_NUM_THREADS=1``): several threads fighting for a busy host's cores would
    measure the fight, not the host."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _timed_loop(budget_s, once, sync)
    finally:
        torch.set_num_threads(threads)


def _timed_loop(budget_s: float, once: Callable[[], float], sync: Callable[[], None]) -> float:
    once()  # warm: first-use allocations, kernel choices and file reads are not the speed
    sync()
    windows: list[float] = []
    start = time.perf_counter()
    while time.perf_counter() - start < budget_s:
        done, opened = 0.0, time.perf_counter()
        while True:
            done += once()
            sync()
            elapsed = time.perf_counter() - opened
            if elapsed >= budget_s / WINDOWS:
                break
        windows.append(done / elapsed)
    return statistics.median(windows)


def judge(
    ctx: Context,
    name: str,
    what: str,
    value: float,
    unit: str,
    known: float | None = None,
    label: str = "this host",
    details: dict[str, Any] | None = None,
) -> CheckResult:
    """One figure's row: the value, its known-good value (the config's wins) and ratio."""
    cfg_known = ctx.cfg.preflight.known_good.get(name) if ctx.cfg else None  # type: ignore[call-overload]
    if cfg_known is not None:
        known, label = cfg_known, "the configured known-good"
    floor = ctx.cfg.preflight.burn_in_floor if ctx.cfg else 0.7
    data = {"figure": value, "unit": unit, "known_good": known, **(details or {})}
    if known is None:
        return CheckResult(
            name=name,
            status=Status.PASS,
            message=f"{what} {value:.4g} {unit}; no known-good figure for {label}: "
            "recorded, no floor",
            value=value,
            unit=unit,
            details=data,
        )
    ratio = value / known
    data.update(ratio=round(ratio, 3), floor=floor)
    owner = label if label.startswith("the ") else f"{label}'s"
    message = f"{what} {value:.4g} {unit}, {ratio:.2f} of {owner} {known:.4g}"
    if ratio >= floor:
        status, hint = Status.PASS, None
    else:
        status = Status.FAIL if ctx.burn_in == "enforce" else Status.WARN
        message += f" ({FLOOR_WORDS} {floor:g})"
        hint = (
            "this host delivers less than it should: use another one, or lower "
            "preflight.burn_in_floor / set preflight.known_good if the figure is wrong"
        )
    return CheckResult(
        name=name,
        status=status,
        message=message,
        value=value,
        threshold=known,
        unit=unit,
        hint=hint,
        details=data,
    )


def matmul(ctx: Context) -> CheckResult:
    """Square matmuls in the run's precision: TFLOP/s on a GPU, GFLOP/s on a CPU."""
    import torch

    device = _device()
    gpu = device.type == "cuda"
    precision = _precision(ctx, device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    n = 8192 if gpu else 256
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)

    def once() -> float:
        torch.mm(a, b)
        return 2.0 * n**3

    flops = _timed(MATMUL_S[gpu], once, _sync(device))
    name = _device_name(device)
    known, label = known_good(name, f"matmul_{precision}")
    scale, unit = (1e12, "TFLOP/s") if gpu else (1e9, "GFLOP/s")
    return judge(ctx, "matmul", f"{precision} matmul", flops / scale, unit, known, label, {"n": n})


def h2d(ctx: Context) -> CheckResult:
    """Pinned host-to-device copies (CUDA only)."""
    import torch

    device = _device()
    if device.type != "cuda":
        return CheckResult(
            name="h2d", status=Status.SKIP, message="no CUDA device: no host-device copies"
        )
    host = torch.empty(COPY_MB << 20, dtype=torch.uint8).pin_memory()
    dev = torch.empty_like(host, device=device)

    def once() -> float:
        dev.copy_(host, non_blocking=True)
        return float(host.numel())

    rate = _timed(0.3, once, _sync(device)) / 1e9
    known, label = known_good(_device_name(device), "h2d")
    return judge(ctx, "h2d", "host-to-device copy", rate, "GB/s", known, label)


def _sync(device: torch.device) -> Callable[[], None]:
    import torch

    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def _run_dir(ctx: Context) -> Path:
    """Where the run writes (its output_dir), or the nearest directory above it that exists."""
    path = (ctx.cfg.run.output_dir if ctx.cfg else Path.cwd()).absolute()
    while not path.is_dir():
        path = path.parent
    return path


def _disk(ctx: Context) -> dict[str, float]:
    """Write ``DISK_MB`` (fsync'd) and read them back past the page cache: MB/s of each."""
    if "disk" in ctx.memo:
        return dict(ctx.memo["disk"])
    path = _run_dir(ctx) / f".ups-burn-in-{os.getpid()}"
    block = os.urandom(1 << 20)
    try:
        start = time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for _ in range(DISK_MB):
                os.write(fd, block)
            os.fsync(fd)
        finally:
            os.close(fd)
        write_s = time.perf_counter() - start
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # read the disk, not the cache
            start = time.perf_counter()
            while os.read(fd, 1 << 20):
                pass
            read_s = time.perf_counter() - start
        finally:
            os.close(fd)
    finally:
        path.unlink(missing_ok=True)
    ctx.memo["disk"] = {"disk_write": DISK_MB / write_s, "disk_read": DISK_MB / read_s}
    return dict(ctx.memo["disk"])


def disk_write(ctx: Context) -> CheckResult:
    value = _disk(ctx)["disk_write"]
    return judge(ctx, "disk_write", f"disk write in {_run_dir(ctx)}", value, "MB/s")


def disk_read(ctx: Context) -> CheckResult:
    value = _disk(ctx)["disk_read"]
    return judge(ctx, "disk_read", f"disk read in {_run_dir(ctx)}", value, "MB/s")


def _no_config(name: str) -> CheckResult:
    return CheckResult(
        name=name,
        status=Status.SKIP,
        message="no valid run config: no data or model to measure",
        hint="ups-preflight --config CONFIG.yaml",
    )


def _workload(ctx: Context) -> dict[str, float]:
    """The data loader's samples/s on the run's own data (in this process), then samples/s
    of warm forward and backward steps of the run's model on its batch (discarded)."""
    if "workload" in ctx.memo:
        return dict(ctx.memo["workload"])

    from ups.data.loader import build_loader
    from ups.data.pdebench import inspect_task
    from ups.model import build_model, task_shapes
    from ups.train.amp import autocast

    assert ctx.cfg is not None
    cfg = ctx.cfg
    infos = {t.name: inspect_task(t) for t in cfg.tasks}
    loader = build_loader(
        cfg.tasks, infos, batch_size=cfg.training.batch_size, num_workers=0, rank=0,
        world_size=1, seed=cfg.run.seed,
    )  # fmt: skip
    loader.set_epoch(0)
    batches: list[dict[str, Any]] = []
    it = iter(loader)

    def load() -> float:
        nonlocal it
        batch = next(it, None)
        if batch is None:
            it = iter(loader)
            batch = next(it)
        if len(batches) < 2:
            batches.append(batch)
        return float(sum(x.shape[0] for x, _, _ in batch.values()))

    loaded = _timed(LOADER_S, load, lambda: None)
    device = _device()
    gpu = device.type == "cuda"
    model = build_model(task_shapes(infos), cfg.model).to(device)
    cut = None if gpu else CPU_STEP_BATCH
    inputs = [
        {t: (x[:cut].to(device), y[:cut].to(device)) for t, (x, y, _) in batch.items()}
        for batch in batches
    ]
    precision = _precision(ctx, device)
    k = 0

    def step() -> float:
        nonlocal k
        batch = inputs[k % len(inputs)]
        k += 1
        with autocast(precision, device):
            preds = model({t: x for t, (x, _) in batch.items()})
        loss = sum(((preds[t].float() - y) ** 2).mean() for t, (_, y) in batch.items())
        loss.backward()
        model.zero_grad(set_to_none=True)
        return float(sum(x.shape[0] for x, _ in batch.values()))

    stepped = _timed(STEP_S[gpu], step, _sync(device))
    ctx.memo["workload"] = {"loader": loaded, "step": stepped}
    return dict(ctx.memo["workload"])


def _unusable(ctx: Context, name: str) -> CheckResult | None:
    """A SKIP row when there is nothing of the run's to measure (the config or data
    checks say why: their failure is the user's, never this host's)."""
    from ups.data.pdebench import DataError, inspect_task

    if ctx.cfg is None:
        return _no_config(name)
    try:
        for t in ctx.cfg.tasks:
            inspect_task(t)
    except DataError as err:
        return CheckResult(
            name=name, status=Status.SKIP, message=f"the run's data is unusable ({err})"
        )
    return None


def loader(ctx: Context) -> CheckResult:
    skipped = _unusable(ctx, "loader")
    if skipped is not None:
        return skipped
    value = _workload(ctx)["loader"]
    return judge(ctx, "loader", "data loader (this process)", value, "samples/s")


def step(ctx: Context) -> CheckResult:
    skipped = _unusable(ctx, "step")
    if skipped is not None:
        return skipped
    value = _workload(ctx)["step"]
    assert ctx.cfg is not None  # _unusable said so
    known, label = known_good(_device_name(_device()), "step", workload(ctx.cfg))
    return judge(ctx, "step", "training steps", value, "samples/s", known, label)
