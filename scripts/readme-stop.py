#!/usr/bin/env python3
"""Regenerate the README's capture of a Ctrl-C stop from a real run, as a person sees it:
``ups launch configs/demo.yaml --fresh`` (never a resumed run) in tmux, 118 columns wide,
Ctrl-C once the live line has passed step 20, then the end of what the terminal shows
(no colours; the live line as its last frame left it).

    .venv/bin/python scripts/readme-stop.py            # run it, rewrite README.md
    .venv/bin/python scripts/readme-stop.py --check    # run it, exit 1 if README differs

Rewrites what lies between the ``readme-stop:capture`` markers. Needs the demo data
(``ups data synth``); removes the run it stopped. tests/test_launch_script.py compares
the README's capture with the console of its own Ctrl-C run (:func:`differences`): the
stop's lines and the outcome table's rows, with what varies by run (times, steps, run
ids, paths) left out.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tmux_pane import REPO, Pane

README = REPO / "README.md"
WIDTH = 118
STOP_AT_STEP = 20
CAPTURE = re.compile(r"(<!-- readme-stop:capture -->\n```\n)(.*?)(\n```\n)", re.S)
TIME = re.compile(r"^\d\d:\d\d:\d\d ")
STORY = ("received", "stop requested")
"""The stop's own lines: launch's, then rank 0's."""
TABLE_ROWS = ("outcome", "reason", "steps")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def capture(port: int) -> str:
    """The command, then what the terminal shows from the training phase to the end."""
    command = f"ups launch configs/demo.yaml --fresh --set distributed.master_port={port}"
    latest = REPO / "runs" / "latest"
    before = os.readlink(latest) if latest.is_symlink() else None
    with Pane(WIDTH) as pane:
        pane.run(f".venv/bin/{command}")

        def past_step(screen: str) -> bool:
            steps = re.findall(r"^train .* (\d+)/\d+ ", screen, re.M)
            return bool(steps) and int(steps[-1]) >= STOP_AT_STEP

        pane.wait(past_step, f"the live line at step {STOP_AT_STEP}", timeout_s=600)
        pane.keys("C-c")
        code, body = pane.finish(timeout_s=300)
    _forget(table(body).get("run dir"), latest, before)
    if code != 75:
        raise SystemExit(f"readme-stop: `{command}` exited {code}, not 75:\n{body}")
    lines = body.splitlines()
    start = max(i for i, line in enumerate(lines) if "phase=training" in line)
    return "\n".join([f"$ {command}", "...", *lines[start:]])


def _forget(run_dir: str | None, latest: Path, before: str | None) -> None:
    """Remove the captured run and put ``runs/latest`` back: the next ``ups launch`` or
    ``ups demo`` here must not resume a run stopped for the README."""
    if run_dir and (REPO / run_dir).is_dir():
        shutil.rmtree(REPO / run_dir)
    latest.unlink(missing_ok=True)
    if before is not None:
        latest.symlink_to(before)


def _loose(text: str) -> str:
    """Words only: digits, run ids and paths vary by run, wrapping by terminal."""
    text = re.sub(r"\S*/\S*", "PATH", text)
    return re.sub(r"\s+", "", re.sub(r"\d+", "N", text))


def story(text: str) -> list[str]:
    """The stop's lines outside the table, without their time, in order."""
    return [
        TIME.sub("", line).strip()
        for line in text.splitlines()
        if TIME.match(line) and any(word in line for word in STORY)
    ]


def table(text: str) -> dict[str, str]:
    """The last outcome table's rows (a wrapped cell joined)."""
    rows: dict[str, str] = {}
    key = ""
    for line in text.splitlines():
        if line.startswith("┌"):
            rows, key = {}, ""
        cells = line.split("│")
        if len(cells) == 4:
            key = cells[1].strip() or key
            rows[key] = f"{rows.get(key, '')} {cells[2].strip()}".strip()
    return rows


def differences(readme: str, console: str) -> list[str]:
    """Where the README's capture and ``console`` (a Ctrl-C stop's console, any width)
    differ in the stop's lines and the table's outcome, reason and steps; empty when they
    agree."""
    found = CAPTURE.search(readme)
    if not found:
        return ["README.md has no readme-stop:capture block"]
    quoted, printed = found.group(2), console
    out = []
    said = [_loose(line) for line in story(printed)]
    for line in story(quoted):
        if _loose(line) not in said:
            out.append(f"README: {line!r} / ups: {story(printed)}")
    if len(story(quoted)) != len(STORY):
        out.append(f"README capture: {story(quoted)} is not one line each for {STORY}")
    rows_quoted, rows_printed = table(quoted), table(printed)
    for key in TABLE_ROWS:
        a, b = rows_quoted.get(key, "(none)"), rows_printed.get(key, "(none)")
        if _loose(a) != _loose(b):
            out.append(f"README {key}: {a!r} / ups: {b!r}")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 if README.md differs")
    args = p.parse_args()
    screen = capture(_free_port())
    old = README.read_text()
    if args.check:
        diff = differences(old, screen)
        print("\n".join(diff) or "README stop capture matches the run")
        return 1 if diff else 0
    README.write_text(CAPTURE.sub(lambda m: m.group(1) + screen + m.group(3), old, count=1))
    print(f"README.md rewritten:\n{screen}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
