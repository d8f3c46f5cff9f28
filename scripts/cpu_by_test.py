"""Charge every process of a test run to the test it belongs to: where CI's CPU goes.

The suite is bound by the CPU (docs/contributing/development.md), so a test costs what its
processes cost: the test itself, its torchrun agents and ranks, sshd sessions, Slurm
jobs, containers, FAKE instances. pytest's own report sees only the processes a test
waits for; the kernel's process accounting sees them all. Run the suite with both on:

    sudo apt-get install acct                    # accton (Debian's package: acct)
    touch /tmp/pacct && sudo accton /tmp/pacct
    mkdir /tmp/timeline
    UPS_TEST_TIMELINE=/tmp/timeline CI=true bash scripts/test.sh
    sudo accton off
    .venv/bin/python scripts/cpu_by_test.py /tmp/pacct /tmp/timeline [--top 40]

A process is charged to the test running on the xdist worker it descends from when it
started (parents are followed by pid and lifetime). A process whose line of parents ends
before a worker (a daemonized supervisor, a process of a FAKE instance's own PID
namespace reparented to its init, a container's process) is split evenly among the
tests running when it started (so is a background install that ran beside them: its
command shows in the totals by command). Processes of no test (the linters, installs before
the first test) are listed by command. Accounting is system-wide: run nothing else.
"""

from __future__ import annotations

import argparse
import collections
import json
import struct
from dataclasses import dataclass
from pathlib import Path

# struct acct_v3 (linux/acct.h): flag, version, tty, exitcode, uid, gid, pid, ppid,
# btime (s), etime (float, ticks), then comp_t utime, stime, mem, io, rw, minflt, majflt,
# swaps, and comm[16].
_V3 = struct.Struct("<BBHIIIIIIf8H16s")
_HZ = 100  # AHZ: the unit of the comp_t times


@dataclass
class Proc:
    pid: int
    ppid: int
    begin: float
    end: float
    cpu_s: float
    comm: str


@dataclass
class Test:
    worker: int
    id: str
    start: float
    end: float


def _comp(value: int) -> int:
    """comp_t: a 13-bit mantissa and a 3-bit base-8 exponent."""
    return (value & 0x1FFF) << (3 * ((value >> 13) & 7))


def read_acct(path: Path) -> list[Proc]:
    data = path.read_bytes()
    procs = []
    for offset in range(0, len(data) - _V3.size + 1, _V3.size):
        f = _V3.unpack_from(data, offset)
        if f[1] != 3:
            raise SystemExit(f"{path}: not a v3 process-accounting file (version {f[1]})")
        cpu = (_comp(f[10]) + _comp(f[11])) / _HZ
        comm = f[18].split(b"\0")[0].decode(errors="replace")
        procs.append(Proc(f[6], f[7], float(f[8]), f[8] + f[9] / _HZ, cpu, comm))
    return procs


def read_timeline(directory: Path) -> list[Test]:
    tests = []
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            t = json.loads(line)
            tests.append(Test(t["pid"], t["id"], t["start"], t["end"]))
    return tests


def charge(
    procs: list[Proc], tests: list[Test]
) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """CPU-s per test (own processes), per test (own + a share of the orphans), and the
    processes of no test by command."""
    by_pid: dict[int, list[Proc]] = collections.defaultdict(list)
    for p in procs:
        by_pid[p.pid].append(p)
    on_worker: dict[int, list[Test]] = collections.defaultdict(list)
    for t in tests:
        on_worker[t.worker].append(t)

    def parent(p: Proc) -> Proc | None:
        for q in by_pid.get(p.ppid, []):
            if q.begin <= p.begin + 1 and q.end >= p.begin - 1:
                return q
        return None

    def worker_of(p: Proc | None) -> int | None:
        for _ in range(64):
            if p is None:
                return None
            if p.ppid in on_worker:
                return p.ppid
            p = parent(p)
        return None

    own: dict[str, float] = collections.defaultdict(float)
    shared: dict[str, float] = collections.defaultdict(float)
    nobody: dict[str, float] = collections.defaultdict(float)
    for p in procs:
        if p.pid in on_worker:
            continue  # a worker itself: its CPU is the in-process tests', not one test's
        worker = worker_of(p)
        if worker is not None:
            test = next((t.id for t in on_worker[worker] if t.start - 1 <= p.begin <= t.end + 1),
                        None)  # fmt: skip
            if test is not None:
                own[test] += p.cpu_s
                continue
        running = [t.id for t in tests if t.start - 1 <= p.begin <= t.end + 1]
        if not running:
            nobody[p.comm] += p.cpu_s
            continue
        for test in running:
            shared[test] += p.cpu_s / len(running)
    total = dict(own)
    for test, seconds in shared.items():
        total[test] = total.get(test, 0.0) + seconds
    return dict(own), total, dict(nobody)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("acct", type=Path, help="the file accton wrote")
    parser.add_argument("timeline", type=Path, help="the UPS_TEST_TIMELINE directory")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    procs, tests = read_acct(args.acct), read_timeline(args.timeline)
    if not tests:
        raise SystemExit(f"{args.timeline}: no *.jsonl (run pytest with UPS_TEST_TIMELINE set)")
    own, total, nobody = charge(procs, tests)
    by_comm: dict[str, float] = collections.defaultdict(float)
    for p in procs:
        by_comm[p.comm] += p.cpu_s

    def most(counts: dict[str, float], n: int) -> list[tuple[str, float]]:
        return sorted(counts.items(), key=lambda kv: -kv[1])[:n]

    print(f"{sum(p.cpu_s for p in procs):.0f} CPU-s in {len(procs)} processes; "
          f"{sum(total.values()):.0f} charged to {len(total)} tests")  # fmt: skip
    print("by command:", ", ".join(f"{c} {s:.0f}" for c, s in most(by_comm, 8)))
    print("of no test:", ", ".join(f"{c} {s:.0f}" for c, s in most(nobody, 8)))
    print(f"\n{'CPU-s':>7} {'own':>7}  test (own: processes descending from its worker)")
    for test, seconds in most(total, args.top):
        print(f"{seconds:7.1f} {own.get(test, 0.0):7.1f}  {test}")
    modules: dict[str, float] = collections.defaultdict(float)
    for test, seconds in total.items():
        modules[test.split("::")[0]] += seconds
    print(f"\n{'CPU-s':>7}  module")
    for module, seconds in most(modules, args.top):
        print(f"{seconds:7.1f}  {module}")


if __name__ == "__main__":
    main()
