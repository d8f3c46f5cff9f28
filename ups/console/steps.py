"""A live line for work done in a few long steps, such as writing the demo data files."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Column

StepCallback = Callable[[int, int, Path], None]
"""``(done, total, path)``: called before the step that writes ``path`` starts."""


@contextmanager
def steps_line(stream: TextIO, label: str, done_text: str) -> Iterator[StepCallback]:
    """Draw ``label``, a bar, files done of all, the time so far and the file being written;
    on leaving, the line stays on screen, full, ending with ``done_text``.

    The line is redrawn a few times a second, so the elapsed time moves during a step that
    takes seconds (the Darcy solve) and the screen never looks frozen.
    """
    # The counters never shrink; a long file name folds onto a second row instead.
    progress = Progress(
        SpinnerColumn(finished_text=" ", table_column=Column(no_wrap=True)),
        TextColumn(f"[bold]{label}", table_column=Column(no_wrap=True)),
        BarColumn(bar_width=16, table_column=Column(no_wrap=True, width=16)),
        MofNCompleteColumn(table_column=Column(no_wrap=True)),
        TimeElapsedColumn(table_column=Column(no_wrap=True)),
        TextColumn("{task.description}", table_column=Column(overflow="fold", ratio=1)),
        console=Console(file=stream, highlight=False, emoji=False),
        transient=False,
    )
    task = progress.add_task("starting", total=None)

    def step(done: int, total: int, path: Path) -> None:
        progress.update(task, completed=done, total=total, description=f"writing {path.name}")

    with progress:
        yield step
        total = progress.tasks[0].total
        progress.update(task, completed=total, description=done_text)
