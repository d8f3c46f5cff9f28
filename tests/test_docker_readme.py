"""The README's Docker commands, exactly as written, in a fresh clone with a root-owned runs/.

The commands are read from the README's Docker section (the CPU lines), so the test and
the README cannot drift apart. They run with ``bash -c`` in a ``git clone`` of this
repository. Only environment variables the compose files document change between runs
(``UPS_CONFIG`` for a short run, ``UPS_USER``, ``UPS_WANDB_KEY_FILE``); the command
text never does. Each run gets its own ``UPS_RUN_ID``, which names its compose project
(docker-compose.yml's ``name:``), so runs in one clone and on one engine stay apart.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

# Generous: on a loaded 2-core machine the first test also pays for the clone, the
# build check and the demo data (about 1-4 min), and each run for preflight and torch.
pytestmark = [
    pytest.mark.docker,
    pytest.mark.slow,
    pytest.mark.timeout(1500),
    pytest.mark.xdist_group("docker_readme"),  # one worker: the module's clone is built once
]

ROOT = Path(__file__).resolve().parents[1]
CPU_COMPOSE = "docker compose -f docker-compose.yml -f docker/compose.cpu.yml"


def readme_docker_commands() -> dict[str, str]:
    """The CPU commands of the README's Docker section: build, synth and up."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## On Docker") :]
    section = section[: section.index("\n## ")]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "the README's Docker section has no bash block"
    found = {}
    for line in block.group(1).splitlines():
        command = re.sub(r"\s+#.*$", "", line).strip()
        if command.startswith("scripts/docker-engine.sh"):
            found["build"] = command
        elif command.startswith(f"{CPU_COMPOSE} run --rm synth"):
            found["synth"] = command
        elif command.startswith(f"{CPU_COMPOSE} up"):
            found["up"] = command
    assert set(found) == {"build", "synth", "up"}, found
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


@dataclass
class Clone:
    root: Path
    commands: dict[str, str]
    image: str

    def env(self, **env: str) -> dict[str, str]:
        """The caller's environment without UPS_*/WANDB_*, plus a run id of its own (which
        names the compose project) unless ``env`` brings one."""
        base = {k: v for k, v in os.environ.items() if not k.startswith(("UPS_", "WANDB_"))}
        run_id = f"readme-{uuid.uuid4().hex[:8]}"
        return {**base, "UPS_RUN_ID": run_id, "UPS_IMAGE_CPU": self.image, **env}

    def start(self, name: str, env: dict[str, str]) -> subprocess.Popen[str]:
        """Start one README command verbatim in the clone; stdout and stderr together."""
        return subprocess.Popen(
            ["bash", "-c", self.commands[name]],
            cwd=self.root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def compose(self, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
        """``docker compose`` with the README's CPU files in the clone, under ``env``."""
        return subprocess.run(
            ["bash", "-c", " ".join([CPU_COMPOSE, *args])],
            cwd=self.root,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )

    def run(self, name: str, timeout: float = 600, **env: str) -> subprocess.CompletedProcess[str]:
        """Run one README command verbatim in the clone, then take its project down."""
        full = self.env(**env)
        proc = self.start(name, full)
        try:
            out, _ = proc.communicate(timeout=timeout)
            return subprocess.CompletedProcess(proc.args, proc.returncode, out)
        finally:
            proc.kill()
            proc.wait(timeout=30)
            self.compose(full, "down --remove-orphans --timeout 5")

    def config(self, name: str, **extra: Any) -> str:
        """A short variant of configs/demo.yaml under .ups/ (mounted at /app/.ups)."""
        cfg = yaml.safe_load((self.root / "configs/demo.yaml").read_text())
        cfg["training"].update(max_steps=6, log_every=1)
        cfg["distributed"]["master_port"] = _free_port()  # a shared machine: 29500 may be taken
        cfg["checkpoint"]["every_steps"] = 3
        cfg.update(extra)
        path = self.root / ".ups" / f"{name}.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(yaml.safe_dump(cfg))
        return f".ups/{name}.yaml"

    def outcome(self, output: str) -> dict[str, Any]:
        run_id = re.findall(r'"run_id":"([^"]+)"', output)[-1]
        result: dict[str, Any] = json.loads(
            (self.root / "runs" / run_id / "outcome.json").read_text()
        )
        return result


@pytest.fixture(scope="module")
def clone(ups_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clone]:
    """A fresh clone whose runs/ is root's (as Docker or `sudo make demo` leaves it), with the
    README's build and demo-data commands already run in it."""
    root = tmp_path_factory.mktemp("readme") / "ups"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(root)], check=True, timeout=120)
    (root / "runs").mkdir()
    os.chown(root / "runs", 0, 0)
    c = Clone(root=root, commands=readme_docker_commands(), image=ups_image)
    built = c.run("build", timeout=1200)
    assert built.returncode == 0, built.stdout[-3000:]
    synth = c.run("synth")
    assert synth.returncode == 0, synth.stdout[-3000:]
    assert (root / "data/demo/1D_Advection_Sols_beta0.4.hdf5").exists()
    yield c


def _paused(clone: Clone, run_id: str) -> bool:
    """Whether rank 0 of ``run_id`` has reached its ``pause`` fault."""
    log = clone.root / "runs" / run_id / "logs" / "rank0.jsonl"
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    events = [json.loads(line) for line in lines if line.startswith("{")]
    return any(e.get("event") == "fault_injected" and e.get("kind") == "pause" for e in events)


def _train_container(clone: Clone, env: dict[str, str]) -> str:
    """``ID RUNNING STARTED`` of the train-ddp container of ``env``'s run."""
    ids = clone.compose(env, "ps -a -q train-ddp").stdout.split()
    assert len(ids) == 1, ids
    fmt = "{{.Id}} {{.State.Running}} {{.State.StartedAt}}"
    out = subprocess.run(["docker", "inspect", "-f", fmt, ids[0]], capture_output=True,
                         text=True, check=True, timeout=60)  # fmt: skip
    return out.stdout.strip()


@dataclass
class Beside:
    """What the runs side by side left: outputs, exit codes, containers and files."""

    key: str
    image_id: str
    runs: dict[str, subprocess.CompletedProcess[str]]
    envs: dict[str, dict[str, str]]
    held_before: dict[str, str]
    held_after_others: dict[str, str]
    held_b_after_a_stopped: str
    held_b_running_after_a_stopped: bool
    stops: dict[str, subprocess.CompletedProcess[str]]
    cache_owner: tuple[int, int]
    probe: subprocess.CompletedProcess[str]
    probe_inspect: subprocess.CompletedProcess[str]
    wrong_user: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def beside(clone: Clone, ups_image: str) -> Iterator[Beside]:
    """One scenario, checked by the tests below. runs/ belongs to uid 1000 and cache/ is an
    empty root-owned directory (what the engine creates for a missing mount). Two runs are
    held mid-training (a pause at step 2); then the README's `compose up` of a good run
    (with a root-only 0600 W&B key file, UPS_WANDB_KEY_FILE) and of a bad one (an exception
    at step 3) run side by side to their ends; then `compose stop train-ddp` with one held
    run's UPS_RUN_ID, then the other's. Then a probe container of the good run's project
    reads the key as the run's user, and a run forced to another uid that cannot write
    runs/ is started."""
    image_id = _image_id(ups_image)  # before the key exists: no layer can hold it
    key = "ups-test-" + secrets.token_hex(16)
    key_file = clone.root.parent / "wandb_key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    os.chown(clone.root / "runs", 1000, 1000)
    cache = clone.root / "cache"
    cache.mkdir(exist_ok=True)
    for leftover in cache.iterdir():
        leftover.unlink()
    os.chown(cache, 0, 0)

    tag = uuid.uuid4().hex[:6]
    pause = [{"kind": "pause", "rank": rank, "step": 2} for rank in (0, 1)]
    held = {
        name: clone.env(UPS_RUN_ID=f"{name}-{tag}", UPS_CONFIG=clone.config(name, faults=pause))
        for name in ("held-a", "held-b")
    }
    faults = [{"kind": "exception", "rank": 1, "step": 3}]
    envs = {
        **held,
        "good": clone.env(UPS_CONFIG=clone.config("good"), UPS_WANDB_KEY_FILE=str(key_file)),
        "bad": clone.env(UPS_CONFIG=clone.config("bad", faults=faults)),
    }
    procs = {name: clone.start("up", env) for name, env in held.items()}
    project = f"ups-key-{uuid.uuid4().hex[:8]}"
    compose = f"{CPU_COMPOSE} -p {project}"
    try:
        deadline = time.monotonic() + 600
        while not all(_paused(clone, env["UPS_RUN_ID"]) for env in held.values()):
            for name, proc in procs.items():  # the held runs only, so far
                assert proc.poll() is None, f"{name} ended: {proc.communicate()[0][-3000:]}"
            assert time.monotonic() < deadline, "the held runs never reached their pause"
            time.sleep(1)
        before = {name: _train_container(clone, env) for name, env in held.items()}

        runs: dict[str, subprocess.CompletedProcess[str]] = {}
        for name in ("good", "bad"):
            procs[name] = clone.start("up", envs[name])
        for name in ("good", "bad"):
            out, _ = procs[name].communicate(timeout=600)
            runs[name] = subprocess.CompletedProcess(procs[name].args, procs[name].returncode, out)
        after_others = {name: _train_container(clone, env) for name, env in held.items()}

        stops = {"held-a": clone.compose(held["held-a"], "stop train-ddp")}
        out_a, _ = procs["held-a"].communicate(timeout=300)
        runs["held-a"] = subprocess.CompletedProcess([], procs["held-a"].returncode, out_a)
        b_running = procs["held-b"].poll() is None
        b_container = _train_container(clone, held["held-b"])
        stops["held-b"] = clone.compose(held["held-b"], "stop train-ddp")
        out_b, _ = procs["held-b"].communicate(timeout=300)
        runs["held-b"] = subprocess.CompletedProcess([], procs["held-b"].returncode, out_b)
        cache_owner = (cache.stat().st_uid, cache.stat().st_gid)

        probe = subprocess.run(
            ["bash", "-c", f"{compose} run --no-deps --name {project}-probe "
             f'--entrypoint ups-entrypoint train-ddp python -c "{KEY_PROBE}"'],
            cwd=clone.root, env=envs["good"], capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        probe_inspect = subprocess.run(
            ["docker", "inspect", f"{project}-probe"], capture_output=True, text=True, timeout=60
        )
        wrong_user = clone.run("up", UPS_CONFIG=clone.config("owner"), UPS_USER="1001:1001")
        yield Beside(
            key=key, image_id=image_id, runs=runs, envs=envs, held_before=before,
            held_after_others=after_others, held_b_after_a_stopped=b_container,
            held_b_running_after_a_stopped=b_running, stops=stops, cache_owner=cache_owner,
            probe=probe, probe_inspect=probe_inspect, wrong_user=wrong_user,
        )  # fmt: skip
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait(timeout=30)
        for env in envs.values():
            clone.compose(env, "down --remove-orphans --timeout 5")
        subprocess.run(
            ["bash", "-c", f"{compose} down --remove-orphans; docker rm -f {project}-probe"],
            cwd=clone.root, env=envs["good"], capture_output=True, timeout=120,
        )  # fmt: skip
        for name in ("runs", "cache"):
            os.chown(clone.root / name, 0, 0)


KEY_PROBE = (
    "import hashlib, os, pathlib; k = os.environ.get('WANDB_API_KEY', '').encode(); "
    "argv = b''.join(p.read_bytes() for p in pathlib.Path('/proc').glob('[0-9]*/cmdline')); "
    "print('PROBE', os.getuid(), hashlib.sha256(k).hexdigest(), k in argv)"
)
"""Run inside a container of the good run's project: its uid, the key's digest as the
entrypoint handed it over, and whether any process's argv carries the key."""


def test_readme_up_runs_beside_other_runs_and_exits_with_its_own_code(
    clone: Clone, beside: Beside
) -> None:
    """Runs on one engine are independent. With two runs held mid-training, the README's
    `compose up` of a good and a bad run side by side each go to their end: the preflight
    report first, then exit 0 `finished` and exit 1 `failed`; the bad run's abort touches
    neither held run. Then `compose stop train-ddp` with one held run's UPS_RUN_ID ends
    that one (exit 75, `preempted`) and the other keeps running, the same container, until
    it is stopped the same way."""
    good, bad = beside.runs["good"], beside.runs["bad"]
    assert all(c.split()[1] == "true" for c in beside.held_before.values()), beside.held_before
    assert good.returncode == 0, good.stdout[-4000:]
    assert "preflight OK" in good.stdout  # the preflight table, in this terminal
    assert good.stdout.index("preflight OK") < good.stdout.index('"train_step"')
    assert "Traceback" not in good.stdout
    outcome = clone.outcome(good.stdout)
    assert outcome["outcome"] == "finished" and outcome["exit_code"] == 0
    assert outcome["run_id"] == beside.envs["good"]["UPS_RUN_ID"]
    assert bad.returncode == 1, bad.stdout[-4000:]
    assert clone.outcome(bad.stdout)["outcome"] == "failed"
    assert beside.held_after_others == beside.held_before, "the good or bad run touched a held one"

    held_a, held_b = beside.runs["held-a"], beside.runs["held-b"]
    assert beside.stops["held-a"].returncode == 0, beside.stops["held-a"].stderr
    assert held_a.returncode == 75, held_a.stdout[-3000:]
    assert clone.outcome(held_a.stdout)["outcome"] == "preempted"
    assert beside.held_b_running_after_a_stopped, "stopping held-a ended held-b too"
    assert beside.held_b_after_a_stopped == beside.held_before["held-b"]
    assert beside.stops["held-b"].returncode == 0, beside.stops["held-b"].stderr
    assert held_b.returncode == 75, held_b.stdout[-3000:]
    assert clone.outcome(held_b.stdout)["run_id"] == beside.envs["held-b"]["UPS_RUN_ID"]


def test_readme_up_runs_as_the_owner_of_runs_with_a_key_nothing_else_sees(
    clone: Clone, beside: Beside, ups_image: str
) -> None:
    """The good run drills both the owner of runs/ and the W&B key file. When runs/ belongs
    to uid 1000 the run writes its files as uid 1000, and an empty root-owned cache/ (what
    the engine creates for a missing mount) is handed to it. A root-only 0600 key file
    named by UPS_WANDB_KEY_FILE is readable by the run's user inside the container, and
    the key is in no `docker inspect`, no process's argv, no log line, no run file and no
    image layer. Forcing another uid that cannot write runs/ ends with one paragraph
    naming the directory, the uid and the chown that fixes it, a non-zero exit and no
    traceback."""
    key, up = beside.key, beside.runs["good"]
    assert up.returncode == 0, up.stdout[-4000:]
    run_id = re.findall(r'"run_id":"([^"]+)"', up.stdout)[-1]
    written = clone.root / "runs" / run_id / "outcome.json"
    assert (written.stat().st_uid, written.stat().st_gid) == (1000, 1000)
    assert beside.cache_owner == (1000, 1000)

    checked = beside.probe
    line = next((x for x in checked.stdout.splitlines() if x.startswith("PROBE")), None)
    assert line, checked.stdout + checked.stderr
    _, uid, digest, in_argv = line.split()
    assert uid == "1000"
    assert digest == hashlib.sha256(key.encode()).hexdigest()  # read inside, by uid 1000
    assert in_argv == "False"  # no process's argv carries it
    inspect = beside.probe_inspect
    assert inspect.returncode == 0 and key not in inspect.stdout
    assert key not in up.stdout and key not in checked.stdout + checked.stderr
    for path in (clone.root / "runs" / run_id).rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert key.encode() not in path.read_bytes(), path
    # No layer can hold it: the image is the one that existed before the key did, and its
    # configuration and history (build args included) do not name it.
    assert _image_id(ups_image) == beside.image_id, "a run rebuilt or changed the image"
    assert key not in _image_metadata(ups_image)

    bad = beside.wrong_user
    assert bad.returncode != 0
    assert "Traceback" not in bad.stdout
    assert "cannot write /app/runs (the host directory ./runs" in bad.stdout
    assert "this container runs as uid 1001:1001" in bad.stdout
    assert "`sudo chown -R 1001:1001 ./runs`" in bad.stdout
    assert '"train_step"' not in bad.stdout


def _image_id(image: str) -> str:
    out = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", image],
                         capture_output=True, text=True, check=True, timeout=60)  # fmt: skip
    return out.stdout.strip()


def _image_metadata(image: str) -> str:
    """The image's configuration and its history: every build argument and command."""
    inspect = ["docker", "image", "inspect", image]
    history = ["docker", "history", "--no-trunc", image]
    return "".join(
        subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout
        for argv in (inspect, history)
    )
