"""A private tmux server for the docs' captures: run a command as a person would, in a
terminal of a given width, and read back what it drew (``tmux capture-pane``), without
colours or the live redraws of progress lines.

Used by scripts/captures.py.
"""

from __future__ import annotations

import re
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

REPO = Path(__file__).resolve().parents[1]
END = re.compile(r"^__exit=(\d+)", re.M)


class Pane:
    """One tmux session ``width`` columns wide, started in the repository root."""

    def __init__(self, width: int) -> None:
        self.tmux = ["tmux", "-L", f"ups-readme-{uuid.uuid4().hex[:8]}", "-f", "/dev/null"]
        self.width = width

    def __enter__(self) -> Pane:
        subprocess.run(
            [*self.tmux, "new-session", "-d", "-x", str(self.width), "-y", "200", "-c", str(REPO)],
            check=True,
        )
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        subprocess.run([*self.tmux, "kill-server"], check=False)

    def run(self, command: str) -> None:
        """Type ``command`` and Enter; the shell prints ``__exit=<code>`` when it ends."""
        subprocess.run([*self.tmux, "send-keys", f"{command}; echo __exit=$?", "Enter"], check=True)

    def keys(self, *keys: str) -> None:
        subprocess.run([*self.tmux, "send-keys", *keys], check=True)

    def screen(self) -> str:
        return subprocess.run(
            [*self.tmux, "capture-pane", "-p", "-J", "-S", "-", "-E", "-"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip

    def wait(self, done: Callable[[str], bool], what: str, timeout_s: float) -> str:
        """The screen once ``done(screen)``; SystemExit naming ``what`` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            screen = self.screen()
            if done(screen):
                return screen
            time.sleep(1)  # polling the pane, bounded by the deadline
        raise SystemExit(f"{what} not seen within {timeout_s:.0f} s:\n{self.screen()[-3000:]}")

    def finish(self, timeout_s: float) -> tuple[int, str]:
        """Wait for the command to end; (its exit code, what it printed after its prompt
        line, trailing blank lines dropped)."""
        screen = self.wait(lambda s: END.search(s) is not None, "the command's end", timeout_s)
        code = int(END.search(screen).group(1))  # type: ignore[union-attr]
        lines = [line.rstrip() for line in screen.splitlines()]
        end = next(i for i, line in enumerate(lines) if END.match(line))
        # The prompt line that ran it (the shell may echo the typed keys once before it).
        start = max(i for i, line in enumerate(lines[:end]) if "echo __exit=" in line) + 1
        body = lines[start:end]
        while body and not body[-1]:
            body.pop()
        return code, "\n".join(body)
