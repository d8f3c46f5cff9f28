"""A script's workdir on the host: sent as changed files only, set up once per content.

The files sent are git's view of the workdir (tracked, plus untracked ones ``.gitignore``
does not ignore; every file when it is no git checkout, minus the root ``.gitignore``'s
patterns) without ups's own ``.ups/`` and ``runs/``, plus the run file's ``include``, minus
its ``exclude`` (gitignore patterns).
The host keeps what it received in ``.ups-sync.json``; the next deploy sends only the
files whose SHA-256 differs, as one gzip'd tar, and deletes the files gone here.
"""

from __future__ import annotations

import hashlib
import io
import json
import posixpath
import shlex
import tarfile
from dataclasses import dataclass
from pathlib import Path

from fabric import Connection

from ups.deploy.errors import DeployError, UsageError
from ups.deploy.transport import remote as rc
from ups.deploy.transport.session import Target, run, write_text
from ups.workfiles import files_to_send, left_behind
from ups.workload import ScriptWorkload

__all__ = ["files_to_send", "left_behind", "manifest", "sync"]

Manifest = dict[str, list[str | int]]
"""Relative POSIX path -> [size, sha256]."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def manifest(workload: ScriptWorkload) -> Manifest:
    root = workload.workdir
    return {p: [(root / p).stat().st_size, _sha256(root / p)] for p in files_to_send(workload)}


def code_dir(workdir: str, workload: ScriptWorkload) -> str:
    """Where the workdir lands on the host: ``<host workdir>/code/<script name>-<hash of
    the local workdir's path>``, so two projects whose scripts share a name stay apart and
    a redeploy of one project sends only what changed."""
    where = hashlib.sha256(str(workload.workdir.resolve()).encode()).hexdigest()[:8]
    return posixpath.join(workdir, "code", f"{workload.name}-{where}")


@dataclass(frozen=True)
class SyncResult:
    sent: int
    """Files sent (new or changed)."""
    removed: int
    unchanged: int
    bytes_sent: int
    """Size of the archive that crossed the wire."""


def _archive(root: Path, paths: list[str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for p in paths:
            tar.add(root / p, arcname=p, recursive=False)
    return buffer.getvalue()


def sync(target: Target, conn: Connection, workload: ScriptWorkload, dest: str) -> SyncResult:
    """Bring ``dest`` on the host to the workdir's content, sending changed files only."""
    spec = target.spec
    local = manifest(workload)
    text = run(conn, rc.read_file_command(posixpath.join(dest, rc.SYNC_MANIFEST)), spec).stdout
    try:
        remote: Manifest = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        remote = {}  # an unreadable record: send everything again
    changed = [p for p, entry in local.items() if remote.get(p) != entry]
    removed = sorted(set(remote) - set(local))
    size = 0
    if changed or removed:
        archive = posixpath.join(posixpath.dirname(dest), f".{workload.name}.sync.tar.gz")
        data = _archive(workload.workdir, changed)
        size = len(data)
        run(conn, rc.mkdir_command(posixpath.dirname(dest)), spec)
        conn.sftp().putfo(io.BytesIO(data), archive)
        result = run(conn, rc.unpack_command(archive, dest, removed), spec)
        if result.exited != 0:
            raise DeployError(f"unpacking the workdir on {spec.name!r} failed: {result.stderr}")
        write_text(conn, posixpath.join(dest, rc.SYNC_MANIFEST), json.dumps(local, indent=1))
    done = SyncResult(len(changed), len(removed), len(local) - len(changed), size)
    target.say(
        f"workdir {workload.workdir} -> {dest}: {done.sent} file(s) sent ({done.bytes_sent} "
        f"bytes), {done.removed} removed, {done.unchanged} unchanged"
    )
    return done


def setup_key(workload: ScriptWorkload, command: str) -> str:
    """The content hash a setup command is cached under: its text and the content of every
    workdir file it names (``pip install -r requirements.txt`` -> requirements.txt)."""
    digest = hashlib.sha256(command.encode())
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    for word in words:
        path = workload.workdir / word
        if path.is_file():
            digest.update(f"\0{word}\0{_sha256(path)}".encode())
    return digest.hexdigest()[:32]


def setup_marker(workdir: str, key: str) -> str:
    return posixpath.join(workdir, ".ups", "setup", key)


def run_setup(target: Target, conn: Connection, commands: list[tuple[str, str]]) -> None:
    """Run each (command, remote shell) the plan lists; a cached one answers at once."""
    for shown, shell in commands:
        result = run(conn, shell, target.spec)
        if result.exited != 0:
            tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-20:])
            raise DeployError(
                f"setup command `{shown}` failed on {target.spec.name!r} (exit "
                f"{result.exited}); nothing was started. Its last output:\n{tail}"
            )
        cached = rc.SETUP_CACHED in result.stdout
        target.say(f"setup `{shown}`: {'cached (same files as before)' if cached else 'done'}")


def check_data(target: Target, conn: Connection, command: str) -> None:
    """Refuse (exit 2) when a run file's ``data`` path is missing in the code dir on the host."""
    result = run(conn, command, target.spec)
    missing = [line for line in result.stdout.splitlines() if line.strip()]
    if result.exited != 0 or missing:
        raise UsageError(
            f"data missing on {target.spec.name!r}: {', '.join(missing) or result.stderr.strip()} "
            "(relative to the synced workdir). Add it to the workdir (`include:` if .gitignore "
            "leaves it out), fetch it in a `setup:` command, or fix the run file's `data:`; "
            "nothing was started."
        )
