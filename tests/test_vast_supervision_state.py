"""The persisted supervision state and the supervisor's lease, without processes: what a
second supervisor, a killed one and a damaged file look like to the next one."""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from ups.deploy.errors import DeployError
from ups.deploy.frontend import command
from ups.deploy.managed import lease
from ups.deploy.managed import record as supervision
from ups.deploy.managed.lease import EXIT_SUPERVISED, Lease, LeaseHeld


def _state(run_id: str = "r1") -> supervision.State:
    return supervision.State(
        run_id=run_id, host="vast", config="/c.yaml", hosts_file=None, overrides=[]
    )


def test_every_change_is_saved_as_strict_json_and_read_back(tmp_path: Path) -> None:
    """Each change is on disk at once (a SIGKILL right after loses nothing); the file is
    strict JSON; a later process reads the same state back; cost counts every instance."""
    run_dir = tmp_path / "r1"
    sup, known = supervision.Supervision.load_or_new(run_dir, _state())
    assert not known
    sup.rented("7001", offer_id="101", machine_id=None, price=3600.0, provider="vast",
               host="vast", epoch=1)  # fmt: skip
    sup.machine("7001", "1010")
    sup.synced(10)
    sup.instance_ended("7001", "lost: outbid")
    sup.recovery("outbid", "7001")
    assert sup.state.status is supervision.RunStatus.RECOVERING
    sup.resumes_from(10, 5)
    sup.trains_again(12.5)
    text = (run_dir / supervision.FILE).read_text()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON {c}"))
    again, known = supervision.Supervision.load_or_new(run_dir, _state())
    assert known
    st = again.state
    assert (st.recoveries, st.steps_lost, [c.step for c in st.checkpoints]) == (1, 5, [10])
    (recovery,) = st.history
    assert (recovery.number, recovery.lost_instance, recovery.reason) == (1, "7001", "outbid")
    assert (recovery.resume_step, recovery.steps_lost, recovery.downtime_s) == (10, 5, 12.5)
    assert st.status is supervision.RunStatus.RUNNING
    (rec,) = st.instances
    assert (rec.offer_id, rec.machine_id, rec.end_reason) == ("101", "1010", "lost: outbid")
    assert rec.ended is not None and st.cost() == pytest.approx(rec.ended - rec.started)
    assert st.current() is None
    assert [s.run_id for s in supervision.all_runs(tmp_path)] == ["r1"]
    again.finished("exit 75", 75)
    assert supervision.load(run_dir).status is supervision.RunStatus.STOPPED  # type: ignore[union-attr]


def test_the_previous_releases_record_is_still_read(tmp_path: Path) -> None:
    """A run supervised by the previous release (``supervision.json``, a recovery count and
    free-text ending, no status) is read; the next write is the new record, ``run.json``."""
    run_dir = tmp_path / "r1"
    run_dir.mkdir()
    old = {"run_id": "r1", "host": "vast", "config": "/c.yaml", "hosts_file": None,
           "overrides": [], "created": 1.0, "updated": 2.0, "recoveries": 2, "steps_lost": 7,
           "instances": [{"instance_id": 5, "offer_id": 50, "machine_id": 500, "price": 0.5,
                          "started": 1.0, "ended": 3601.0, "end_reason": "lost: outbid"}],
           "checkpoints": [], "ended": "exit 0", "exit_code": 0}  # fmt: skip
    (run_dir / supervision.LEGACY_FILE).write_text(json.dumps(old))
    sup, known = supervision.Supervision.load_or_new(run_dir, _state())
    assert known and sup.state.status is supervision.RunStatus.FINISHED
    assert (sup.state.recoveries, sup.state.history) == (2, [])
    assert sup.state.cost() == pytest.approx(0.5)
    sup.save()
    assert json.loads((run_dir / supervision.FILE).read_text())["status"] == "finished"


def test_a_damaged_state_file_is_named_with_the_fix(tmp_path: Path) -> None:
    """A state file ups cannot read stops the supervisor with one paragraph, no traceback."""
    (tmp_path / "r1").mkdir()
    (tmp_path / "r1" / supervision.FILE).write_text('{"run_id": "r1"')
    with pytest.raises(DeployError, match="move it aside and deploy with --run again"):
        supervision.load(tmp_path / "r1")


def test_a_second_supervisor_is_refused_while_the_first_lives(tmp_path: Path) -> None:
    """The holder is named with its pid and the command that follows the run instead; once
    released, the run is free; the refusal carries the documented exit code."""
    follow = command("logs", "--host", "vast", "--run", "r1")
    first = Lease(tmp_path, "r1", "detached")
    first.take(follow)
    second = Lease(tmp_path, "r1", "following")
    with pytest.raises(LeaseHeld) as err:
        second.take(follow)
    assert err.value.exit_code == EXIT_SUPERVISED == 20
    assert "detached supervisor pid" in str(err.value)
    assert "Follow it with `fab logs --host vast --run r1` (or `ups logs`" in str(err.value)
    held = lease.holder(tmp_path)
    assert held is not None and held.token == first.token
    first.release()
    assert lease.holder(tmp_path) is None
    second.take("x")
    second.release()


def _write(run_dir: Path, holder: lease.Holder) -> None:
    (run_dir / lease.LEASE_FILE).write_text(json.dumps(asdict(holder)))


def test_a_dead_or_expired_holder_frees_the_run(tmp_path: Path) -> None:
    """On this machine a holder whose process is gone (kill -9) frees the run at once, even
    before its expiry, and one whose process lives holds it even past expiry (a laptop that
    slept); a holder on another machine holds it until its lease expires."""
    mine = Lease(tmp_path, "r1", "following")
    mine.take("x")
    alive = lease.read(tmp_path)
    assert alive is not None
    mine.release()
    _write(tmp_path, replace(alive, token="t", expires=time.time() - 3600))
    assert lease.holder(tmp_path) is not None  # this process lives: it still holds
    _write(tmp_path, replace(alive, token="t", pid_started=1.0))  # that process is gone
    assert lease.holder(tmp_path) is None
    other = replace(alive, token="t", host=socket.gethostname() + "-elsewhere")
    _write(tmp_path, replace(other, expires=time.time() + 60))
    assert lease.holder(tmp_path) is not None
    _write(tmp_path, replace(other, expires=time.time() - 1))
    assert lease.holder(tmp_path) is None
    with Lease(tmp_path, "r1", "following") as taker:
        taker.take("x")


def test_supervisors_starting_together_one_wins(tmp_path: Path) -> None:
    """Eight takers at the same instant: the lock makes read-decide-write one step, so
    exactly one holds the run."""
    takers = [Lease(tmp_path, "r1", "following") for _ in range(8)]
    won: list[Lease] = []
    gate = threading.Barrier(len(takers))

    def take(one: Lease) -> None:
        gate.wait()
        try:
            one.take("x")
        except LeaseHeld:
            return
        won.append(one)

    threads = [threading.Thread(target=take, args=(t,)) for t in takers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    held = lease.holder(tmp_path)
    assert held is not None and held.token == won[0].token
    won[0].release()
