"""Structured logging: JSON lines with run_id, rank, world_size and step on every event.

One configuration for every process. Each rank appends every event to its own
``<run_dir>/logs/rank<N>.jsonl`` (always JSON); stdout gets rank 0's progress and every
rank's warnings and errors, as JSON lines, or through :class:`ups.console.ConsoleView`
(progress line, tables) when asked to render for people (see :mod:`ups.console`).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import IO, Any, TextIO

import structlog

from ups import jsonio
from ups.console import ConsoleView, render_line

__all__ = ["dumps", "get_logger", "render_line", "route_library_logs", "setup_logging"]

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50, "exception": 40}


def dumps(event: dict[str, Any]) -> str:
    """Render one event as a compact, strict JSON line (no trailing newline)."""
    return jsonio.dumps(event)


class _Sinks:
    """Final structlog 'logger': writes each event dict to the file and/or stdout."""

    def __init__(
        self,
        file: IO[str] | None,
        stdout: TextIO | None,
        min_stdout: int,
        console: bool,
        live: bool | None,
    ) -> None:
        self.file = file
        self._stdout = stdout
        self.min_stdout = min_stdout
        self.console = console
        self.live = live
        self.chosen = False
        """The process's stdout format was chosen explicitly (``--log-format``)."""
        self.view: ConsoleView | None = None
        self._view_stream: TextIO | None = None

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
        if level < self.min_stdout:
            return
        if self.console:
            stream = self.stdout
            if self.view is not None and self._view_stream is not stream:
                # sys.stdout was replaced since the view was made: follow it, as plain
                # output does, instead of drawing on a stream that may be closed.
                self.close()
            if self.view is None:
                self.view = ConsoleView(stream, live=self.live)
                self._view_stream = stream
                atexit.register(self.view.close)  # the live line ends with the process
            self.view.feed_event(dict(event))
            return
        self.stdout.write(line + "\n")
        self.stdout.flush()

    def close(self) -> None:
        if self.view is not None:
            self.view.close()
            atexit.unregister(self.view.close)
            self.view = None

    msg = info = debug = warning = error = critical = exception = log = write


class _SinksFactory:
    def __init__(self, sinks: _Sinks) -> None:
        self.sinks = sinks

    def __call__(self, *args: Any) -> _Sinks:
        return self.sinks


_SINKS: _Sinks | None = None
"""The sinks of the last setup, closed (live console line stopped) by the next one."""


def _to_sink(
    _: Any, __: str, event_dict: MutableMapping[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return (event_dict,), {}


def setup_logging(
    *,
    rank: int = 0,
    world_size: int = 1,
    run_id: str | None = None,
    log_dir: Path | None = None,
    console: bool | None = None,
    live: bool | None = None,
    stdout: TextIO | None = None,
    log_file: Path | None = None,
) -> Path | None:
    """Configure structlog for this process and return the rank's log file path, if any.

    ``console=True`` renders stdout for people (:class:`ups.console.ConsoleView`; ``live``
    draws the progress line, default: when stdout is a terminal), ``False`` writes JSON
    lines (``--log-format json``), ``None`` keeps the choice an earlier setup made for
    the process's own stdout (the trainer sets up again once its run directory exists),
    else renders on a terminal only. Under ``ups launch`` a worker's stdout is torchrun's
    pipe, so workers write JSON and the launcher renders. ``log_file`` appends the JSON
    lines there instead of the rank's file in ``log_dir`` (a command on the laptop).
    """
    global _SINKS
    if _SINKS is not None:
        if console is None and stdout is None and _SINKS.chosen:
            console, live = _SINKS.console, _SINKS.live
        _SINKS.close()
    chosen = console is not None and stdout is None
    sink_file: IO[str] | None = None
    path = None
    if log_file is not None or log_dir is not None:
        path = log_file or Path(str(log_dir)) / f"rank{rank}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        sink_file = path.open("a", buffering=1, encoding="utf-8")
    sinks = _Sinks(
        sink_file,
        stdout,
        min_stdout=logging.INFO if rank == 0 else logging.WARNING,
        console=(stdout or sys.stdout).isatty() if console is None else console,
        live=live,
    )
    sinks.chosen = chosen
    _SINKS = sinks
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


LIBRARY_EVENT = "library_log"
"""The event name of a record from a library's Python ``logging`` (its text in ``message``)."""
_LIBRARY_HANDLER = "ups_library_logs"


def _as_library_event(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> Any:
    """A library's message is a sentence, not an event name: keep it in ``message``."""
    event_dict["message"] = str(event_dict.get("event", ""))
    event_dict["event"] = LIBRARY_EVENT
    return event_dict


class _SinkHandler(logging.Handler):
    """Writes each formatted record as one line to the current log file, if there is one."""

    def emit(self, record: logging.LogRecord) -> None:
        sinks = _SINKS
        if sinks is None or sinks.file is None:
            return
        try:
            sinks.file.write(self.format(record) + "\n")
            sinks.file.flush()
        except OSError:
            self.handleError(record)


def route_library_logs(*, verbose: bool = False) -> None:
    """Route Python ``logging`` (paramiko, urllib3, vastai, botocore...) into ups's log.

    Without a handler on the root logger Python prints a library's warnings and errors
    (paramiko's, with a traceback, while an SSH port accepts and never speaks) raw on
    stderr. Here every record from WARNING up (INFO with ``verbose``) goes through
    structlog's processors (:class:`structlog.stdlib.ProcessorFormatter`) into the JSON
    log file of :func:`setup_logging` as a ``library_log`` event with its traceback; a
    person sees them on stderr only with ``verbose``. Calling it again replaces its
    handlers.
    """
    pre_chain: list[Any] = [
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _as_library_event,
    ]
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "name", None) == _LIBRARY_HANDLER]:
        root.removeHandler(old)
    to_file = _SinkHandler()
    to_file.set_name(_LIBRARY_HANDLER)
    to_file.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                structlog.processors.JSONRenderer(serializer=lambda obj, **_: dumps(obj)),
            ],
            foreign_pre_chain=pre_chain,
        )
    )
    root.addHandler(to_file)
    if verbose:
        to_console = logging.StreamHandler(sys.stderr)
        to_console.set_name(_LIBRARY_HANDLER)
        to_console.setFormatter(
            structlog.stdlib.ProcessorFormatter(
                processors=[
                    structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.dev.ConsoleRenderer(colors=False),
                ],
                foreign_pre_chain=pre_chain,
            )
        )
        root.addHandler(to_console)
    root.setLevel(logging.INFO if verbose else logging.WARNING)


def get_logger(name: str | None = None) -> Any:
    """Return a lazy structlog logger (bound to ``component=name`` when given)."""
    # Initial values keep the proxy lazy, so a module-level logger follows later configuration.
    return structlog.get_logger(component=name) if name else structlog.get_logger()
