"""The byte-offset log follower against a real sshd, with connections killed mid-line."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.deploy_fixtures import SshServer, sshd
from ups.deploy.hosts import get_host
from ups.deploy.transport.connect import connect
from ups.deploy.transport.stream import STOP_REQUESTED, LogFollower

__all__ = ["sshd"]

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


def test_follower_copy_is_byte_identical_across_drops(sshd: SshServer, tmp_path: Path) -> None:
    """Lines written in two halves (so drops land mid-line), plus non-JSON and non-UTF-8
    lines, arrive exactly once each and in order while the SSH connection is killed 4 times;
    the local copy equals the remote file byte for byte."""
    spec, known = get_host("test", sshd.write_hosts(tmp_path / "hosts.yaml"))
    log, done = tmp_path / "launch.log", tmp_path / "exit"
    connected = threading.Event()
    conns: list[Any] = []

    def open_transport() -> Any:
        conn = connect(spec, known)
        conns.append(conn)
        connected.set()
        return conn.transport

    def writer() -> None:
        connected.wait(timeout=30)
        with log.open("ab", buffering=0) as fh:
            for i in range(600):
                if i == 500:  # the last lines wait for every drop: all land mid-follow
                    all_dropped.wait(timeout=60)
                line = f'{{"event":"step","step":{i},"pad":"{"x" * (i % 200)}"}}\n'.encode()
                if i % 50 == 0:
                    line = b"[rank1]: raw torchrun line \xff\xfe not utf-8\n"
                fh.write(line[: len(line) // 2])
                time.sleep(0.004)
                fh.write(line[len(line) // 2 :])
        done.write_text("0")

    drops = []
    all_dropped = threading.Event()

    def killer() -> None:
        connected.wait(timeout=30)
        for n in range(4):
            deadline = time.monotonic() + 30
            while len(conns) < n + 1 and time.monotonic() < deadline:
                time.sleep(0.05)  # the follower reconnecting after the last drop
            time.sleep(0.3)  # some lines flow on this connection before it is dropped
            drops.append(sshd.drop_sessions())
        all_dropped.set()

    got = bytearray()
    follower = LogFollower(open_transport, str(log), [str(done)], got.extend, heartbeat_s=2.0)
    threads = [threading.Thread(target=writer), threading.Thread(target=killer)]
    for t in threads:
        t.start()
    try:
        stats = follower.follow()
    finally:
        for t in threads:
            t.join(timeout=60)
        follower.close()
        for c in conns:
            c.close()
    assert sum(drops) >= 3
    assert stats.reconnects >= 3
    assert bytes(got) == log.read_bytes()
    assert stats.lines == 600


def test_a_swallowed_interrupt_still_stops_the_follower(sshd: SshServer, tmp_path: Path) -> None:
    """The stop signal's handler sets STOP_REQUESTED as it raises KeyboardInterrupt; when a
    library swallows that exception, the follower raises it again at its next poll. Here
    the flag is set from another thread with no exception at all: follow() still ends with
    KeyboardInterrupt within a second or two, instead of following a run that never ends."""
    spec, known = get_host("test", sshd.write_hosts(tmp_path / "hosts.yaml"))
    log = tmp_path / "launch.log"
    log.write_text('{"event":"train_step","step":1}\n')
    conns: list[Any] = []

    def open_transport() -> Any:
        conns.append(connect(spec, known))
        return conns[-1].transport

    lines: list[bytes] = []
    follower = LogFollower(open_transport, str(log), [str(tmp_path / "never")], lines.append)
    timer = threading.Timer(1.0, STOP_REQUESTED.set)
    timer.start()
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            follower.follow()
    finally:
        STOP_REQUESTED.clear()
        timer.cancel()
        follower.close()
        for c in conns:
            c.close()
    assert lines == [b'{"event":"train_step","step":1}\n']
    assert time.monotonic() - started < 30
