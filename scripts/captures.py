#!/usr/bin/env python3
"""Outputs shown in the docs that came from a real run: where each is, how it is made
again, and the test that holds it to what ups prints now.

    .venv/bin/python scripts/captures.py --list           # every capture, where, checked by
    .venv/bin/python scripts/captures.py demo             # run it again, rewrite the docs
    .venv/bin/python scripts/captures.py demo --check     # run it again, exit 1 if it differs
    UPS_CAPTURES=rewrite .venv/bin/pytest tests/test_deploy_ssh.py -k changed_host_key

A capture is a fenced block right after ``<!-- capture:NAME -->`` (or text between
``<!-- capture:NAME -->`` and ``<!-- /capture:NAME -->`` on one line), in README.md or any
page under docs/: wherever it moves, it is found by its name. A sentence computed from it
sits between ``<!-- capture:NAME:prose -->`` and ``<!-- /capture:NAME:prose -->``.

Each capture is made one of two ways. Those a person sees in a terminal (the demo, a
Ctrl-C stop, the preflight table) are run here in tmux at a fixed width (``make``
function of :data:`CAPTURES`); the test named in ``checked_by`` compares the docs with
what its own run of the same path prints (:func:`check`), leaving out what varies by
machine and run. The others are rewritten by that test itself: with ``UPS_CAPTURES=rewrite``
:func:`check` writes what the test's real run printed into the docs instead of comparing.
tests/test_docs_captures.py fails when a marker has no entry here or an entry no marker,
and when a capture's test does not check it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tmux helper
from tmux_pane import REPO, Pane

ENV = "UPS_CAPTURES"
"""``rewrite``: :func:`check` writes the printed output into the docs instead of comparing."""


# -- where captures live ------------------------------------------------------------------


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def _block(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- capture:{re.escape(name)} -->\n```[a-z]*\n)(.*?)(\n```\n)", re.S)


def _inline(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- capture:{re.escape(name)} -->)(.*?)(<!-- /capture:{name} -->)")


def _prose(name: str) -> re.Pattern[str]:
    return re.compile(
        rf"(<!-- capture:{re.escape(name)}:prose -->\n)(.*?)(\n<!-- /capture:{name}:prose -->)",
        re.S,
    )


MARKER = re.compile(r"<!-- capture:([a-z0-9-]+) -->")


def markers() -> dict[str, list[str]]:
    """Every capture name in the docs, with the files it appears in."""
    found: dict[str, list[str]] = {}
    for path in doc_files():
        for name in MARKER.findall(path.read_text()):
            found.setdefault(name, []).append(str(path.relative_to(REPO)))
    return found


def _find(pattern: re.Pattern[str]) -> tuple[Path, re.Match[str]]:
    hits = [(p, m) for p in doc_files() if (m := pattern.search(p.read_text()))]
    if len(hits) != 1:
        where = [str(p.relative_to(REPO)) for p, _ in hits] or "no page"
        raise SystemExit(f"capture marker {pattern.pattern[:40]!r}: found in {where}, not once")
    return hits[0]


def quoted(name: str) -> str:
    """The capture's text as the docs show it."""
    try:
        return _find(_block(name))[1].group(2)
    except SystemExit:
        return _find(_inline(name))[1].group(2)


def rewrite(name: str, text: str, pattern: re.Pattern[str] | None = None) -> Path:
    """Put ``text`` in place of the capture (or the pattern's middle group); the file."""
    try:
        path, found = _find(pattern or _block(name))
    except SystemExit:
        path, found = _find(_inline(name))
    old = path.read_text()
    path.write_text(old[: found.start(2)] + text + old[found.end(2) :])
    return path


# -- comparing with what ups prints --------------------------------------------------------

ELISION = re.compile(r"^\s*(\.\.\.|…)\s*$|\s(\.\.\.|…)\s", re.M)


def loose(text: str) -> str:
    """What must not differ: the words. Times, numbers, hex digests, paths and host:port
    vary by machine and run; where a line wraps depends on the terminal."""
    text = re.sub(r"SHA256:[A-Za-z0-9+/=]+", "SHA256:F", text)  # key fingerprints
    text = re.sub(r"\S*/\S*", "P", text)  # paths, URLs
    text = re.sub(r"\b[0-9a-f]{7,}\b", "H", text)
    text = re.sub(r"\d+(\.\d+)?", "N", text)
    return re.sub(r"\s+", "", text)


def in_order(quoted_text: str, printed: str) -> list[str]:
    """The generic comparison: each piece of the capture between elisions (``...`` alone
    on a line, or between spaces) appears in the printed output, in order, loosely."""
    pieces = [p for p in ELISION.split(quoted_text) if p and p.strip() not in ("...", "…")]
    haystack, at, out = loose(printed), 0, []
    for piece in pieces:
        needle = loose(piece)
        found = haystack.find(needle, at)
        if found < 0:
            out.append(f"docs: {piece.strip()[:200]!r} is not in what ups printed")
        else:
            at = found + len(needle)
    return out


def wrapped(printed: str, width: int) -> str:
    """One message as a terminal ``width`` columns wide would show it (words whole)."""
    return "\n".join(
        textwrap.fill(line, width, break_long_words=False, break_on_hyphens=False)
        for line in printed.strip().splitlines()
    )


def exact(quoted_text: str, printed: str) -> list[str]:
    return (
        [] if quoted_text == printed.rstrip("\n") else [f"docs: {quoted_text!r} / ups: {printed!r}"]
    )


# -- the demo --------------------------------------------------------------------------------

DEMO_WIDTH = 118


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Made:
    text: str
    """The block's new text."""
    printed: str
    """What the capture's comparison takes as ups's output (``--check``)."""
    prose: str | None = None
    """The sentence computed from it, when the capture has one."""


def make_demo() -> Made:
    """``ups demo`` in tmux, 118 columns: the screen from the launch plan to the end, and
    the held-out numbers' sentence from the run's outcome."""
    command = f".venv/bin/ups demo --set distributed.master_port={_free_port()}"
    with Pane(DEMO_WIDTH) as pane:
        pane.run(command)
        code, body = pane.finish(timeout_s=1200)
    if code != 0:
        raise SystemExit(f"captures: `{command}` exited {code}:\n{body}")
    lines = body.splitlines()
    start = next(i for i, line in enumerate(lines) if "launch plan" in line)
    screen = "\n".join(line.rstrip() for line in lines[start:]).rstrip()
    run_dir = re.search(r"run_dir=(\S+)", screen).group(1)  # type: ignore[union-attr]
    metrics = json.loads((REPO / run_dir / "outcome.json").read_text())["metrics"]
    return Made(screen, json.dumps(metrics), demo_prose(metrics))


def demo_prose(metrics: dict[str, float]) -> str:
    """The sentence quoting the held-out numbers of a demo run."""
    adv, darcy = metrics["eval/advection/rel_l2"], metrics["eval/darcy/rel_l2"]
    adv_base = metrics["eval/advection/baseline_rel_l2"]
    darcy_base = metrics["eval/darcy/baseline_rel_l2"]
    return (
        f"The model's held-out error is {adv_base / adv:.1f}x lower than persistence on "
        f"advection ({adv:.4f} vs {adv_base:.4f}) and {darcy_base / darcy:.1f}x lower "
        f"({darcy:.4f} vs {darcy_base:.4f}) than the mean field on Darcy."
    )


DEMO_TASKS = ("advection", "darcy")
DEMO_SPREAD = 0.02
"""How far (relative) one x86-64 CPU's held-out numbers may lie from another's: torch's
and MKL's kernels for AVX2, AVX-512 and AMX sum in different orders. Measured spread of
the Darcy error 1.1 %, advection 0.1 % (docs/get-started.md); the baselines depend on the
data only."""


def demo_numbers(quoted_text: str, metrics_json: str) -> list[str]:
    """The capture's evaluation rows quote what a run of the demo config gave (``printed``
    is its outcome's metrics as JSON) within :data:`DEMO_SPREAD`, the baselines exactly, and
    the prose quotes the capture's rows."""
    metrics = json.loads(metrics_json)
    out, shown = [], {}
    for task in DEMO_TASKS:
        row = re.search(rf"│ {task}\s*│\s*([0-9.]+) │\s*([0-9.]+) │", quoted_text)
        if row is None:
            out.append(f"docs capture has no {task} row")
            continue
        shown[task] = row.groups()
        for key, printed in zip(("rel_l2", "baseline_rel_l2"), row.groups(), strict=True):
            got = metrics[f"eval/{task}/{key}"]
            allowed = 0.00005 + (0.0 if key.startswith("baseline") else DEMO_SPREAD * got)
            if abs(float(printed) - got) > allowed:
                out.append(f"docs eval/{task}/{key}: {printed}, the demo gives {got:.4f}")
    prose = _find(_prose("demo"))[1].group(2)
    quotes = re.findall(r"\(([0-9.]+) vs ([0-9.]+)\)", prose)
    expected = [shown[task] for task in DEMO_TASKS if task in shown]
    if quotes[: len(DEMO_TASKS)] != expected:
        out.append(f"docs prose quotes {quotes[:2]}, its capture shows {expected}")
    return out


# -- a Ctrl-C stop ---------------------------------------------------------------------------

STOP_AT_STEP = 20
TIME = re.compile(r"^\d\d:\d\d:\d\d ")
STORY = ("received", "stop requested")
"""The stop's own lines: launch's, then rank 0's."""
TABLE_ROWS = ("outcome", "reason", "steps")


def make_stop() -> Made:
    """``ups launch configs/demo.yaml --fresh`` in tmux, Ctrl-C past step 20; the command
    and the screen from the training phase to the end. The stopped run is removed and
    ``runs/latest`` put back, so the next launch here does not resume it."""
    command = f"ups launch configs/demo.yaml --fresh --set distributed.master_port={_free_port()}"
    latest = REPO / "runs" / "latest"
    before = os.readlink(latest) if latest.is_symlink() else None
    with Pane(DEMO_WIDTH) as pane:
        pane.run(f".venv/bin/{command}")

        def past_step(screen: str) -> bool:
            steps = re.findall(r"^train .* (\d+)/\d+ ", screen, re.M)
            return bool(steps) and int(steps[-1]) >= STOP_AT_STEP

        pane.wait(past_step, f"the live line at step {STOP_AT_STEP}", timeout_s=600)
        pane.keys("C-c")
        code, body = pane.finish(timeout_s=300)
    run_dir = outcome_table(body).get("run dir")
    if run_dir and (REPO / run_dir).is_dir():
        shutil.rmtree(REPO / run_dir)
    latest.unlink(missing_ok=True)
    if before is not None:
        latest.symlink_to(before)
    if code != 75:
        raise SystemExit(f"captures: `{command}` exited {code}, not 75:\n{body}")
    lines = body.splitlines()
    start = max(i for i, line in enumerate(lines) if "phase=training" in line)
    return Made("\n".join([f"$ {command}", "...", *lines[start:]]), body)


def stop_story(text: str) -> list[str]:
    """The stop's lines outside the table, without their time, in order."""
    return [
        TIME.sub("", line).strip()
        for line in text.splitlines()
        if TIME.match(line) and any(word in line for word in STORY)
    ]


def outcome_table(text: str) -> dict[str, str]:
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


def stop_differences(quoted_text: str, console: str) -> list[str]:
    """The stop's lines and the table's outcome, reason and steps, run ids and numbers aside."""
    out = []
    said = [loose(line) for line in stop_story(console)]
    for line in stop_story(quoted_text):
        if loose(line) not in said:
            out.append(f"docs: {line!r} / ups: {stop_story(console)}")
    if len(stop_story(quoted_text)) != len(STORY):
        out.append(f"docs capture: {stop_story(quoted_text)} is not one line each for {STORY}")
    rows_quoted, rows_printed = outcome_table(quoted_text), outcome_table(console)
    for key in TABLE_ROWS:
        a, b = rows_quoted.get(key, "(none)"), rows_printed.get(key, "(none)")
        if loose(a) != loose(b):
            out.append(f"docs {key}: {a!r} / ups: {b!r}")
    return out


# -- the preflight table ----------------------------------------------------------------------

PREFLIGHT_WIDTH = 100
PREFLIGHT_COMMAND = "ups preflight --config configs/demo.yaml --skip allreduce"
"""The command of docs/get-started.md's block after `make demo`; tests/test_newcomer_readme.py
runs it."""
FOOTER = re.compile(r"^preflight (?:NOT )?OK: .* in ([\d.]+) s$", re.M)


def make_preflight() -> Made:
    """That preflight command in tmux, 100 columns, and the sentence that counts
    its rows."""
    command = f"{PREFLIGHT_COMMAND} --master-port {_free_port()}"
    with Pane(PREFLIGHT_WIDTH) as pane:
        pane.run(f".venv/bin/{command}")
        code, body = pane.finish(timeout_s=300)
    if code != 0:
        raise SystemExit(f"captures: `{command}` exited {code}:\n{body}")
    screen = f"$ {command}\n{body}"
    return Made(screen, screen, preflight_prose(screen))


def preflight_rows(text: str) -> list[tuple[str, ...]]:
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


def preflight_differences(quoted_text: str, output: str) -> list[str]:
    """Every row's check, status and message, and the summary line, numbers aside."""
    quoted_rows, printed = preflight_rows(quoted_text), preflight_rows(output)
    names = [row[0] for row in quoted_rows[:-1]], [row[0] for row in printed[:-1]]
    if names[0] != names[1]:
        return [f"docs rows: {names[0]} / ups rows: {names[1]}"]
    return [
        f"docs: {' | '.join(a)} / ups: {' | '.join(b)}"
        for a, b in zip(quoted_rows, printed, strict=True)
        if tuple(map(loose, a)) != tuple(map(loose, b))
    ]


def preflight_prose(screen: str) -> str:
    from ups.preflight.checks import CHECKS

    table = preflight_rows(screen)
    seconds = FOOTER.search(screen).group(1)  # type: ignore[union-attr]
    return (
        f"Here the command took {seconds} s on 2 shared cores; the table has {len(table) - 1} "
        f"rows: `config` (the file itself) and {len(table) - 2} of the {len(CHECKS)} checks "
        "below (`allreduce` skipped)."
    )


# -- the image's size --------------------------------------------------------------------------

DEPS_STEP = "pip install --require-hashes -r requirements.lock"
MB = 1e6
TOLERANCE_MB = 1.0


def _docker(*args: str) -> str:
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, check=True, timeout=120
    ).stdout


def make_image() -> Made:
    size = image_size(os.environ.get("UPS_IMAGE_CPU", "ups:cpu"))
    return Made(size, size)


def image_size(image: str) -> str:
    """The CPU image's size from ``docker image inspect`` and ``docker history``: the whole,
    its base (the FROM image), the dependency layer (the lock's pip install), the rest."""
    total = int(_docker("image", "inspect", "-f", "{{.Size}}", image))
    label = '{{index .Config.Labels "org.opencontainers.image.base.name"}}'
    base_name = _docker("image", "inspect", "-f", label, image).strip()
    base = int(_docker("image", "inspect", "-f", "{{.Size}}", base_name))
    history = _docker(
        "history", "--no-trunc", "--human=false", "--format", "{{.Size}}\t{{.CreatedBy}}", image
    ).splitlines()
    deps = [int(line.split("\t")[0]) for line in history if DEPS_STEP in line]
    if len(deps) != 1:
        raise SystemExit(f"{image}: no single layer made by `{DEPS_STEP}` in its history")
    return (
        f"{total / MB:.0f} MB: base {base / MB:.0f} MB, dependencies {deps[0] / MB:.0f} MB, "
        f"source and install {(total - base - deps[0]) / MB:.1f} MB"
    )


def image_differences(quoted_text: str, measured: str) -> list[str]:
    """The four sizes, 1 MB either way each: a small change in ups/ needs no new capture;
    a new base or lock does."""
    have = [float(n) for n in re.findall(r"([\d.]+) MB", quoted_text)]
    now = [float(n) for n in re.findall(r"([\d.]+) MB", measured)]
    off = len(have) != 4 or len(now) != 4
    if off or any(abs(a - b) > TOLERANCE_MB for a, b in zip(have, now, strict=True)):
        return [f"docs quote {quoted_text!r} for the CPU image; it measures {measured!r}"]
    return []


# -- the registry ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Capture:
    checked_by: str
    """The test (``file::function``) that compares it with its own run's output."""
    compare: Callable[[str, str], list[str]]
    """(the docs' text, what ups printed) -> differences; empty when they agree."""
    make: Callable[[], Made] | None = None
    """Runs the command here and returns the block's new text; None: the test rewrites it
    with ``UPS_CAPTURES=rewrite``."""
    shown: Callable[[str], str] = str.rstrip
    """From what the test's run printed to the block's text (for a rewrite)."""


CAPTURES: dict[str, Capture] = {
    "demo": Capture(
        "tests/test_devhost.py::test_dev_host_deploy_round_trip_then_down_leaves_nothing",
        demo_numbers,
        make_demo,
    ),
    "stop": Capture(
        "tests/test_launch_script.py::test_ctrl_c_is_named_sigint_with_one_step_number",
        stop_differences,
        make_stop,
    ),
    "preflight": Capture(
        "tests/test_newcomer_readme.py::test_readme_first_three_commands_work_in_a_new_shell",
        preflight_differences,
        make_preflight,
    ),
    "image": Capture(
        "tests/test_docker_e2e.py::test_image_runs_torch_and_a_two_process_gloo_torchrun",
        image_differences,
        make_image,
    ),
    "config-error": Capture(
        "tests/test_config_errors.py::test_the_readme_config_error_is_what_ups_launch_prints",
        exact,
    ),
    "host-key-changed": Capture(
        "tests/test_deploy_ssh.py::test_changed_host_key_is_refused",
        in_order,
        shown=lambda printed: wrapped(printed, 92),
    ),
}


def check(name: str, printed: str) -> list[str]:
    """How capture ``name`` differs from ``printed`` (what the checking test's run
    printed); with ``UPS_CAPTURES=rewrite``, writes ``printed`` into the docs instead."""
    capture = CAPTURES[name]
    if os.environ.get(ENV) == "rewrite" and capture.make is None:
        rewrite(name, capture.shown(printed))
        return []
    return capture.compare(quoted(name), printed)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("name", nargs="?", choices=sorted(CAPTURES), help="the capture to make again")
    p.add_argument("--check", action="store_true", help="exit 1 if the docs differ from the run")
    p.add_argument("--list", action="store_true", help="list the captures")
    args = p.parse_args(argv)
    if args.list or args.name is None:
        for name, capture in CAPTURES.items():
            how = "scripts/captures.py " + name if capture.make else f"{ENV}=rewrite pytest"
            print(f"{name:18} {', '.join(markers().get(name, ['(no marker)']))}: made by {how}; "
                  f"checked by {capture.checked_by}")  # fmt: skip
        return 0
    capture = CAPTURES[args.name]
    if capture.make is None:
        test = capture.checked_by
        print(f"`{args.name}` is rewritten by its test: {ENV}=rewrite .venv/bin/pytest {test}")
        return 2
    made = capture.make()
    if args.check:
        diff = capture.compare(quoted(args.name), made.printed)
        print("\n".join(diff) or f"{args.name}: the docs match the run")
        return 1 if diff else 0
    path = rewrite(args.name, made.text)
    if made.prose is not None:
        rewrite(args.name, made.prose, _prose(args.name))
    print(f"{path.relative_to(REPO)}: {args.name} rewritten:\n{made.text}\n{made.prose or ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
