"""Time `fab deploy --host vast` from the command to the first training step, and its split.

    .venv/bin/python benchmarks/bench_vast.py [--repeats 2]

Runs against the FAKE Vast API of the tests (tests/fake_vast.py): the control plane is
fake, the instance is real (sshd as PID 1 of its own namespace, running this checkout's
ups). The fake's image pull takes ``boot_s`` and its SSH keys arrive ``key_delay_s`` after
"running" (both printed): on real Vast the image pull dominates and varies by host, so
these figures are ups's own overhead. Each phase ends when fab prints its line; the first
training step is the first ``train_step`` line streamed back. Prints one JSON object and
writes it to benchmarks/results/vast_deploy.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.deploy_fixtures import FAB, REPO, VENV_BIN, _keygen, demo_config
from tests.fake_vast import FakeVast, fab_env, write_vast_hosts
from ups import jsonio

MARKERS = [
    ("offer_search", "vast plan:"),
    ("create", "created instance"),
    ("running", "running; ssh"),
    ("ssh_ready", "ssh ready on"),
    ("preflight", "remote preflight on"),
    ("torchrun_start", "started run"),
    ("first_step", "train_step"),
]


def one_deploy(tmp: Path, data: Path, run: str) -> dict[str, float]:
    (tmp / "fake").mkdir()
    (tmp / "workspace").mkdir()
    _keygen(tmp / "fake" / "client_ed25519")
    seen: dict[str, float] = {}
    with FakeVast(tmp / "fake", tmp / "workspace", [tmp / "fake" / "client_ed25519"]) as fake:
        setup = f"mkdir -p data && ln -sfn {data} data/demo"
        hosts = write_vast_hosts(fake, tmp / "hosts.yaml", setup=setup)
        config = demo_config(tmp / "demo.yaml", max_steps=100_000)
        config.write_text(config.read_text().replace("log_every: 5", "log_every: 1"))
        args = ["deploy", "--host", "vast", "--hosts-file", str(hosts), "--config", str(config),
                "--run", run]  # fmt: skip
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [str(FAB), "-r", str(REPO), *args], cwd=tmp, env=fab_env(fake, tmp), text=True,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        done = threading.Event()

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                for name, marker in MARKERS:
                    if name not in seen and marker in line:
                        seen[name] = time.monotonic() - t0
                if "first_step" in seen:
                    done.set()

        threading.Thread(target=read, daemon=True).start()
        done.wait(timeout=600)
        proc.send_signal(2)  # Ctrl-C: the deploy destroys the instance before exiting
        proc.wait(timeout=120)
        if fake.live():
            raise RuntimeError("instance left behind after the benchmark's Ctrl-C")
    missing = [name for name, _ in MARKERS if name not in seen]
    if missing:
        raise RuntimeError(f"phases never reached: {missing}")
    return seen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-vast-") as scratch:
        root = Path(scratch)
        data = root / "data"
        subprocess.run([str(VENV_BIN / "ups"), "data", "synth", "--out", str(data)], check=True,
                       capture_output=True, timeout=600)  # fmt: skip
        runs = []
        for i in range(args.repeats):
            tmp = root / f"r{i}"
            tmp.mkdir()
            runs.append(one_deploy(tmp, data, f"bench-{i}"))
    names = [name for name, _ in MARKERS]
    split = {name: statistics.median(r[name] for r in runs) for name in names}
    phases, prev = {}, 0.0
    for name in names:
        phases[name] = round(split[name] - prev, 2)
        prev = split[name]
    result = {
        "what": "fab deploy --host vast (FAKE control plane, real instance) to first step",
        "repeats": args.repeats,
        "load_avg_1m_after": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
        "fake_boot_s": 0.5,
        "fake_key_delay_s": 1.0,
        "median_to_first_step_s": round(split["first_step"], 2),
        "phase_s_median": phases,
        "raw_cumulative_s": [{k: round(v, 2) for k, v in r.items()} for r in runs],
    }
    text = jsonio.dumps(result, indent=2)
    print(text)
    out = Path(__file__).parent / "results" / "vast_deploy.json"
    out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
