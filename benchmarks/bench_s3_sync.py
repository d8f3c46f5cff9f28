"""What ``checkpoint_sync: s3://`` costs the training step, and how far the bucket lags behind.

Run from the repository root::

    .venv/bin/python benchmarks/bench_s3_sync.py                      # demo, 3 pairs
    .venv/bin/python benchmarks/bench_s3_sync.py --steps 300 --every 20 --pairs 4

Two torchrun ranks (gloo, CPU) train ``configs/demo.yaml`` for ``--steps`` steps with a
checkpoint every ``--every`` steps, alternately without (A) and with (B) checkpoint_sync to
a real S3 gateway on loopback (``rclone serve s3``, tests/s3_server.py): A B A B ...
Step time is rank 0's mean over the steady state (the ``train_step`` events' timestamps
after ``--warmup`` steps; checkpoint saves included, as a user sees them). Each pair gives
one ratio B/A; the median and the spread (min..max) are reported. Upload lag is the
``checkpoint_synced`` events' ``lag_s``: seconds from the local commit (the digest file's
mtime) to the digest object written in the bucket.

``--interference`` measures instead, in one process, what the uploader thread takes from
the training thread when it never rests: blocks of a fixed CPU-bound torch workload (one
thread) alternate with the uploader idle and the uploader sending a checkpoint-sized
file (``--ckpt-mib``) back to back, seconds apart, so the machine's load drifts alike
for both; one ratio per pair. A real run uploads once per ``every_steps``, so this is
the worst case.

Results go to stdout and ``--out`` (default ``benchmarks/results/s3_sync_cpu.json``,
``s3_sync_interference_cpu.json`` with ``--interference``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.s3_server import S3Server  # noqa: E402  # the tests' gateway, from the repo root
from ups import jsonio  # noqa: E402


def _events(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            out.append(event)
    return out


def _ts(event: dict[str, Any]) -> float:
    return dt.datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


def run_once(
    name: str, work: Path, args: argparse.Namespace, server: S3Server | None
) -> dict[str, Any]:
    out = work / name
    overrides = [
        f"run.output_dir={out}",
        "run.run_id=bench",
        f"training.max_steps={args.steps}",
        "training.log_every=1",
        "wandb.mode=disabled",
        f"checkpoint.every_steps={args.every}",
        "distributed.backend=gloo",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "UPS_", "AWS_"))}
    env["OMP_NUM_THREADS"] = "1"
    if server is not None:
        overrides += [
            f"checkpoint_sync.url={server.url(name)}",
            f"checkpoint_sync.endpoint_url={server.endpoint_url}",
        ]
        env.update(server.client_env())
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        "--monitor-interval=0.2", "-m", "ups.train.main", "configs/demo.yaml",
        *[a for o in overrides for a in ("--set", o)],
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: exited {proc.returncode}\n{proc.stdout[-3000:]}")
    events = _events(out / "bench" / "logs" / "rank0.jsonl")
    done = {e["step"]: _ts(e) for e in events if e["event"] == "train_step"}
    first, last = args.warmup - 1, args.steps - 1
    lags = [e["lag_s"] for e in events if e["event"] == "checkpoint_synced"]
    upload_s = [e["seconds"] for e in events if e["event"] == "checkpoint_synced"]
    outcome = json.loads((out / "bench" / "outcome.json").read_text())
    return {
        "name": name,
        "sync": server is not None,
        "step_ms": 1000 * (done[last] - done[first]) / (last - first),
        "upload_lag_s": lags,
        "upload_s": upload_s,
        "checkpoint_sync": outcome.get("checkpoint_sync"),
    }


def interference(args: argparse.Namespace, work: Path, server: S3Server) -> dict[str, Any]:
    import hashlib
    import threading
    import time

    import torch

    from ups.bucket import Bucket
    from ups.bucket.uploader import Uploader
    from ups.log import setup_logging

    torch.set_num_threads(1)
    setup_logging(stdout=open(os.devnull, "w"))  # noqa: SIM115  # lives as long as the process
    for key, value in server.client_env().items():
        os.environ[key] = value
    run_dir = work / "run"
    ckpts = run_dir / "checkpoints"
    ckpts.mkdir(parents=True)
    payload = os.urandom(int(args.ckpt_mib * 2**20))
    digest = hashlib.sha256(payload).hexdigest() + "\n"
    bucket = Bucket.open(server.url(), endpoint_url=server.endpoint_url)
    uploader = Uploader(bucket, "bench", run_dir, keep_last=2).start(announce=False)
    busy, uploads = threading.Event(), [0]

    def feed() -> None:  # a new checkpoint as soon as the last one is in the bucket
        step = 0
        while True:
            busy.wait()
            step += 1
            path = ckpts / f"step_{step:06d}.pt"
            path.write_bytes(payload)
            path.with_name(path.name + ".sha256").write_text(digest)
            uploader.flush(120)
            uploads[0] += 1
            for old in sorted(ckpts.glob("step_*"))[:-4]:
                old.unlink()

    threading.Thread(target=feed, daemon=True).start()
    a, b = torch.randn(256, 256), torch.randn(256, 256)

    def block() -> float:
        started = time.perf_counter()
        for _ in range(args.iters):
            (a @ b).relu_().sum()
        return (time.perf_counter() - started) / args.iters * 1000

    block()  # warm-up
    idle, loaded = [], []
    for _ in range(args.pairs):
        busy.clear()
        time.sleep(0.5)  # let an upload in flight finish
        idle.append(block())
        busy.set()
        time.sleep(0.2)
        loaded.append(block())
    busy.clear()
    ratios = [y / x for x, y in zip(idle, loaded, strict=True)]
    return {
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "ratios": ratios,
        "idle_ms": idle,
        "uploading_ms": loaded,
        "uploads": uploads[0],
        "ckpt_mib": args.ckpt_mib,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=20, help="checkpoint.every_steps")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--interference", action="store_true")
    parser.add_argument("--iters", type=int, default=500, help="--interference: per block")
    parser.add_argument("--ckpt-mib", type=float, default=1.4, help="--interference")
    args = parser.parse_args()
    results = REPO / "benchmarks" / "results"
    if args.interference:
        args.out = args.out or results / "s3_sync_interference_cpu.json"
        with tempfile.TemporaryDirectory(prefix="bench-s3-") as tmp:
            server = S3Server(Path(tmp) / "s3")
            server.start()
            try:
                found = interference(args, Path(tmp), server)
            finally:
                server.stop()
        found["command"] = " ".join(
            [".venv/bin/python", "benchmarks/bench_s3_sync.py", *sys.argv[1:]]
        )
        args.out.write_text(jsonio.dumps(found, indent=2) + "\n")
        print(
            f"training-thread work while the uploader sends {args.ckpt_mib:g} MiB back to back "
            f"/ idle: median {found['ratio_median']:.3f} (spread {found['ratio_min']:.3f}.."
            f"{found['ratio_max']:.3f}, {args.pairs} pairs, {found['uploads']} uploads) -> "
            f"{args.out}"
        )
        return
    args.out = args.out or results / "s3_sync_cpu.json"
    # SIGTERM unwinds like Ctrl-C: subprocess.run kills the run in flight, the gateway stops.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if not (REPO / "data" / "demo").is_dir():
        subprocess.run([sys.executable, "-m", "ups", "data", "synth"], check=True, cwd=REPO)
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-s3-") as tmp:
        work = Path(tmp)
        server = S3Server(work / "s3")
        server.start()
        try:
            for pair in range(args.pairs):
                for sync in (False, True):
                    name = f"{'B-sync' if sync else 'A-local'}-{pair}"
                    runs.append(run_once(name, work, args, server if sync else None))
                    print(f"{name}: {runs[-1]['step_ms']:.1f} ms/step", flush=True)
        finally:
            server.stop()
    ratios = [b["step_ms"] / a["step_ms"] for a, b in zip(runs[::2], runs[1::2], strict=True)]
    lags = [lag for r in runs for lag in r["upload_lag_s"]]
    summary = {
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "ratios": ratios,
        "step_ms_local": [r["step_ms"] for r in runs[::2]],
        "step_ms_sync": [r["step_ms"] for r in runs[1::2]],
        "upload_lag_s_median": statistics.median(lags),
        "upload_lag_s_max": max(lags),
        "uploads": len(lags),
    }
    result = {
        "command": " ".join([".venv/bin/python", "benchmarks/bench_s3_sync.py", *sys.argv[1:]]),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "time": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "steps": args.steps,
        "every_steps": args.every,
        "warmup": args.warmup,
        "summary": summary,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(jsonio.dumps(result, indent=2) + "\n")
    print(
        f"step time with checkpoint_sync / without: median {summary['ratio_median']:.3f} "
        f"(spread {summary['ratio_min']:.3f}..{summary['ratio_max']:.3f}, {args.pairs} ABAB "
        f"pairs); upload lag median {summary['upload_lag_s_median']:.3f} s, max "
        f"{summary['upload_lag_s_max']:.3f} s over {len(lags)} uploads -> {args.out}"
    )


if __name__ == "__main__":
    main()
