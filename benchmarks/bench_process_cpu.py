"""CPU seconds of ups's own processes, for two checkouts side by side in one run.

Every `ups launch` starts the launch process, torchrun's agent and one worker per rank; a
deploy adds ups-preflight and a remote version check. On a 2-core machine (this repo's
CI) what each of those imports before doing any work adds up: about 1.5 s of CPU per
process that imports torch. This measures, per checkout (``PYTHONPATH`` set to it, so
the launched processes import that checkout's ``ups``), alternating between them:

- ``worker``: ``import ups.train.main`` and ``ups.train.worker`` (what each rank imports);
- ``launch``: the modules ``ups launch``'s own process imports;
- ``preflight``: ``import ups.preflight.cli``;
- ``code check``: deploy's remote version check (``ups.deploy.transport.remote.code_info_command``;
  the old checkouts' probe if that is what the checkout has);
- ``run``: a whole ``ups launch`` of the demo config, 20 steps, 2 ranks, no preflight
  (CPU of the launch process and every process under it); ``launch self``: the launch
  process's own share of it (its threads: the tee, the samplers of the ranks' processes);
- ``train --help``: ``python -m ups.train.main --help``;
- ``refusal``: ``ups launch`` of the demo config with ``training.precision=fp16`` on this
  CPU machine, which the workers refuse (exit 2 once launch refuses it itself, exit 1
  after preflight and torchrun before).

    .venv/bin/python benchmarks/bench_process_cpu.py --trees OLD_CHECKOUT . [--repeat 5]

CPU time (user + system of the process and its waited-for children), not wall time: the
machine may be busy, and CPU is what the processes cost it. Prints medians with the
min..max spread and the ratio of the last tree to the first; ``--json PATH`` writes them.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from ups import jsonio

PY = sys.executable
IMPORTS = {
    # ups-train imports its worker (ups.train.worker) once its flags are read.
    "worker": "import importlib.util, ups.train.main\n"
    "if importlib.util.find_spec('ups.train.worker'): import ups.train.worker",
    "launch": "import ups.cli.launch, ups.launch.execute, ups.launch.finalize",
    "preflight": "import ups.preflight.cli",
}


def _cpu(argv: list[str], env: dict[str, str], cwd: Path, *, check: bool = True) -> float:
    """User + system CPU seconds of ``argv`` and everything it waited for."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, env=env, cwd=cwd, check=check, capture_output=True, timeout=600)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _cpu_and_own(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """:func:`_cpu`, and the CPU seconds of ``argv``'s process alone (read once it has
    exited, before it is reaped: a zombie keeps its own times, without its children's)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    me = psutil.Process(proc.pid)
    while me.status() != psutil.STATUS_ZOMBIE:
        time.sleep(0.05)
    own = me.cpu_times()
    if proc.wait(timeout=600) != 0:
        raise subprocess.CalledProcessError(proc.returncode, argv)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return total, own.user + own.system


def _code_check(tree: Path, env: dict[str, str], work: Path) -> list[str]:
    """The checkout's own remote version check, run here with this venv's ups. (From
    ``work``: ``python -c`` puts its working directory ahead of ``PYTHONPATH``.)"""
    build = (
        "from ups.deploy.transport.remote import code_info_command; "
        f"print(code_info_command({str(Path(PY).with_name('ups'))!r}))"
    )
    command = subprocess.run(
        [PY, "-c", build], env=env, cwd=work, check=True, capture_output=True, text=True
    ).stdout.strip()
    return ["bash", "-c", command]


def measure(tree: Path, data: Path, work: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree.resolve()), "OMP_NUM_THREADS": "1"}
    row = {name: _cpu([PY, "-c", code], env, work) for name, code in IMPORTS.items()}
    row["code check"] = _cpu(_code_check(tree, env, work), env, work)
    run_dir = Path(tempfile.mkdtemp(dir=work))
    (run_dir / "data").mkdir()
    (run_dir / "data" / "demo").symlink_to(data.resolve())
    config = (tree / "configs" / "demo.yaml").resolve()
    row["run"], row["launch self"] = _cpu_and_own(
        [PY, "-m", "ups", "launch", str(config), "--skip-preflight", "--set",
         "training.max_steps=20", "--set", "wandb.mode=offline", "--set",
         f"distributed.master_port={_free_port()}"],
        env, run_dir,
    )  # fmt: skip
    row["train --help"] = _cpu([PY, "-m", "ups.train.main", "--help"], env, work)
    row["refusal"] = _cpu(
        [PY, "-m", "ups", "launch", str(config), "--set", "training.precision=fp16",
         "--set", f"distributed.master_port={_free_port()}"],
        env, run_dir, check=False,
    )  # fmt: skip
    return row


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", nargs="+", type=Path, required=True, help="checkouts")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--data", type=Path, default=Path("data/demo"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    samples: dict[str, dict[str, list[float]]] = {str(t): {} for t in args.trees}
    with tempfile.TemporaryDirectory() as work:
        for _ in range(args.repeat):
            for tree in args.trees:  # alternating, so drift in load hits both alike
                for name, cpu in measure(tree, args.data, Path(work)).items():
                    samples[str(tree)].setdefault(name, []).append(cpu)
    first, last = str(args.trees[0]), str(args.trees[-1])
    report: dict[str, Any] = {"repeat": args.repeat, "commits": {}, "trees": {}}
    for tree in args.trees:
        head = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True)  # fmt: skip
        report["commits"][str(tree)] = head.stdout.strip() or None
    print(f"{'':12}" + "".join(f"{t[-28:]:>30}" for t in samples) + "   ratio last/first")
    for name in samples[first]:
        cells = []
        for tree, rows in samples.items():
            values = rows[name]
            med = statistics.median(values)
            report["trees"].setdefault(tree, {})[name] = {
                "median_cpu_s": round(med, 3), "min": round(min(values), 3),
                "max": round(max(values), 3),
            }  # fmt: skip
            cells.append(f"{med:7.2f} s ({min(values):.2f}..{max(values):.2f})")
        ratio = statistics.median(samples[last][name]) / statistics.median(samples[first][name])
        report.setdefault("ratios", {})[name] = round(ratio, 3)
        print(f"{name:12}" + "".join(f"{c:>30}" for c in cells) + f"   {ratio:.3f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(jsonio.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
