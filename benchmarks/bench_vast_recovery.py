"""Recovery after an outbid, and checkpoint sync, for `fab deploy --host vast`.

    .venv/bin/python benchmarks/bench_vast_recovery.py [--repeats 3]

Runs against the FAKE Vast API of the tests (tests/fake_vast.py): the control plane is
fake, the instances are real (sshd as PID 1 of their own namespace). The first instance
hangs at step 15 (a ``hang`` fault), checkpoints are every 10 steps; once checkpoint 10 is
synced home the benchmark outbids the instance and times, from the outbid: detected (the
"lost: outbid" line), new instance created, running, run started, first resumed step
(the "resumed" event streamed back). Also: bytes and seconds per synced checkpoint vs
its size, and the steps recomputed per recovery. Monitor and sync poll every 1 s (the
hosts.yaml defaults are 15 s and 10 s). Median and min-max over the repeats; writes
benchmarks/results/vast_recovery.json.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.deploy_fixtures import FAB, REPO, VENV_BIN, _keygen, demo_config
from tests.fake_vast import FakeVast, fab_env, write_vast_hosts
from ups import jsonio

PHASES = [
    ("detected", "lost: outbid"),
    ("created", "created instance"),
    ("running", "running; ssh"),
    ("started", "started run"),
    ("first_resumed_step", "resumed; since detection"),
]
SYNC = re.compile(r"synced checkpoint step (\d+): ([\d.]+) (\w+) in ([\d.]+) s")
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def one(tmp: Path, data: Path, run: str) -> dict[str, Any]:
    (tmp / "fake").mkdir()
    (tmp / "workspace").mkdir()
    _keygen(tmp / "fake" / "client_ed25519")
    with FakeVast(tmp / "fake", tmp / "workspace", [tmp / "fake" / "client_ed25519"]) as fake:
        fake.disk_seeds = [{".faults": "hang@0:15"}]
        hosts = write_vast_hosts(
            fake, tmp / "hosts.yaml", setup=f"mkdir -p data && ln -sfn {data} data/demo",
            remote_env=f'export UPS_FAULTS="$(cat {fake.workdir}/.faults 2>/dev/null)"',
            sync_every_s=1, monitor_s=1, interruptible=True,
        )  # fmt: skip
        config = demo_config(tmp / "demo.yaml", max_steps=20)
        args = ["deploy", "--host", "vast", "--hosts-file", str(hosts), "--config", str(config),
                "--run", run]  # fmt: skip
        proc = subprocess.Popen(
            [str(FAB), "-r", str(REPO), *args], cwd=tmp, env=fab_env(fake, tmp), text=True,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        lines: list[tuple[float, str]] = []

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append((time.monotonic(), line))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        ckpt = tmp / "runs" / run / "checkpoints" / "step_000010.pt"
        deadline = time.monotonic() + 600
        while not ckpt.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("checkpoint 10 never synced")
            time.sleep(0.1)  # the handshake: the synced checkpoint
        (first,) = fake.live()
        t_outbid = time.monotonic()
        fake.outbid(first.id)
        if proc.wait(timeout=600) != 0:
            raise RuntimeError("the deploy failed:\n" + "".join(x for _, x in lines)[-3000:])
        reader.join(timeout=30)
        if fake.live():
            raise RuntimeError("instance left behind")
    after = [(t, x) for t, x in lines if t >= t_outbid]
    phases = {}
    for name, marker in PHASES:
        phases[name] = next(t for t, x in after if marker in x) - t_outbid
    syncs = []
    for _, x in lines:
        if m := SYNC.search(x):
            step = int(m.group(1))
            size = (tmp / "runs" / run / "checkpoints" / f"step_{step:06d}.pt").stat().st_size
            sent = float(m.group(2)) * UNITS[m.group(3)]
            syncs.append({"step": step, "size": size, "sent": sent, "s": float(m.group(4))})
    lost = re.search(r"from step (\d+) \((\d+) steps to recompute\)", "".join(x for _, x in lines))
    assert lost is not None
    return {"phases": phases, "syncs": syncs, "steps_lost": int(lost.group(2))}


def spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3)}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-vast-recovery-") as scratch:
        root = Path(scratch)
        data = root / "data"
        subprocess.run([str(VENV_BIN / "ups"), "data", "synth", "--out", str(data)], check=True,
                       capture_output=True, timeout=600)  # fmt: skip
        runs = []
        for i in range(args.repeats):
            (root / f"r{i}").mkdir()
            runs.append(one(root / f"r{i}", data, f"bench-{i}"))
    syncs = [s for r in runs for s in r["syncs"]]
    result = {
        "what": "outbid -> resumed on a new instance (FAKE control plane, real instances)",
        "repeats": args.repeats,
        "cpus": os.cpu_count(),
        "load_avg_1m_after": round(os.getloadavg()[0], 2),
        "poll_s": {"monitor_s": 1, "sync_every_s": 1},
        "since_outbid_s": {name: spread([r["phases"][name] for r in runs]) for name, _ in PHASES},
        "checkpoint_bytes": spread([s["size"] for s in syncs]),
        "sync_sent_bytes": spread([s["sent"] for s in syncs]),
        "sync_s": spread([s["s"] for s in syncs]),
        "steps_lost_per_recovery": spread([r["steps_lost"] for r in runs]),
        "raw": runs,
    }
    text = jsonio.dumps(result, indent=2)
    print(text)
    (Path(__file__).parent / "results" / "vast_recovery.json").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
