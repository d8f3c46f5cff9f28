"""Benchmark the CPU image: size, layers, rebuild cost of a one-line change, time to train.

1. Image size and the size of every layer (``docker history``), CPU image ``ups:cpu``.
2. Two builds whose contexts differ by one line in ``ups/`` (a comment appended to
   ``ups/__init__.py`` in a copy of the context): which layers are new in the second
   image, their bytes against the whole image, and the rebuild time. New layers are what
   a registry push or ``ups deploy``'s only-missing-layers transfer has to send.
3. The README's command, ``docker compose ... up --attach-dependencies --exit-code-from
   train-ddp train-ddp`` (CPU override, demo data, a 20-step config) with the image
   already built: seconds from the command to preflight done, to the trainer's
   ``train_start`` and to its first ``train_step``, and to the end of the run.

    scripts/docker-engine.sh && scripts/build-images.sh
    .venv/bin/python benchmarks/bench_image.py [--json benchmarks/results/image_cpu.json]
    .venv/bin/python benchmarks/bench_image.py --compose-only --repeats 3 \
        --json benchmarks/results/docker_first_step.json      # section 3 only

Prints tables; needs a Docker engine (scripts/docker-engine.sh) and root or the docker group.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from ups import jsonio

ROOT = Path(__file__).resolve().parents[1]
IMAGE = os.environ.get("UPS_IMAGE_CPU", "ups:cpu")
BASE = os.environ.get("UPS_BASE_CPU_IMAGE", "ups-base-cpu:torch2.13.0-py3.11-bookworm")
CONTEXT = ["Dockerfile", "pyproject.toml", "pins.toml", "docker/requirements.lock"]
CONTEXT_DIRS = ["configs", "preflight", "ups"]
MB = 1e6


def sh(*cmd: str, **kw: Any) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, **kw)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])}... failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return str(out.stdout)


def layers(image: str) -> list[dict[str, Any]]:
    """One entry per filesystem layer, oldest first: diff id, bytes, the step that made it.

    Legacy-builder history marks metadata steps (ENV, LABEL, ...) as ``#(nop)`` with no
    layer; COPY/ADD are ``#(nop)`` too but do make one. The rest (RUN, import) make one.
    """
    diff_ids = json.loads(sh("docker", "image", "inspect", "-f", "{{json .RootFS.Layers}}", image))
    rows = []
    for line in reversed(sh("docker", "history", "--no-trunc", "--human=false", "--format",
                            "{{.Size}}\t{{.CreatedBy}}", image).splitlines()):  # fmt: skip
        size, created = line.split("\t", 1)
        step = created.split("#(nop)", 1)[1].strip() if "#(nop)" in created else created
        if "#(nop)" in created and not step.startswith(("COPY", "ADD")):
            continue
        rows.append({"bytes": int(size), "step": " ".join(step.split())[:70]})
    if len(rows) != len(diff_ids):
        raise SystemExit(f"{image}: {len(rows)} history layers vs {len(diff_ids)} diff ids")
    for row, diff_id in zip(rows, diff_ids, strict=True):
        row["diff_id"] = diff_id
    return rows


def build(context: Path, tag: str) -> float:
    start = time.monotonic()
    sh("docker", "build", "--quiet", "--network", "host", "--build-arg", f"BASE_IMAGE={BASE}",
       "-t", tag, str(context), env={**os.environ, "DOCKER_BUILDKIT": "0"})  # fmt: skip
    return time.monotonic() - start


def one_line_rebuild(tmp: Path) -> dict[str, Any]:
    ctx = tmp / "context"
    ctx.mkdir()
    for name in CONTEXT:
        (ctx / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, ctx / name)
    for name in CONTEXT_DIRS:
        shutil.copytree(ROOT / name, ctx / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(ROOT / ".dockerignore", ctx / ".dockerignore")
    build(ctx, "ups:bench-a")  # warm: the same context as a normal build, mostly cached
    with (ctx / "ups/__init__.py").open("a") as f:
        f.write(f"# bench_image one-line change {time.time()}\n")
    seconds = build(ctx, "ups:bench-b")
    before = {row["diff_id"] for row in layers("ups:bench-a")}
    after = layers("ups:bench-b")
    new = [row for row in after if row["diff_id"] not in before]
    total = sum(row["bytes"] for row in after)
    sh("docker", "image", "rm", "ups:bench-a", "ups:bench-b")
    return {
        "rebuild_s": round(seconds, 1),
        "new_layers": new,
        "new_bytes": sum(row["bytes"] for row in new),
        "image_bytes": total,
    }


UP_ARGS = ("up", "--attach-dependencies", "--exit-code-from", "train-ddp", "train-ddp")
"""The README's compose command after the -f files (exit code = train-ddp's)."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def _ts(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def compose_up(tmp: Path) -> dict[str, Any]:
    dirs = {name: tmp / name for name in ("data", "cache", "runs", "state")}
    for path in dirs.values():
        path.mkdir()
        path.chmod(0o777)
    sh(sys.executable, "-m", "ups", "data", "synth", "--out", str(dirs["data"] / "demo"))
    demo = yaml.safe_load((ROOT / "configs/demo.yaml").read_text())
    demo["training"].update(max_steps=20, epochs=1)
    demo["distributed"]["master_port"] = _free_port()
    (dirs["state"] / "bench.yaml").write_text(yaml.safe_dump(demo))
    env = {k: v for k, v in os.environ.items() if not k.startswith("UPS_")}
    env.update(
        UPS_IMAGE_CPU=IMAGE, UPS_CONFIG=".ups/bench.yaml", UPS_RUN_ID="bench",
        UPS_DATA_DIR=str(dirs["data"]), UPS_CACHE_DIR=str(dirs["cache"]),
        UPS_RUNS_DIR=str(dirs["runs"]), UPS_STATE_DIR=str(dirs["state"]),
    )  # fmt: skip
    compose = ["docker", "compose", "-p", f"ups-bench-{os.getpid()}", "-f", "docker-compose.yml",
               "-f", "docker/compose.cpu.yml"]  # fmt: skip
    try:
        start = time.time()
        sh(*compose, *UP_ARGS, cwd=ROOT, env=env)
        ended = time.time()
        pre_id = sh(*compose, "ps", "-a", "-q", "preflight", cwd=ROOT, env=env).split()[0]
        pre = json.loads(sh("docker", "inspect", pre_id))[0]["State"]
        ddp_id = sh(*compose, "ps", "-a", "-q", "train-ddp", cwd=ROOT, env=env).split()[0]
        ddp = json.loads(sh("docker", "inspect", ddp_id))[0]["State"]
    finally:
        subprocess.run([*compose, "down"], cwd=ROOT, env=env, capture_output=True, check=False)
    events = [
        json.loads(line)
        for line in (dirs["runs"] / "bench/logs/rank0.jsonl").read_text().splitlines()
        if line.startswith("{")
    ]
    first: dict[str, float] = {}
    for e in events:
        first.setdefault(str(e.get("event")), _ts(e["timestamp"]))
    outcome = json.loads((dirs["runs"] / "bench/outcome.json").read_text())["outcome"]
    return {
        "preflight_started_s": round(_ts(pre["StartedAt"]) - start, 1),
        "preflight_done_s": round(_ts(pre["FinishedAt"]) - start, 1),
        "train_ddp_started_s": round(_ts(ddp["StartedAt"]) - start, 1),
        "train_start_s": round(first["train_start"] - start, 1),
        "first_step_s": round(first["train_step"] - start, 1),
        "up_returned_s": round(ended - start, 1),
        "outcome": outcome,
    }


def _print_up(ups: list[dict[str, Any]]) -> None:
    print("\n3. The README's `docker compose ... up` (CPU override, demo config, 20 steps)")
    for key, label in (
        ("preflight_started_s", "preflight container started"),
        ("preflight_done_s", "preflight passed (gate open)"),
        ("train_ddp_started_s", "train-ddp container started (ups launch)"),
        ("train_start_s", "trainer train_start (rank 0)"),
        ("first_step_s", "first training step logged"),
        ("up_returned_s", "compose up returned (outcome " + ups[-1]["outcome"] + ")"),
    ):
        print("  ".join(f"{u[key]:7.1f}" for u in ups) + f" s  {label}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    parser.add_argument("--compose-only", action="store_true", help="section 3 only")
    parser.add_argument("--repeats", type=int, default=1, help="section 3 runs (--compose-only)")
    args = parser.parse_args(argv)
    load = os.getloadavg()
    print(f"ups image benchmark - {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC")
    engine = sh("docker", "version", "--format", "{{.Server.Version}}").strip()
    driver = sh("docker", "info", "--format", "{{.Driver}}").strip()
    print(
        f"engine {engine} ({driver}), {os.cpu_count()} CPU cores shared with other jobs "
        f"(load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}), {platform.machine()}"
    )

    if args.compose_only:
        ups = []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory(prefix="ups-bench-compose-") as tmp:
                Path(tmp).chmod(0o755)
                ups.append(compose_up(Path(tmp)))
        _print_up(ups)
        if args.json:
            result = {"image": IMAGE, "engine": engine, "load": load, "compose_up": ups}
            args.json.write_text(jsonio.dumps(result, indent=2) + "\n")
        return 0

    rows = layers(IMAGE)
    total = sum(r["bytes"] for r in rows)
    print(f"\n1. {IMAGE}: {total / MB:.1f} MB in {len(rows)} layers")
    print(f"{'MB':>9}  {'share':>6}  step")
    for r in rows:
        print(f"{r['bytes'] / MB:9.3f}  {r['bytes'] / total:6.1%}  {r['step']}")

    with tempfile.TemporaryDirectory(prefix="ups-bench-image-") as tmp:
        rebuild = one_line_rebuild(Path(tmp))
    print("\n2. Rebuild after a one-line change in ups/__init__.py")
    print(f"rebuild time {rebuild['rebuild_s']} s; new layers:")
    for r in rebuild["new_layers"]:
        print(f"{r['bytes'] / MB:9.3f} MB  {r['step']}")
    share = rebuild["new_bytes"] / rebuild["image_bytes"]
    print(f"new bytes {rebuild['new_bytes'] / MB:.3f} MB of {rebuild['image_bytes'] / MB:.1f} MB "
          f"({share:.3%}); the other layers are reused as they are")  # fmt: skip

    with tempfile.TemporaryDirectory(prefix="ups-bench-compose-") as tmp:
        Path(tmp).chmod(0o755)
        up = compose_up(Path(tmp))
    _print_up([up])

    if args.json:
        result = {
            "image": IMAGE, "engine": engine, "driver": driver, "load": load,
            "image_bytes": total, "layers": rows, "rebuild": rebuild, "compose_up": up,
        }  # fmt: skip
        args.json.write_text(jsonio.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
