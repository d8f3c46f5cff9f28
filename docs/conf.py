"""Sphinx configuration of the docs site: Markdown pages (MyST), the furo theme.

Built strict by ``make docs-check`` and ``scripts/test.sh`` (``sphinx-build -W --keep-going
-n``): a broken link or anchor, a page in no table of contents, a missing page fails the
build. ``make docs`` builds it and serves it on http://127.0.0.1:8000. Why Sphinx and what
is generated: docs/contributing/docs.md.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from pygments.lexers import JsonLexer
from sphinx.application import Sphinx

project = "ups"
author = "the ups developers"
extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
# GitHub's anchors: `[x](launch.md#stopping-resuming-restarting)` resolves here as there,
# and a link to a heading that does not exist is a warning (an error under -W).
myst_heading_anchors = 4
myst_enable_extensions = ["attrs_inline"]
# Text as written: "--script" stays two hyphens (a reader searches for the flag as typed),
# quotes stay straight.
smartquotes = False
html_theme = "furo"
html_title = "ups"
html_static_path: list[str] = []
html_show_sourcelink = False

_LINK = re.compile(r"(\]\()([^)#\s]+)")


def _links_from_docs(app: Sphinx, included: Path, _parent: str, content: list[str]) -> None:
    """A file included from outside docs/ (the README) links relative to where it lives:
    point each of its links at the same file from docs/, so a page resolves to that page and
    any other file of the repository (``examples/ddp/train.py``) is offered as a download.
    A link to nothing is still a warning (an error under -W)."""
    here = (Path(app.srcdir) / included).parent

    def moved(link: re.Match[str]) -> str:
        target = link.group(2)
        if ":" in target:  # https://..., mailto:
            return link.group(0)
        return link.group(1) + os.path.relpath(here / target, app.srcdir)

    content[0] = _LINK.sub(moved, content[0])


def setup(app: Sphinx) -> None:
    app.add_lexer("jsonc", JsonLexer)  # JSON with comments: the schema in preflight.md
    app.connect("include-read", _links_from_docs)
