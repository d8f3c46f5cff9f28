"""Which files of a script's workdir the sync sends, and which it would leave behind.

git's view of the workdir (tracked, plus untracked files ``.gitignore`` does not ignore;
every file when it is no git checkout, minus the root ``.gitignore``'s patterns) without
ups's own ``.ups/`` and ``runs/``, plus
the run file's ``include``, minus its ``exclude`` (gitignore patterns). No connection here:
``fab deploy`` refuses a script the sync would leave behind before anything is imported
for SSH (:mod:`ups.deploy.onhost.workdir` sends the files).
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pathspec

from ups.workload import ScriptWorkload


def _walk(root: Path) -> Iterable[str]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in filenames:
            yield (Path(dirpath) / name).relative_to(root).as_posix()


def _git_files(root: Path) -> list[str] | None:
    """git's view of ``root`` (tracked + not ignored), or None outside a git checkout."""
    try:
        listed = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "-co", "--exclude-standard", "."],
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return [p for p in listed.decode().split("\0") if p]


def _patterns(lines: Iterable[str]) -> pathspec.GitIgnoreSpec:
    return pathspec.GitIgnoreSpec.from_lines(lines)


UPS_OWN = ("/.ups/", "/runs/")
"""ups's own folders in a project, never its code: the dev host's record and deploy state
(``.ups/``), the runs ``ups launch`` wrote here (``runs/``, checkpoints included). Left out
unless the run file's ``include`` names them."""


def files_to_send(workload: ScriptWorkload) -> list[str]:
    """The workdir's files that go to the host, sorted (relative POSIX paths)."""
    root = workload.workdir
    everything = sorted(_walk(root))
    chosen = _git_files(root)
    if chosen is None:
        ignore = root / ".gitignore"
        ignored = _patterns(ignore.read_text().splitlines() if ignore.is_file() else [])
        chosen = [p for p in everything if not ignored.match_file(p)]
    own = _patterns(UPS_OWN)
    chosen = [p for p in chosen if not own.match_file(p)]
    included = _patterns(workload.include)
    excluded = _patterns(workload.exclude)
    picked = set(chosen) | {p for p in everything if included.match_file(p)}
    return sorted(p for p in picked if (root / p).is_file() and not excluded.match_file(p))


def _ignored_by(root: Path, rel: str) -> str | None:
    """The ignore rule that leaves ``rel`` out, as ``FILE:LINE: PATTERN``."""
    try:
        said = subprocess.run(
            ["git", "-C", str(root), "check-ignore", "-v", "--no-index", "--", rel],
            capture_output=True,
            timeout=60,
        ).stdout.decode()
    except (OSError, subprocess.SubprocessError):
        said = ""
    if said.strip():
        source, line, pattern = said.split("\t", 1)[0].split(":", 2)
        return f"{source}:{line}: {pattern}"
    ignore = root / ".gitignore"
    if ignore.is_file():
        for n, line in enumerate(ignore.read_text().splitlines(), 1):
            if line.strip() and not line.startswith("#") and _patterns([line]).match_file(rel):
                return f".gitignore:{n}: {line.strip()}"
    return None


def left_behind(workload: ScriptWorkload) -> list[str]:
    """The script and the workdir files its ``setup`` names that the sync would not send,
    each with the rule that leaves it out (an ``exclude`` pattern, a ``.gitignore`` line):
    refused before any host is contacted, since the run could only fail there."""
    sent = set(files_to_send(workload))
    root = workload.workdir
    named = [("script", workload.script)]
    for command in workload.setup:
        try:
            words = shlex.split(command)
        except ValueError:
            words = command.split()
        named += [("setup", w) for w in words if (root / w).is_file()]
    problems = []
    for key, rel in dict.fromkeys(named):
        rel = Path(rel).as_posix()
        if rel in sent or not (root / rel).is_file():
            continue
        excluded = [e for e in workload.exclude if _patterns([e]).match_file(rel)]
        rule = f"`exclude: {excluded[0]}`" if excluded else _ignored_by(root, rel)
        why = f"it is left out by {rule}" if rule else "the sync leaves it out"
        problems.append(
            f"{key}: {rel!r} would not reach the host: {why}. Add it to `include:` in a run "
            f"file (or remove that rule); nothing was started"
        )
    return problems
