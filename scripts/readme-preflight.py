#!/usr/bin/env python3
"""Regenerate the README's preflight capture from a real run, as a person sees it: the
README's own command in tmux, 100 columns wide (statuses uncoloured, long messages wrapped).

    .venv/bin/python scripts/readme-preflight.py            # run it, rewrite README.md
    .venv/bin/python scripts/readme-preflight.py --check    # run it, exit 1 if README differs

Rewrites what lies between the ``readme-preflight:capture`` markers, and the sentence
between the ``readme-preflight:prose`` markers (how many rows, how long it took), from the
capture. Needs the demo data (``ups data synth``). tests/test_newcomer_readme.py compares
the README's capture with the output of the same command run there (:func:`differences`):
every row's check, status and message, and the last line, with the numbers that vary by
machine and run (free space, ports, seconds) left out of the comparison.
"""

from __future__ import annotations

import argparse
import re
import socket
import sys
from pathlib import Path

# scripts/ for the tmux helper, the checkout for its own ups (not the venv's install).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from tmux_pane import REPO, Pane

from ups.preflight.checks import CHECKS

README = REPO / "README.md"
WIDTH = 100
COMMAND = "ups preflight --config configs/demo.yaml --skip allreduce"
"""The README's command (the block after `make demo`); tests/test_newcomer_readme.py runs it."""
CAPTURE = re.compile(r"(<!-- readme-preflight:capture -->\n```\n)(.*?)(\n```\n)", re.S)
PROSE = re.compile(
    r"(<!-- readme-preflight:prose -->\n)(.*?)(\n<!-- /readme-preflight:prose -->)", re.S
)
FOOTER = re.compile(r"^preflight (?:NOT )?OK: .* in ([\d.]+) s$", re.M)
NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def capture(port: int) -> str:
    """``$ COMMAND --master-port PORT`` and the table it drew, as the terminal shows them."""
    command = f"{COMMAND} --master-port {port}"
    with Pane(WIDTH) as pane:
        pane.run(f".venv/bin/{command}")
        code, body = pane.finish(timeout_s=300)
    if code != 0:
        raise SystemExit(f"readme-preflight: `{command}` exited {code}:\n{body}")
    return f"$ {command}\n{body}"


def rows(text: str) -> list[tuple[str, ...]]:
    """The table in ``text`` (wrapped or not) as (check, status, value, message) rows, each
    cell's wrapped lines joined, and its last line, the summary, as a row of its own."""
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if re.match(r"CHECK +STATUS +VALUE", line))
    starts = [lines[head].index(name) for name in ("STATUS", "VALUE", "MESSAGE")]
    table: list[list[str]] = []
    for line in lines[head + 1 :]:
        if not line.strip():
            break
        cells = [line[a:b].strip() for a, b in zip([0, *starts], [*starts, None], strict=True)]
        if line[0] != " ":
            table.append(cells)
        else:  # a wrapped cell goes on under its column
            table[-1] = [f"{old} {new}".strip() for old, new in zip(table[-1], cells, strict=True)]
    footer = FOOTER.search(text)
    return [tuple(row) for row in table] + [(footer.group(0) if footer else "no summary line",)]


def _loose(row: tuple[str, ...]) -> tuple[str, ...]:
    """What must not differ: the words. Numbers vary by machine and run, and where a long
    message wraps depends on the terminal."""
    return tuple(re.sub(r"\s+", "", NUMBER.sub("N", cell)) for cell in row)


def differences(readme: str, output: str) -> list[str]:
    """Where the README's capture and ``output`` (the same command, any width) differ, as
    "README: ... / ups: ..." pairs; empty when they agree."""
    found = CAPTURE.search(readme)
    if not found:
        return ["README.md has no readme-preflight:capture block"]
    quoted, printed = rows(found.group(2)), rows(output)
    names = [row[0] for row in quoted[:-1]], [row[0] for row in printed[:-1]]
    if names[0] != names[1]:
        return [f"README rows: {names[0]} / ups rows: {names[1]}"]
    return [
        f"README: {' | '.join(a)} / ups: {' | '.join(b)}"
        for a, b in zip(quoted, printed, strict=True)
        if _loose(a) != _loose(b)
    ]


def prose(screen: str) -> str:
    table = rows(screen)
    seconds = FOOTER.search(screen).group(1)  # type: ignore[union-attr]
    return (
        f"Here the command took {seconds} s on 2 shared cores; the table has {len(table) - 1} "
        f"rows: `config` (the file itself) and {len(table) - 2} of the {len(CHECKS)} checks "
        "below (`allreduce` skipped)."
    )


def rewrite(text: str, screen: str) -> str:
    text = CAPTURE.sub(lambda m: m.group(1) + screen + m.group(3), text, count=1)
    return PROSE.sub(lambda m: m.group(1) + prose(screen) + m.group(3), text, count=1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 if README.md differs")
    args = p.parse_args()
    screen = capture(_free_port())
    old = README.read_text()
    if args.check:
        diff = differences(old, screen)
        print("\n".join(diff) or "README preflight capture matches the run")
        return 1 if diff else 0
    README.write_text(rewrite(old, screen))
    print(f"README.md rewritten:\n{screen}\n{prose(screen)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
