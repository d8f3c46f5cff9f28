"""Measure the deploy log stream: latency from remote write to local render, and lines lost
or repeated across forced SSH disconnects. With ``--docker``, also bytes moved for a first
image deploy vs a code-only redeploy (needs a Docker engine; see docs/deploy.md).

    .venv/bin/python benchmarks/bench_deploy.py [--lines 3000] [--rate 200] [--drops 5]

A real sshd on 127.0.0.1 (tests/deploy_fixtures.py) is the remote host; a writer thread
appends JSON events with their write time to a file; the follower renders each line with
structlog's console renderer and records when; the sshd child serving the connection is
SIGKILLed ``--drops`` times during the stream. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.deploy_fixtures import start_sshd, stop_sshd
from ups.deploy.connect import connect
from ups.deploy.hosts import get_host
from ups.deploy.stream import LogFollower
from ups.log import render_line, setup_logging


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def bench_stream(lines: int, rate: float, drops: int, keepalive: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="bench-deploy-"))
    server = start_sshd(root / "sshd")
    try:
        hosts = server.write_hosts(root / "hosts.yaml")
        spec, known = get_host("test", hosts)
        spec = spec.model_copy(update={"keepalive_s": keepalive})
        log, done = root / "launch.log", root / "exit"
        latencies: list[float] = []
        seen: list[int] = []
        received = bytearray()
        drop_times: list[float] = []

        def on_line(line: bytes) -> None:
            received.extend(line)
            render_line(line.decode().rstrip("\n"))
            now = time.time()
            event = json.loads(line)
            latencies.append(now - event["t"])
            seen.append(event["i"])

        def writer() -> None:
            # Latency is measured in steady state: start once the first channel is open.
            connected.wait(timeout=30)
            time.sleep(0.5)
            with log.open("ab", buffering=0) as fh:
                for i in range(lines):
                    event = {
                        "event": "train step",
                        "level": "info",
                        "step": i,
                        "i": i,
                        "loss": 0.123,
                        "rank": 0,
                        "t": time.time(),
                    }
                    fh.write((json.dumps(event) + "\n").encode())
                    time.sleep(1.0 / rate)
            done.touch()

        def killer() -> None:
            duration = lines / rate
            connected.wait(timeout=30)
            for _ in range(drops):
                time.sleep(duration / (drops + 1))
                if server.drop_sessions():
                    drop_times.append(time.time())

        conns: list[Any] = []
        connected = threading.Event()

        def open_transport() -> Any:
            conn = connect(spec, known)
            conns.append(conn)
            connected.set()
            return conn.transport

        follower = LogFollower(
            open_transport, str(log), [str(done)], on_line, heartbeat_s=float(keepalive)
        )
        threads = [threading.Thread(target=writer), threading.Thread(target=killer)]
        t0 = time.time()
        for t in threads:
            t.start()
        stats = follower.follow()
        for t in threads:
            t.join()
        follower.close()
        for c in conns:
            c.close()
        elapsed = time.time() - t0
        remote = log.read_bytes()
        ms = [x * 1000 for x in latencies]
        return {
            "lines_written": lines,
            "lines_received": len(seen),
            "lines_lost": len(set(range(lines)) - set(seen)),
            "lines_repeated": len(seen) - len(set(seen)),
            "byte_identical": bytes(received) == remote,
            "forced_disconnects": len(drop_times),
            "reconnects": stats.reconnects,
            "latency_ms_p50": round(statistics.median(ms), 1),
            "latency_ms_p95": round(_pct(ms, 0.95), 1),
            "latency_ms_max": round(max(ms), 1),
            "elapsed_s": round(elapsed, 1),
        }
    finally:
        stop_sshd(server)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lines", type=int, default=3000)
    p.add_argument("--rate", type=float, default=200.0, help="lines per second")
    p.add_argument("--drops", type=int, default=5)
    p.add_argument("--keepalive", type=int, default=2)
    p.add_argument("--docker", action="store_true", help="also measure image transfer bytes")
    args = p.parse_args()
    setup_logging(console=True, stdout=sys.stderr)
    result: dict[str, Any] = {
        "stream_steady": bench_stream(args.lines // 3, args.rate, 0, args.keepalive),
        "stream": bench_stream(args.lines, args.rate, args.drops, args.keepalive),
    }
    if args.docker:
        from benchmarks.bench_deploy_docker import bench_layers  # type: ignore[import-not-found]

        result["docker"] = bench_layers()
    sys.stdout.write(json.dumps(result, indent=2) + "\n")
    return 0 if result["stream"]["lines_lost"] == 0 and result["stream"]["byte_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
