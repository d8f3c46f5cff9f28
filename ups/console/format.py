"""Formatting for people: short numbers, one event as one line, rich renderables as text."""

from __future__ import annotations

import io
import json
import math
from typing import Any, TextIO

from rich.console import Console, RenderableType
from rich.text import Text

LOG_FORMATS = ("auto", "console", "json")
"""``--log-format`` choices: ``auto`` renders for people only when stdout is a terminal."""

HIDDEN = frozenset(
    {
        "event",
        "level",
        "timestamp",
        "run_id",
        "world_size",
        "component",
        "node_rank",
        "rank",
        "text",
    }
)
"""Fields every event carries; the console shows them once (time, rank) or in the summary;
``text``, the sentence an event carries for people, stands in for its name."""

MAX_VALUE_CHARS = 100
"""Longer values are cut in the console (the log file keeps them whole)."""

_LEVEL_STYLE = {"warning": "yellow", "error": "bold red", "critical": "bold red"}
_PLAIN_WIDTH = 1_000
"""Text rendered for files and pipes is never wrapped: one table row is one line."""


def wants_console(log_format: str, stream: TextIO) -> bool:
    """True when output should be rendered for people (``console``, or ``auto`` on a tty)."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"--log-format must be one of {', '.join(LOG_FORMATS)}, not {log_format}")
    return log_format == "console" or (log_format == "auto" and stream.isatty())


def short(value: Any) -> str:
    """A number as people read it: 4 significant digits; large rates as whole numbers."""
    if isinstance(value, bool) or not isinstance(value, float):
        return str(value)
    if not math.isfinite(value) or value == 0:
        return str(value) if value else "0"
    if 1e4 <= abs(value) < 1e9:
        return f"{value:.0f}"
    return f"{value:.4g}"


def _value(value: Any) -> str:
    if isinstance(value, dict | list):
        text = json.dumps(_shorten(value), separators=(",", ":"))
    else:
        text = short(value)
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 1] + "…"


def _shorten(value: Any) -> Any:
    if isinstance(value, float):
        return float(short(value)) if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {k: _shorten(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shorten(v) for v in value]
    return value


def event_text(event: dict[str, Any]) -> Text:
    """One event as one line: ``HH:MM:SS level event key=value ...`` with short numbers.

    An event with a ``text`` field (its sentence for people) shows that sentence where the
    name would be: the name is an identifier for filtering logs. A multi-line value (a
    traceback) follows on its own lines, whole: it is what an error is read for.
    """
    level = str(event.get("level", "info"))
    style = _LEVEL_STYLE.get(level, "")
    text = Text()
    stamp = str(event.get("timestamp", ""))
    if "T" in stamp:
        text.append(stamp.split("T", 1)[1][:8] + " ", style="dim")
    if level != "info":
        text.append(f"{level} ", style=style)
    rank = event.get("rank")
    if isinstance(rank, int) and rank > 0:
        text.append(f"[rank {rank}] ", style="cyan")
    sentence = event.get("text")
    name = sentence if isinstance(sentence, str) else event.get("event", "")
    text.append(str(name), style=style or "bold")
    blocks = []
    for key, value in event.items():
        if key in HIDDEN or value is None:  # None: nothing to show (the file keeps the key)
            continue
        if isinstance(value, str) and "\n" in value:
            blocks.append(value.rstrip("\n"))
            continue
        text.append(f"  {key}=", style="dim")
        text.append(_value(value))
    for block in blocks:
        text.append("\n" + block, style=style)
    return text


def parse_event(line: str) -> dict[str, Any] | None:
    """The event in a JSON log line, or None for anything else (torchrun's plain text)."""
    if not line.startswith("{"):
        return None
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) and "event" in event else None


def render_text(renderable: RenderableType, *, colors: bool = False) -> str:
    """A renderable as text without a trailing newline; unwrapped, trailing blanks cut."""
    buf = io.StringIO()
    console = Console(
        file=buf,
        width=_PLAIN_WIDTH,
        force_terminal=colors,
        no_color=not colors,
        color_system="standard" if colors else None,
        highlight=False,
        emoji=False,
        markup=False,
    )
    console.print(renderable, end="", crop=False, soft_wrap=False)
    return "\n".join(line.rstrip() for line in buf.getvalue().rstrip("\n").split("\n"))


def render_line(line: str, colors: bool = False) -> str:
    """Render one JSON log line for people; a line that is not a JSON event passes through."""
    event = parse_event(line)
    if event is None:
        return line
    text = event_text(event)
    # .plain skips rich's render pass: this runs once per streamed line (fab logs).
    return render_text(text, colors=True) if colors else text.plain
