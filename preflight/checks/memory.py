"""Free RAM, bounded by the container's cgroup limit when it has one."""

from __future__ import annotations

from pathlib import Path

from preflight.options import Context
from preflight.result import CheckResult, Status
from preflight.units import GiB, human_bytes

MIN_AVAILABLE = 2 * GiB
"""Below this, two ranks with DataLoader workers get OOM-killed at the first batches."""
_CGROUP_FILES = (
    (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory.current")),
    (
        Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
        Path("/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ),
)


def meminfo_available() -> int:
    """``MemAvailable`` from /proc/meminfo in bytes."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable line")


def cgroup_headroom() -> int | None:
    """Bytes left under the cgroup memory limit, or None without a limit."""
    for limit_file, usage_file in _CGROUP_FILES:
        try:
            raw = limit_file.read_text().strip()
            usage = int(usage_file.read_text().strip())
        except (OSError, ValueError):
            continue
        if raw == "max" or int(raw) >= 1 << 60:
            return None
        return max(0, int(raw) - usage)
    return None


def run(ctx: Context) -> CheckResult:
    available = meminfo_available()
    headroom = cgroup_headroom()
    usable = available if headroom is None else min(available, headroom)
    source = "MemAvailable" if headroom is None or available <= headroom else "cgroup limit"
    ok = usable >= MIN_AVAILABLE
    return CheckResult(
        name="memory",
        status=Status.PASS if ok else Status.FAIL,
        message=f"{human_bytes(usable)} RAM available ({source})",
        value=round(usable / GiB, 2),
        threshold=round(MIN_AVAILABLE / GiB, 2),
        unit="GiB",
        hint=None
        if ok
        else "stop other processes, lower training.num_workers or batch_size, "
        "or rent a host with more RAM",
        details={"mem_available_bytes": available, "cgroup_headroom_bytes": headroom},
    )
