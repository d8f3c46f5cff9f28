"""The small tables a run ends with: held-out error next to the baseline, and the outcome."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ups.console.format import short

OUTCOME_STYLE = {"finished": "bold green", "preempted": "bold yellow", "failed": "bold red"}
BASELINE_NOTE = (
    "baseline: persistence (previous frame) for time tasks, mean training field for steady"
)


def eval_table(metrics: dict[str, Any]) -> RenderableType:
    """Task, model rel L2, baseline rel L2, how many times better, held-out samples."""
    table = Table(title="held-out evaluation", title_justify="left")
    for name in ("task", "model rel L2", "baseline rel L2", "baseline/model", "samples"):
        table.add_column(name, justify="left" if name == "task" else "right")
    tasks = sorted({key.split("/")[1] for key in metrics if key.startswith("eval/")})
    for task in tasks:
        model = float(metrics[f"eval/{task}/rel_l2"])
        base = float(metrics[f"eval/{task}/baseline_rel_l2"])
        ratio = f"{base / model:.1f}x" if model > 0 else "-"
        samples = metrics.get(f"eval/{task}/samples")
        count = str(int(samples)) if isinstance(samples, int | float) else "-"
        table.add_row(task, f"{model:.4f}", f"{base:.4f}", ratio, count)
    return Group(table, Text(BASELINE_NOTE, style="dim"))


def outcome_table(fields: dict[str, Any]) -> RenderableType:
    """How the run ended, as a two-column table: outcome, reason, steps, checkpoint, where."""
    kind = str(fields.get("outcome", "?"))
    table = Table(show_header=False, title=f"run {fields.get('run_id', '')}".strip())
    table.title_justify = "left"
    table.add_column(style="bold")
    table.add_column()
    code = fields.get("exit_code")
    headline = Text(kind, style=OUTCOME_STYLE.get(kind, "bold"))
    if code is not None:
        headline.append(f" (exit {code})")
    table.add_row("outcome", headline)
    for label, key in (
        ("reason", "reason"),
        ("steps", "steps"),
        ("last checkpoint", "checkpoint"),
        ("run dir", "run_dir"),
        ("warnings", "warnings"),
        ("resume", "resume"),
    ):
        value = fields.get(key)
        if value not in (None, ""):
            table.add_row(label, Text(short(value)))
    return Group(table)
