"""scripts/cpu_by_test.py reads the kernel's process-accounting records (v3) and charges
each process to the test on whose worker it started, or shares it among the tests running
when its parents are unknown (a daemon, a FAKE instance's process)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from tests.repo_scripts import script

cpu_by_test = script("cpu_by_test")


def _record(
    pid: int, ppid: int, begin: int, cpu_ticks: int, comm: str, etime: float = 500
) -> bytes:
    return struct.pack("<BBHIIIIIIf8H16s", 0, 3, 0, 0, 0, 0, pid, ppid, begin, etime,
                       cpu_ticks, 0, 0, 0, 0, 0, 0, 0, comm.encode())  # fmt: skip


def test_each_process_is_charged_to_the_test_it_descends_from(tmp_path: Path) -> None:
    acct = tmp_path / "pacct"
    acct.write_bytes(
        _record(100, 1, 1000, 0, "python")  # worker A (itself: not charged)
        + _record(200, 1, 1000, 0, "python")  # worker B
        + _record(101, 100, 1002, 250, "pt_elastic")  # torchrun of A's first test: 2.5 s
        + _record(102, 101, 1003, 400, "python")  # its rank: 4 s
        + _record(103, 100, 1012, 100, "ups")  # A's second test: 1 s
        + _record(201, 200, 1005, 300, "fab")  # B's test: 3 s
        + _record(300, 1, 1006, 600, "sshd")  # an orphan while both A1 and B ran: 3 s each
        + _record(400, 1, 990, 700, "mypy")  # before any test: nobody's
    )
    timeline = tmp_path / "timeline"
    timeline.mkdir()
    lines = [(100, "t.py::a1", 1001, 1010), (100, "t.py::a2", 1011, 1020),
             (200, "t.py::b", 1001, 1020)]  # fmt: skip
    for worker, test, start, end in lines:
        with open(timeline / f"{worker}.jsonl", "a") as f:
            f.write(json.dumps({"pid": worker, "id": test, "start": start, "end": end}) + "\n")

    procs = cpu_by_test.read_acct(acct)
    assert [p.cpu_s for p in procs][2:4] == [2.5, 4.0]
    own, total, nobody = cpu_by_test.charge(procs, cpu_by_test.read_timeline(timeline))
    assert own == {"t.py::a1": 6.5, "t.py::a2": 1.0, "t.py::b": 3.0}
    assert total == {"t.py::a1": 9.5, "t.py::a2": 1.0, "t.py::b": 6.0}
    assert nobody == {"mypy": 7.0}
