#!/usr/bin/env python3
"""Regenerate the README's demo capture and the held-out numbers quoted in its prose from
a real `ups demo` run, as a person sees it: in tmux, 118 columns wide, captured with
`tmux capture-pane` once the run has ended.

    .venv/bin/python scripts/readme-demo.py            # run the demo, rewrite README.md
    .venv/bin/python scripts/readme-demo.py --check    # run it, exit 1 if README differs

Rewrites what lies between the `readme-demo:capture` and `readme-demo:prose` markers.
tests/test_devhost.py checks the README's numbers against a run of the demo config.
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
WIDTH = 118


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def capture_demo(port: int, timeout_s: float = 1200) -> tuple[str, str]:
    """Run `ups demo` in a private tmux server; return (the screen, the run directory)."""
    sock = f"ups-readme-demo-{uuid.uuid4().hex[:8]}"
    tmux = ["tmux", "-L", sock, "-f", "/dev/null"]
    command = f".venv/bin/ups demo --set distributed.master_port={port}; echo __exit=$?"
    subprocess.run(
        [*tmux, "new-session", "-d", "-x", str(WIDTH), "-y", "200", "-c", str(REPO)], check=True
    )
    try:
        subprocess.run([*tmux, "send-keys", command, "Enter"], check=True)
        deadline = time.monotonic() + timeout_s
        screen = ""
        while time.monotonic() < deadline:
            screen = subprocess.run(
                [*tmux, "capture-pane", "-p", "-J"], capture_output=True, text=True, check=True
            ).stdout
            if re.search(r"^__exit=\d+", screen, re.M):
                break
            time.sleep(2)  # polling the pane for the end marker, bounded by the deadline
        else:
            raise SystemExit(f"readme-demo: `ups demo` did not end within {timeout_s} s")
    finally:
        subprocess.run([*tmux, "kill-server"], check=False)
    code = int(re.search(r"^__exit=(\d+)", screen, re.M).group(1))  # type: ignore[union-attr]
    if code != 0:
        raise SystemExit(f"readme-demo: `ups demo` exited {code}:\n{screen}")
    lines = screen.splitlines()
    start = next(i for i, line in enumerate(lines) if "launch plan" in line)
    end = next(i for i, line in enumerate(lines) if line.startswith("__exit="))
    body = [line.rstrip() for line in lines[start:end]]
    # The screen's prompt echo of the marker command is not part of what ups printed.
    body = [line for line in body if "__exit" not in line]
    while body and not body[-1]:
        body.pop()
    run_dir = re.search(r"run_dir=(\S+)", screen).group(1)  # type: ignore[union-attr]
    return "\n".join(body), run_dir


def prose(metrics: dict[str, float]) -> str:
    adv, darcy = metrics["eval/advection/rel_l2"], metrics["eval/darcy/rel_l2"]
    adv_base = metrics["eval/advection/baseline_rel_l2"]
    darcy_base = metrics["eval/darcy/baseline_rel_l2"]
    return (
        f"The model's held-out error is {adv_base / adv:.1f}x lower than persistence on "
        f"advection ({adv:.4f} vs {adv_base:.4f}) and {darcy_base / darcy:.1f}x lower "
        f"({darcy:.4f} vs {darcy_base:.4f}) than the mean field on Darcy."
    )


def rewrite(text: str, capture: str, sentence: str) -> str:
    text = re.sub(
        r"(<!-- readme-demo:capture -->\n```\n).*?(\n```)",
        lambda m: m.group(1) + capture + m.group(2),
        text,
        count=1,
        flags=re.S,
    )
    return re.sub(
        r"(<!-- readme-demo:prose -->\n).*?(\n<!-- /readme-demo:prose -->)",
        lambda m: m.group(1) + sentence + m.group(2),
        text,
        count=1,
        flags=re.S,
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 if README.md would change")
    p.add_argument("--port", type=int, default=0, help="master port (default: a free one)")
    args = p.parse_args()
    capture, run_dir = capture_demo(args.port or _free_port())
    metrics = json.loads((REPO / run_dir / "outcome.json").read_text())["metrics"]
    old = README.read_text()
    new = rewrite(old, capture, prose(metrics))
    if args.check:
        same_numbers = prose(metrics) in old
        print("README numbers match the run" if same_numbers else prose(metrics))
        return 0 if same_numbers else 1
    README.write_text(new)
    print(f"README.md rewritten from {run_dir}: {prose(metrics)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
