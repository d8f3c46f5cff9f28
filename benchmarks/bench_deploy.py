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

from ups import jsonio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.deploy_fixtures import start_sshd, stop_sshd
from ups.deploy.hosts import get_host
from ups.deploy.transport.connect import connect
from ups.deploy.transport.stream import LogFollower
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
                        "event": "train_step",
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


def _transfer_bytes(
    local: Any, remote_url: str, server: Any, root: Path, image: str
) -> dict[str, Any]:
    from ups.deploy.kinds.docker import layers
    from ups.deploy.kinds.docker.dial import remote_client

    hosts = server.write_hosts(root / f"hosts-{abs(hash(image))}.yaml")
    spec, known = get_host("test", hosts)
    conn = connect(spec, known)
    remote = remote_client(conn.transport, remote_url)
    try:
        t0 = time.time()
        plan, sent = layers.transfer(local, remote, image, lambda n: None)
        return {
            "image": image,
            "layers_sent": len(plan.missing),
            "layers": plan.layers,
            "bytes_sent": sent,
            "uncompressed_layer_bytes": plan.missing_bytes,
            "seconds": round(time.time() - t0, 1),
        }
    finally:
        remote.close()
        conn.close()


def bench_layers_tiny() -> dict[str, Any]:
    """First deploy vs one-line code change, with the tiny test image (private engines)."""
    import shutil

    from tests.docker_fixtures import build_app, import_tiny_base, start_engine, stop_engine

    root = Path(tempfile.mkdtemp(prefix="ups-bd-", dir="/tmp"))
    server = start_sshd(root / "sshd")
    local = start_engine(root / "l")
    remote = start_engine(root / "r")
    try:
        client = local.client()
        import_tiny_base(client, "ups-deploytest-base:1")
        build_app(client, root / "ctx", "ups-deploytest:app", version="1")
        first = _transfer_bytes(client, remote.url, server, root, "ups-deploytest:app")
        build_app(client, root / "ctx", "ups-deploytest:app", version="2")
        code = _transfer_bytes(client, remote.url, server, root, "ups-deploytest:app")
        return {"first_deploy": first, "code_only_redeploy": code}
    finally:
        stop_engine(remote)
        stop_engine(local)
        stop_sshd(server)
        shutil.rmtree(root, ignore_errors=True)


def rebuild_with_code_change(local: Any, image: str) -> tuple[str, float]:
    """Rebuild the project Dockerfile from ``image``'s own sources and build args plus one
    changed line in ups/: what a code-only change produces. Returns (tag, seconds)."""
    import io
    import shutil
    import tarfile

    repo = Path(__file__).resolve().parents[1]
    labels = local.images.get(image).labels
    ctx = Path(tempfile.mkdtemp(prefix="ups-bd-ctx-"))
    box = local.containers.create(image, entrypoint=["true"])
    try:
        for path in (
            "/app/pyproject.toml",
            "/app/requirements.lock",
            "/app/pins.toml",
            "/app/configs",
            "/app/preflight",
            "/app/ups",
        ):
            stream, _ = box.get_archive(path)
            with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
                tar.extractall(ctx, filter="data")
    finally:
        box.remove()
    (ctx / "docker").mkdir()
    (ctx / "requirements.lock").rename(ctx / "docker" / "requirements.lock")
    shutil.copy(repo / "Dockerfile", ctx / "Dockerfile")
    with (ctx / "ups" / "__init__.py").open("a") as fh:
        fh.write("# one-line code change (benchmarks/bench_deploy.py)\n")
    args = {
        "BASE_IMAGE": labels["org.opencontainers.image.base.name"],
        "VERSION": labels["org.opencontainers.image.version"],
        "GIT_REVISION": labels["org.opencontainers.image.revision"],
        "BUILD_DATE": labels["org.opencontainers.image.created"],
        "TORCH_VERSION": labels["io.ups.pins.torch"],
        "CUDA_VERSION": labels["io.ups.pins.cuda"],
        "CUDNN_VERSION": labels["io.ups.pins.cudnn"],
        "NCCL_VERSION": labels["io.ups.pins.nccl"],
        "PYTHON_VERSION": labels["io.ups.pins.python"],
    }
    tag = f"{image}-codechange"
    t0 = time.time()
    local.images.build(path=str(ctx), tag=tag, buildargs=args, network_mode="host", rm=True)
    shutil.rmtree(ctx, ignore_errors=True)
    return tag, round(time.time() - t0, 1)


def bench_layers_real(image: str) -> dict[str, Any]:
    """The real image from the machine's engine: whole first deploy, then the code-only
    rebuild (:func:`rebuild_with_code_change`) deployed on top."""
    import shutil

    import docker

    from tests.docker_fixtures import start_engine, stop_engine

    local = docker.from_env()
    changed, build_s = rebuild_with_code_change(local, image)
    root = Path(tempfile.mkdtemp(prefix="ups-bd-", dir="/tmp"))
    server = start_sshd(root / "sshd")
    remote = start_engine(root / "r")
    try:
        first = _transfer_bytes(local, remote.url, server, root, image)
        code = _transfer_bytes(local, remote.url, server, root, changed)
        code["rebuild_seconds"] = build_s
        return {"first_deploy": first, "code_only_redeploy": code}
    finally:
        stop_engine(remote)
        stop_sshd(server)
        shutil.rmtree(root, ignore_errors=True)
        local.images.remove(changed)  # its layers stay shared with the original


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lines", type=int, default=3000)
    p.add_argument("--rate", type=float, default=200.0, help="lines per second")
    p.add_argument("--drops", type=int, default=5)
    p.add_argument("--keepalive", type=int, default=2)
    p.add_argument("--docker", action="store_true", help="also measure image transfer bytes")
    p.add_argument("--real-image", help="with --docker: also measure this image (e.g. ups:cpu)")
    p.add_argument("--skip-stream", action="store_true")
    args = p.parse_args()
    setup_logging(console=True, stdout=sys.stderr)
    result: dict[str, Any] = {}
    if not args.skip_stream:
        result["stream_steady"] = bench_stream(args.lines // 3, args.rate, 0, args.keepalive)
        result["stream"] = bench_stream(args.lines, args.rate, args.drops, args.keepalive)
    if args.docker:
        result["docker_tiny"] = bench_layers_tiny()
        if args.real_image:
            result["docker_real"] = bench_layers_real(args.real_image)
    sys.stdout.write(jsonio.dumps(result, indent=2) + "\n")
    stream = result.get("stream", {"lines_lost": 0, "byte_identical": True})
    return 0 if stream["lines_lost"] == 0 and stream["byte_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
