"""Console for people, JSON lines for machines.

Every ups process logs JSON lines (``ups.log``). This package only renders them, in one
place, for whoever reads a terminal:

- Workers always write JSON. Under ``ups launch`` each rank is a separate process whose
  stdout is torchrun's pipe, so a rank cannot know whether a person is watching, and
  several ranks drawing progress bars into one pipe would garble each other. The
  launcher reads that pipe line by line anyway (``ups.launch.torchrun``) and tees it into
  ``launch.log`` (``ups.launch.tee``); its console side hands each line to a
  :class:`ConsoleView` when its own stdout is a terminal (or ``--log-format console``).
- ``launch.log`` and the per-rank ``logs/rank<N>.jsonl`` files are always the raw lines,
  so ``fab logs`` can follow them by byte offset and tools can parse them. Off a
  terminal (pipes, files, CI, ``--log-format json``) stdout is those same raw lines.
- ``fab deploy``/``fab logs`` stream the remote ``launch.log`` and feed the same
  :class:`ConsoleView` locally, so a remote run looks like a local one.
- ``ups-train`` run by hand on a terminal renders its own events through the view too.

The view draws one live progress line with rich (step/total, percent, elapsed, ETA,
loss and per-task error to 4 significant digits, samples/s, learning rate, last
checkpoint, skipped steps), prints warnings and errors above it in colour, and ends with
the evaluation and outcome tables. rich rather than tqdm: one library draws the live
line, the tables (preflight, evaluation, outcome) and the transfer progress of deploys.
"""

from ups.console.format import LOG_FORMATS, render_line, render_text, short, wants_console
from ups.console.tables import eval_table, outcome_table
from ups.console.view import ConsoleView

__all__ = [
    "LOG_FORMATS",
    "ConsoleView",
    "eval_table",
    "outcome_table",
    "render_line",
    "render_text",
    "short",
    "wants_console",
]
