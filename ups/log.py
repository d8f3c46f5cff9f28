"""Structured logging: JSON lines with run_id, rank, world_size and step on every event.

One configuration for every process. Each rank appends every event to its own
``<run_dir>/logs/rank<N>.jsonl``; stdout gets rank 0's progress and every rank's warnings
and errors, as JSON lines, or rendered for people when stdout is a terminal.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import IO, Any, TextIO

import structlog

from ups import jsonio

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50, "exception": 40}


def dumps(event: dict[str, Any]) -> str:
    """Render one event as a compact, strict JSON line (no trailing newline)."""
    return jsonio.dumps(event)


class _Sinks:
    """Final structlog 'logger': writes each event dict to the file and/or stdout."""

    def __init__(
        self, file: IO[str] | None, stdout: TextIO | None, min_stdout: int, console: bool
    ) -> None:
        self.file = file
        self._stdout = stdout
        self.min_stdout = min_stdout
        colors = self.stdout.isatty()
        self.console = structlog.dev.ConsoleRenderer(colors=colors) if console else None

    @property
    def stdout(self) -> TextIO:
        # Looked up per event unless given: whoever replaces sys.stdout later (a test
        # harness, a tee) gets the events, and a closed old stream is never written to.
        return self._stdout or sys.stdout

    def write(self, event: dict[str, Any]) -> None:
        level = _LEVELS.get(str(event.get("level", "info")), 20)
        line = dumps(event)
        if self.file is not None:
            try:
                self.file.write(line + "\n")
                self.file.flush()
            except OSError as exc:
                # A full or failing disk must not turn every log call into a crash: the
                # events keep going to stdout (the console, launch.log on another disk).
                broken, self.file = self.file, None
                with contextlib.suppress(OSError):
                    broken.close()
                lost = {"event": "log_file_unwritable", "level": "error", "error": str(exc)}
                self.stdout.write(dumps(lost) + "\n")
        if level >= self.min_stdout:
            text = (
                self.console(None, str(event.get("level")), dict(event)) if self.console else line
            )
            self.stdout.write(str(text) + "\n")
            self.stdout.flush()

    msg = info = debug = warning = error = critical = exception = log = write


class _SinksFactory:
    def __init__(self, sinks: _Sinks) -> None:
        self.sinks = sinks

    def __call__(self, *args: Any) -> _Sinks:
        return self.sinks


def _to_sink(
    _: Any, __: str, event_dict: MutableMapping[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return (event_dict,), {}


def render_line(line: str, colors: bool = False) -> str:
    """Render one JSON log line for people; a line that is not a JSON event passes through."""
    try:
        event = json.loads(line)
    except ValueError:
        return line
    if not isinstance(event, dict) or "event" not in event:
        return line
    renderer = structlog.dev.ConsoleRenderer(colors=colors)
    return str(renderer(None, str(event.get("level", "info")), event))


def setup_logging(
    *,
    rank: int = 0,
    world_size: int = 1,
    run_id: str | None = None,
    log_dir: Path | None = None,
    console: bool | None = None,
    stdout: TextIO | None = None,
) -> Path | None:
    """Configure structlog for this process and return the rank's log file path, if any.

    ``console=None`` renders for people only when stdout is a terminal.
    """
    log_file: IO[str] | None = None
    path = None
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        path = log_dir / f"rank{rank}.jsonl"
        log_file = path.open("a", buffering=1, encoding="utf-8")
    sinks = _Sinks(
        log_file,
        stdout,
        min_stdout=logging.INFO if rank == 0 else logging.WARNING,
        console=(stdout or sys.stdout).isatty() if console is None else console,
    )
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            _to_sink,
        ],
        logger_factory=_SinksFactory(sinks),
        cache_logger_on_first_use=False,
    )
    context: dict[str, Any] = {"rank": rank, "world_size": world_size}
    if run_id is not None:
        context["run_id"] = run_id
    structlog.contextvars.bind_contextvars(**context)
    return path


def get_logger(name: str | None = None) -> Any:
    """Return a lazy structlog logger (bound to ``component=name`` when given)."""
    # Initial values keep the proxy lazy, so a module-level logger follows later configuration.
    return structlog.get_logger(component=name) if name else structlog.get_logger()
