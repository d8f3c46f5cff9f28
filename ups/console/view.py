"""ConsoleView: ups's JSON log lines in, what a person wants to watch out.

Feed it every line a run prints (``feed``) or every event (``feed_event``). It keeps a
little state to draw one live progress line per run, prints warnings and errors above
it, and ends with the evaluation and outcome tables. It never writes a log file and
never decides what is logged: it only renders.
"""

from __future__ import annotations

import re
import threading
from typing import Any, TextIO

from rich.console import Console, RenderableType
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Column
from rich.text import Text

from ups import jsonio
from ups.console.format import event_text, parse_event, render_line, short
from ups.console.tables import eval_table, outcome_table

QUIET_EVENTS = frozenset({"preflight_check", "preflight_done", "stall_ruled_out"})
"""Not shown one line each at level info: the preflight checks (the table that follows
shows them), a stall suspicion the stacks cleared (launch.log keeps it)."""
STOP_EVENTS = frozenset({"stop_signal_received", "stop_signal_repeated", "preempt_stop"})
"""A requested stop telling its own story (launch got the signal, the ranks stop at a
step): shown as information, never counted as a warning; the table says how it ended."""
TABLE_EVENTS = frozenset({"outcome", "run_ended"})
"""What the outcome table shows: never counted as a warning or an error "above" it."""
AGENT_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] ")
"""torchrun's own log lines (``W1125 22:23:31.045000 29738 .../api.py:753] Received 15
death signal``): launch.log keeps them; on a person's console they would only repeat,
in torch's words, what launch's own lines and the outcome table say."""


class _GuardedStream:
    """The console stream; once writing fails (terminal or SSH session gone), drop output.

    rich answers a broken pipe by exiting the process; a run must outlive its terminal
    (its log file keeps every line), so write errors stop here.
    """

    def __init__(self, stream: TextIO) -> None:
        self.stream: TextIO | None = stream
        self._tty = stream.isatty()

    def write(self, text: str) -> int:
        if self.stream is not None:
            try:
                self.stream.write(text)
            except OSError:
                self.stream = None
        return len(text)

    def flush(self) -> None:
        if self.stream is not None:
            try:
                self.stream.flush()
            except OSError:
                self.stream = None

    def isatty(self) -> bool:
        return self._tty

    def fileno(self) -> int:
        # rich asks for the terminal size through this.
        if self.stream is None:
            raise OSError("console closed")
        return self.stream.fileno()


def _progress(console: Console) -> Progress:
    # The counters never shrink; the stats wrap onto a second row when the terminal is
    # narrow, rather than being cut.
    fixed = Column(no_wrap=True)
    return Progress(
        TextColumn("[bold]train", table_column=fixed),
        BarColumn(bar_width=16, table_column=Column(no_wrap=True, width=16)),
        MofNCompleteColumn(table_column=Column(no_wrap=True)),
        TaskProgressColumn(table_column=Column(no_wrap=True)),
        TimeElapsedColumn(table_column=Column(no_wrap=True)),
        TextColumn("ETA", table_column=Column(no_wrap=True)),
        TimeRemainingColumn(table_column=Column(no_wrap=True)),
        TextColumn("{task.fields[stats]}", table_column=Column(overflow="fold", ratio=1)),
        console=console,
        redirect_stdout=False,
        redirect_stderr=False,
        transient=False,
    )


class ConsoleView:
    """Render ups's JSON log lines for people.

    ``live`` (default: the stream is a terminal) draws the progress line and tables with
    rich; otherwise each event becomes one plain ``key=value`` line and nothing is held
    back (``fab logs`` into a file or pipe).
    """

    def __init__(self, stream: TextIO, *, live: bool | None = None) -> None:
        self.live = stream.isatty() if live is None else live
        self._plain = stream
        self.console = Console(
            file=_GuardedStream(stream),  # type: ignore[arg-type]  # duck-typed text stream
            force_terminal=self.live or None,
            highlight=False,
            markup=False,
            emoji=False,
        )
        self._lock = threading.RLock()
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._total = 0
        self._done = 0
        self._tasks: dict[str, float] = {}
        self._stats: dict[str, float] = {}
        self._checkpoint: str | None = None
        self._checkpoint_step: Any = None
        self._skipped = 0
        self._warnings = 0
        self._errors = 0
        self._outcome: dict[str, Any] | None = None
        self._summarized = False

    # -- input -----------------------------------------------------------------------

    def feed(self, line: str) -> None:
        """One line as printed by a run: a JSON event, or plain text shown as it is."""
        if not self.live:
            self._write_plain(render_line(line))
            return
        event = parse_event(line)
        if event is None and AGENT_LINE.match(line):
            return
        with self._lock:
            if event is None:
                # torchrun and NCCL may colour their own lines: keep, not garble, those codes.
                self.console.print(Text.from_ansi(line), soft_wrap=True)
            else:
                self._handle(event)

    def feed_event(self, event: dict[str, Any]) -> None:
        """One event dict, as structlog hands it over (same rendering as :meth:`feed`)."""
        if not self.live:
            self._write_plain(render_line(jsonio.dumps(event)))
            return
        with self._lock:
            self._handle(event)

    def show(self, renderable: RenderableType) -> None:
        """Print a table or text above the progress line (e.g. the preflight report)."""
        with self._lock:
            self.console.print(renderable)

    def close(self) -> None:
        """Stop the live line; a standalone trainer's outcome is summarized here."""
        with self._lock:
            self._stop()
            if self._outcome is not None and not self._summarized:
                self._summary(self._outcome)

    # -- rendering -------------------------------------------------------------------

    def _write_plain(self, text: str) -> None:
        try:
            self._plain.write(text + "\n")
            self._plain.flush()
        except OSError:
            pass  # the terminal went away; the run's log file has the line

    def _handle(self, event: dict[str, Any]) -> None:
        name = str(event.get("event", ""))
        level = str(event.get("level", "info"))
        if name in STOP_EVENTS:
            self._stop_story(event)
            return
        if name not in TABLE_EVENTS and level == "warning":
            self._warnings += 1
        elif name not in TABLE_EVENTS and level in ("error", "critical"):
            self._errors += 1
        if name in QUIET_EVENTS and level == "info":
            return
        if name == "train_start":
            self._start(event)
        elif name == "train_step" and self._progress is not None:
            self._step(event)
        elif name == "checkpoint_saved" and self._progress is not None:
            self._checkpoint = str(event.get("path"))
            self._checkpoint_step = event.get("step")
            self._reached(event.get("step"))
        elif name == "step_skipped":
            self._skipped += 1
            self._refresh()
            self.console.print(event_text(event))
        elif name == "eval":
            self._stop()
            self.console.print(eval_table(event))
        elif name == "outcome":
            if event.get("rank", 0) != 0:
                if event.get("outcome") != "preempted":  # the stop: rank 0 says it for all
                    self.console.print(event_text(event))
                return
            self._outcome = {**event, "checkpoint": self._checkpoint}
            self._reached(event.get("step"))
            if level == "error":  # a preempted run's reason is the table's first row
                self.console.print(event_text(event))
        elif name == "run_ended":
            self._stop()
            self._summary({**(self._outcome or {}), **event})
        else:
            self.console.print(event_text(event))

    def _stop_story(self, event: dict[str, Any]) -> None:
        """One line per stop, as information: launch's, then rank 0's step (every rank
        stops at the same one, so the others' lines would only repeat it)."""
        if event.get("rank", 0) != 0:
            return
        # The sentence names the signal as sent; how launch passed it on is in launch.log.
        shown = {k: v for k, v in event.items() if k not in ("signal", "forwarded")}
        shown["level"] = "info"
        if event.get("event") == "preempt_stop":
            step, sig = shown.pop("step", None), event.get("signal")
            self._reached(step)
            shown["text"] = f"stop requested ({sig}): all ranks stop after step {step}"
        self.console.print(event_text(shown))

    def _reached(self, step: Any) -> None:
        """The steps done as a stop, a checkpoint or the outcome reports them: the live
        line ends on the step the table shows, even between two logged steps."""
        if isinstance(step, int) and step > self._done:
            self._done = step
        self._refresh()

    def _start(self, event: dict[str, Any]) -> None:
        self._stop()
        self._total = int(event.get("steps") or 0)
        self._done = int(event.get("from_step") or 0)
        self._progress = _progress(self.console)
        self._task = self._progress.add_task(
            "train", total=self._total or None, completed=self._done, stats="waiting for step 1"
        )
        self._progress.start()

    def _step(self, event: dict[str, Any]) -> None:
        self._done = int(event.get("step", self._done)) + 1
        for key, value in event.items():
            parts = key.split("/")
            if parts[0] == "train" and len(parts) == 3 and parts[2] == "rel_l2":
                self._tasks[parts[1]] = value
            elif parts[0] == "train" and len(parts) == 2:
                self._stats[parts[1]] = value
        self._refresh()

    def _stats_text(self) -> str:
        parts = []
        if "loss" in self._stats:
            per_task = " ".join(f"{t} {short(v)}" for t, v in self._tasks.items())
            loss = f"loss {short(self._stats['loss'])}"
            parts.append(f"{loss} ({per_task})" if per_task else loss)
        if "samples_per_s" in self._stats:
            parts.append(f"{short(self._stats['samples_per_s'])} samples/s")
        if "lr" in self._stats:
            parts.append(f"lr {float(self._stats['lr']):.3g}")
        if self._checkpoint:
            parts.append(f"ckpt @{self._checkpoint_step}")
        parts.append(f"{self._skipped} skipped")
        return " · ".join(parts)

    def _refresh(self) -> None:
        if self._progress is None or self._task is None:
            return
        self._progress.update(self._task, completed=self._done, stats=self._stats_text())

    def _stop(self) -> None:
        if self._progress is not None:
            self._refresh()
            self._progress.stop()
            self._progress = None

    def _summary(self, fields: dict[str, Any]) -> None:
        self._summarized = True
        if self._total:
            # The outcome's step (the checkpoint's number), not the last progress line's.
            done = int(fields.get("step") or self._done)
            fields["steps"] = f"{done}/{self._total}, {self._skipped} skipped"
        fields.setdefault("checkpoint", self._checkpoint)
        if self._warnings or self._errors:
            fields["warnings"] = f"{self._warnings} warning(s), {self._errors} error(s) above"
        self.console.print(outcome_table(fields))
