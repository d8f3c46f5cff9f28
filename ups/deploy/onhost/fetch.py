"""``fab fetch``: copy everything a run wrote (checkpoints, outcome, logs, config, W&B files).

One tar stream of the remote run directory, extracted with tarfile's ``data`` filter; for
a script, a second one of what it wrote outside the run directory (its ``checkpoint_dir``,
its ``outputs`` globs: the paths its ``script-outputs.json`` lists), into
``DEST/<run id>/outputs/`` with the paths they have relative to the script's workdir.
Links are not extracted as links: W&B offline writes ``logs/debug-core.log`` as a link
to an absolute path under ``~/.cache/wandb``, which the data filter refuses (and a link
leaving the directory is unsafe to recreate). For each link the target's content is
copied over SFTP when it is a regular file on the host; otherwise the link is skipped
with a one-line note. Nothing in the archive can write outside ``DEST/<run id>``.
"""

from __future__ import annotations

import io
import json
import posixpath
import stat
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fabric import Connection

from ups.bucket.uploader import OUTPUTS_FILE
from ups.deploy.errors import DeployError
from ups.deploy.onhost.runs import resolve_run
from ups.deploy.transport import remote as rc
from ups.deploy.transport.progress import Progress, human_bytes
from ups.deploy.transport.session import Target, run


@dataclass
class Fetched:
    files: int = 0
    bytes: int = 0
    links: list[tuple[str, str]] = field(default_factory=list)
    """(member name, link target) of every link in the archive."""
    notes: list[str] = field(default_factory=list)


def fetch(target: Target, run_id: str | None, dest: Path, exclude: Sequence[str] = ()) -> int:
    """Copy the run directory into ``dest/<run_id>``; print a "fetched" summary.

    ``exclude``: files (relative to the run directory) already here, such as checkpoints
    synced while the run was followed: the fetch then only tops up."""
    conn = target.connect()
    try:
        found = resolve_run(target, conn, run_id)
        dest.mkdir(parents=True, exist_ok=True)
        # du's apparent size (close to the tar's) gives the transfer an ETA.
        size = run(conn, rc.run_size_command(found), target.spec).stdout.strip()
        total = int(size) if size.isdigit() else None
        command = rc.tar_run_command(found, exclude)
        got = _untar(target, conn, command, dest, found.run_id, total)
        parent = posixpath.dirname(found.run_dir)
        for name, link in got.links:
            got.notes.append(_copy_link_target(conn, parent, name, link, dest, got))
        _fetch_outputs(target, conn, dest / found.run_id, got)
        run(conn, rc.write_word_command(found.fetched_mark, found.run_id), target.spec)
    finally:
        conn.close()
    for note in got.notes:
        target.say(f"  note: {note}")
    target.say(
        f"fetched {found.run_id} from {target.spec.name}: {got.files} files, "
        f"{human_bytes(got.bytes)} -> {dest / found.run_id}"
    )
    return 0


def _fetch_outputs(target: Target, conn: Connection, home: Path, got: Fetched) -> None:
    """A script's files outside its run directory, as its ``script-outputs.json`` (fetched
    with the run directory) lists them, into ``home/outputs``."""
    try:
        record = json.loads((home / OUTPUTS_FILE).read_text())
    except (OSError, ValueError):
        return  # the trainer's run, or a script run from before outputs were recorded
    for pattern in record.get("missing", []):
        got.notes.append(f"outputs: {pattern!r} matched nothing on the host")
    paths = [p for p in record.get("paths", []) if p]
    relative = [p for p in paths if not p.startswith("/")]
    elsewhere = [p.lstrip("/") for p in paths if p.startswith("/")]
    for base, names in ((record["workdir"], relative), ("/", elsewhere)):
        if names:
            command = rc.tar_paths_command(base, names)
            outputs = _untar(target, conn, command, home / "outputs", None, None)
            got.files += outputs.files
            got.bytes += outputs.bytes
            got.notes += outputs.notes
            got.notes += [f"skipped link outputs/{n} -> {link}" for n, link in outputs.links]


def _untar(
    target: Target,
    conn: Connection,
    command: str,
    dest: Path,
    run_id: str | None,
    total: int | None,
) -> Fetched:
    """Extract the tar ``command`` streams into ``dest``: every member under ``run_id``
    when given (a run directory), else anything the data filter lets in."""
    got = Fetched()
    what = run_id or dest.name

    def keep(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
        parts = member.name.split("/")
        if (run_id is not None and parts[0] != run_id) or ".." in parts:
            got.notes.append(f"skipped {member.name!r}: outside the run directory")
            return None
        if member.issym():
            got.links.append((member.name, member.linkname))
            return None
        if member.islnk():  # a hard link names another archive member, from the top
            got.links.append((member.name, "/".join([".."] * (len(parts) - 1) + [member.linkname])))
            return None
        if member.isfile():
            got.files += 1
            got.bytes += member.size
        return tarfile.data_filter(member, path)

    assert conn.transport is not None
    chan = conn.transport.open_session()
    chan.exec_command(command)
    progress = Progress(f"fetch {what}", total, target.out)
    with tarfile.open(fileobj=_CountingReader(chan.makefile("rb"), progress), mode="r|") as tar:
        tar.extractall(dest, filter=keep)
    progress.close()
    if chan.recv_exit_status() != 0:
        err = chan.makefile_stderr("rb").read().decode(errors="replace").strip()
        raise DeployError(f"fetching {what} from {target.spec.name!r} failed: {err}")
    return got


def _copy_link_target(
    conn: Connection, parent: str, name: str, link: str, dest: Path, got: Fetched
) -> str:
    """Copy a link's target file into the link's place; return the one-line note."""
    remote_target = posixpath.normpath(posixpath.join(parent, posixpath.dirname(name), link))
    local = dest / name
    name = name.split("/", 1)[-1]  # as seen from the run directory, in the notes
    sftp = conn.sftp()
    try:
        info = sftp.stat(remote_target)
    except OSError:
        return f"skipped link {name} -> {link}: its target is not on the host"
    if info.st_mode is not None and stat.S_ISDIR(info.st_mode):
        return f"skipped link {name} -> {link}: links to a directory"
    if info.st_mode is None or not stat.S_ISREG(info.st_mode):
        return f"skipped link {name} -> {link}: not a regular file"
    local.parent.mkdir(parents=True, exist_ok=True)
    sftp.get(remote_target, str(local))
    got.files += 1
    got.bytes += info.st_size or 0
    return f"copied the file behind link {name} -> {link}"


class _CountingReader(io.RawIOBase):
    def __init__(self, inner: Any, progress: Progress) -> None:
        self.inner = inner
        self.progress = progress

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        data: bytes = self.inner.read(n)
        self.progress.update(len(data))
        return data
