"""The fenced lease: conditional writes against a store that honours them (moto's server
mode, tests/moto_server.py) and one that ignores them (rclone serve s3,
tests/s3_server.py), and a supervisor that slept past its lease (SIGSTOP, a real process):
another takes the run, and the sleeper, woken, writes nothing more, says it lost the lease
in one line and exits 21."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.deploy_fixtures import REPO
from tests.moto_server import MotoServer, moto_server
from tests.s3_server import S3Server, s3_server
from ups.bucket import Bucket, BucketError, PreconditionFailed, Stored
from ups.deploy.managed import lease
from ups.deploy.managed import record as supervision
from ups.deploy.managed import store as bucket_state
from ups.deploy.managed.lease import EXIT_LEASE_LOST, Lease, LeaseHeld, LeaseLost

__all__ = ["moto_server", "s3_server"]  # fixtures used by name below


def _bucket(server: MotoServer | S3Server) -> Bucket:
    return Bucket.open(server.url("runs"), endpoint_url=server.endpoint_url)


def _state(host: str) -> supervision.State:
    return supervision.State(run_id="r1", host=host, config="/c", hosts_file=None, overrides=[])


def _record(held: Lease, host: str, bucket: Bucket, said: list[str]) -> supervision.Supervision:
    """The run's record as ``held``'s supervisor writes it: here and in the bucket, fenced."""
    mirror = bucket_state.mirror(bucket, "r1", said.append)
    sup = supervision.Supervision(held.run_dir / supervision.FILE, _state(host), mirror)
    sup.fence = held.check
    return sup


def test_conditional_writes_and_the_probe_on_a_store_that_honours_them(
    moto_server: MotoServer,
) -> None:
    """Create-if-absent, replace-if-ETag and delete-if-ETag refuse with 412 when someone
    wrote first, and say a missing key; the probe calls the store honouring and leaves no
    object behind."""
    bucket = _bucket(moto_server)
    assert bucket.honours_conditions("r1") is True
    assert bucket.list("r1/") == []
    first = bucket.put_if_absent("r1/k", b"a")
    with pytest.raises(PreconditionFailed, match="another writer changed it first") as err:
        bucket.put_if_absent("r1/k", b"b")
    assert not err.value.missing
    second = bucket.put_if_match("r1/k", b"c", first)
    with pytest.raises(PreconditionFailed):
        bucket.put_if_match("r1/k", b"d", first)  # a stale ETag: someone replaced it
    assert bucket.get_stored("r1/k") == Stored(b"c", second)
    with pytest.raises(PreconditionFailed):
        bucket.delete_if_match("r1/k", first)
    bucket.delete_if_match("r1/k", second)
    assert bucket.get_stored("r1/k") is None
    for gone in (lambda: bucket.put_if_match("r1/k", b"e", second),
                 lambda: bucket.delete_if_match("r1/k", second)):  # fmt: skip
        with pytest.raises(PreconditionFailed, match="it is gone") as err:
            gone()
        assert err.value.missing


def test_fenced_lease_one_taker_wins_and_a_holder_that_lost_it_writes_nothing(
    moto_server: MotoServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight supervisors on eight machines (run directories) take the bucket's lease at
    once: exactly one holds it, with no settling wait. When another then holds it, the
    holder's renewal finds it lost: one line says so, the fence raises (exit 21) and the
    record is not written, here or in the bucket; its release leaves the new holder's
    lease alone."""
    bucket = _bucket(moto_server)
    said: list[str] = []
    takers = [
        Lease(tmp_path / str(i) / "r1", "r1", "following", bucket, say=said.append)
        for i in range(8)
    ]
    won: list[Lease] = []
    gate = threading.Barrier(len(takers))

    def settling(*_: object) -> None:
        raise AssertionError("a taker wrote and waited to read back on a fencing store")

    # No settling wait: the conditional write alone decides (a time bound here would be a
    # timed test, failing under load; the wait's one caller is what must not run).
    monkeypatch.setattr(Lease, "_claim_read_back", settling)

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
    holder = won[0]
    assert said == []  # conditions honoured: no fallback warning
    held = lease.read_bucket(bucket, "r1")
    assert held is not None and held.token == holder.token

    sup = _record(holder, "first", bucket, said)
    sup.save()
    record = bucket.get_bytes(f"r1/{supervision.FILE}")
    taker = json.dumps({**json.loads(bucket.get_bytes("r1/supervisor.lease") or b""),
                        "token": "t2", "pid": 1, "mode": "detached"})  # fmt: skip
    bucket.put_bytes("r1/supervisor.lease", taker.encode())  # another supervisor took it
    holder.renew()
    assert holder.lost
    line = (
        f"supervisor pid {os.getpid()} lost the lease of run r1 to the detached supervisor "
        "pid 1 on "
    )
    assert len(said) == 1 and said[0].startswith(line), said
    assert said[0].endswith(": it stops acting now; the run goes on under the new holder")
    with pytest.raises(LeaseLost) as err:
        sup.recovery("outbid", None)
    assert err.value.code == EXIT_LEASE_LOST == 21 and str(err.value) == said[0]
    assert bucket.get_bytes(f"r1/{supervision.FILE}") == record
    assert json.loads(sup.path.read_text())["recoveries"] == 0
    holder.release()
    assert bucket.get_bytes("r1/supervisor.lease") == taker.encode()


_HOLDER = """
import sys, threading, time
from pathlib import Path
from ups.bucket import Bucket
from ups.deploy.managed import store as bucket_state
from ups.deploy.managed import lease
from ups.deploy.managed import record as supervision

run_dir, url, endpoint, then = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
bucket = Bucket.open(url, endpoint_url=endpoint)
def say(text):
    print(text, flush=True)
held = lease.Lease(run_dir, "r1", "detached", bucket, say=say, stop_main=True)
held.take("fab logs --run r1")
state = supervision.State(run_id="r1", host="first", config="/c", hosts_file=None, overrides=[])
sup = supervision.Supervision(
    run_dir / supervision.FILE, state, bucket_state.mirror(bucket, "r1", say)
)
sup.fence = held.check
say("holding")
try:
    for n in range(1, 10**6):
        sup.resumes_from(n, 0)  # a record write every 50 ms, each through the fence
        time.sleep(0.05)
        if then == "block" and n == 3:
            threading.Event().wait()  # following a log for hours: no fence touched
finally:
    held.release()
"""


@pytest.mark.slow
@pytest.mark.parametrize("store", ["moto_server", "s3_server"])
def test_a_supervisor_that_slept_past_its_lease_stops_when_it_wakes(
    store: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A supervisor process holds the run (lease lifetime 2 s) and writes its record; it is
    stopped (SIGSTOP, a laptop asleep) until its lease expired, and a supervisor on
    another machine takes the run. Woken (SIGCONT), the first says in one line that it lost
    the lease to the second and exits 21, writing nothing more to the bucket: on moto the
    lease and the record are fenced. On rclone (conditions ignored) both supervisors say
    once that the lease falls back to the read-back lease, naming the store; there a write
    the stop interrupted may still land. There the first's main thread is blocked (as in
    a follow) and touches no fence: its renewal thread stops it."""
    server: MotoServer | S3Server = request.getfixturevalue(store)
    bucket = _bucket(server)
    monkeypatch.setenv(lease.TTL_ENV, "2")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    first_dir = tmp_path / "laptop" / "r1"
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(first_dir), server.url("runs"), server.endpoint_url,
         "write" if store == "moto_server" else "block"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        out: list[str] = []
        for text in proc.stdout:
            out.append(text.rstrip("\n"))
            if text.startswith("holding"):
                break
        assert out and out[-1] == "holding", "\n".join(out) + (proc.stdout.read() or "")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(BucketError):  # rclone may answer 500 mid-replace
                raw = bucket.get_bytes(f"r1/{supervision.FILE}")
                if raw is not None and json.loads(raw)["recoveries"] >= 3:
                    break
            time.sleep(0.05)  # the first supervisor writing its record
        proc.send_signal(signal.SIGSTOP)
        while psutil.Process(proc.pid).status() != psutil.STATUS_STOPPED:
            time.sleep(0.01)  # the signal lands
        local = json.loads((first_dir / supervision.FILE).read_text())["recoveries"]
        while (held := lease.read_bucket(bucket, "r1")) is not None and held.expires > time.time():
            time.sleep(0.1)  # its lease running out while it sleeps
        assert held is not None and held.pid == proc.pid

        said: list[str] = []
        second = Lease(tmp_path / "server" / "r1", "r1", "following", bucket, say=said.append)
        second.take("x")
        sup = _record(second, "second", bucket, said)
        sup.save()
        record = bucket.get_bytes(f"r1/{supervision.FILE}")
        proc.send_signal(signal.SIGCONT)
        # Generous: on a loaded machine the woken holder's next lease check (a round trip to
        # the S3 server, rclone's replace) took over 30 s in a CI run; alone it takes ~1 s.
        code = proc.wait(timeout=120)
        out += proc.stdout.read().splitlines()
        assert code == EXIT_LEASE_LOST, "\n".join(out)
        lost = [line for line in out if " lost the lease " in line]
        taker = lease.read_bucket(bucket, "r1")
        assert taker is not None and taker.token == second.token and not second.lost
        assert lost == [
            f"supervisor pid {proc.pid} lost the lease of run r1 to the {taker.describe()}: "
            "it stops acting now; the run goes on under the new holder"
        ], "\n".join(out)
        assert taker.describe().startswith(f"following supervisor pid {os.getpid()} on ")
        # At most the one write the stop interrupted (past its fence check) lands at home;
        # in a fenced bucket not even that one (it is conditional on the ETag it wrote last).
        after = json.loads((first_dir / supervision.FILE).read_text())["recoveries"]
        assert after in (local, local + 1)
        if store == "moto_server":
            assert bucket.get_bytes(f"r1/{supervision.FILE}") == record
        warnings = [line for line in out + said if "ignores conditional writes" in line]
        if store == "moto_server":
            assert warnings == []
        else:
            assert bucket.honours_conditions("r1") is False
            assert len(warnings) == 2 and all(server.endpoint_url in w for w in warnings)
        second.release()
        assert lease.read_bucket(bucket, "r1") is None
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait(timeout=10)
