"""How a hint names a deploy command: the ``fab`` task and its ``ups`` twin.

ups's deploy commands have two front ends with the same options and exit codes: ``fab
TASK`` works where Fabric finds a ``fabfile.py`` (the folder or one above it; ``ups init``
writes one), ``ups TASK`` from any folder. Every hint that tells the user to run one of
them is built here, so each names both.
"""

from __future__ import annotations


def command(task: str, *words: str) -> str:
    """``fab TASK WORDS`` in backticks, followed by its ``ups`` twin."""
    line = " ".join((task, *words))
    return f"`fab {line}` (or `ups {task}` with the same options)"
