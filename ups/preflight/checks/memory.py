"""Free RAM, bounded by the container's cgroup limit when it has one."""

from __future__ import annotations

from pathlib import Path

from ups.console.units import GiB, human_bytes
from ups.preflight.options import Context
from ups.preflight.result import CheckResult, Status

MIN_AVAILABLE = 2 * GiB
"""Below this, two ranks with DataLoader workers get OOM-killed at the first batches."""
_CGROUP_ROOT = Path("/sys/fs/cgroup")


def _cgroup_limit_files() -> list[tuple[Path, Path]]:
    """(limit, usage) file pairs of this process's memory cgroup and its ancestors.

    Reads /proc/self/cgroup, so a container's (or a test's) own cgroup is found under
    either cgroup v1 (``memory`` controller) or v2 (unified hierarchy).
    """
    pairs: list[tuple[Path, Path]] = []
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return pairs
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        if "memory" in controllers.split(","):
            mount = _CGROUP_ROOT / "memory"
            limit, usage = "memory.limit_in_bytes", "memory.usage_in_bytes"
        elif controllers == "":
            unified = _CGROUP_ROOT / "unified"
            mount = unified if unified.is_dir() else _CGROUP_ROOT
            limit, usage = "memory.max", "memory.current"
        else:
            continue
        d = mount / rel.lstrip("/")
        while True:
            pairs.append((d / limit, d / usage))
            if d == mount or d == d.parent:
                break
            d = d.parent
    return pairs


def meminfo_available() -> int:
    """``MemAvailable`` from /proc/meminfo in bytes."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable line")


def cgroup_headroom() -> int | None:
    """Bytes left under the tightest cgroup memory limit, or None without a limit."""
    headrooms = []
    for limit_file, usage_file in _cgroup_limit_files():
        try:
            raw = limit_file.read_text().strip()
            usage = int(usage_file.read_text().strip())
        except (OSError, ValueError):
            continue
        if raw != "max" and int(raw) < 1 << 60:  # v1 writes a huge number for "no limit"
            headrooms.append(max(0, int(raw) - usage))
    return min(headrooms, default=None)


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
