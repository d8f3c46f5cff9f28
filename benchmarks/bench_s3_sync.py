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

Results go to stdout and ``--out`` (default ``benchmarks/results/s3_sync_cpu.json``).
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=20, help="checkpoint.every_steps")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/s3_sync_cpu.json")
    args = parser.parse_args()
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
