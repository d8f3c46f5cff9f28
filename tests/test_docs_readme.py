"""The README is the front page: short, its links land on pages that exist, and its
exit-code summary names every code of the one table (ups/exitcodes.py). The site's strict
build checks the pages' links; the README is not a page of the site, so these checks are
its own."""

from __future__ import annotations

import re
from pathlib import Path

from ups import exitcodes

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MAX_LINES = 250
LINK = re.compile(r"\]\(([^)\s]+)\)")
ANCHOR = re.compile(r"^#+ (.+?)\s*$", re.M)


def _anchors(page: Path) -> set[str]:
    """GitHub's (and the site's, ``myst_heading_anchors``) anchors of a page's headings."""
    return {
        re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        for heading in ANCHOR.findall(page.read_text())
    }


def broken_links(text: str, base: Path) -> list[str]:
    """Relative links of ``text`` (a file in ``base``) whose file or anchor does not exist."""
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # https://, mailto:
            continue
        path, _, anchor = target.partition("#")
        page = (base / path).resolve() if path else base / README.name
        if not page.exists() or (page.suffix == ".md" and anchor not in _anchors(page) | {""}):
            broken.append(target)
    return broken


def test_the_readme_is_a_front_page() -> None:
    """At most 250 lines; the long sections live in docs/."""
    lines = README.read_text().count("\n")
    assert lines <= MAX_LINES, f"README.md has {lines} lines; move sections to docs/"


def test_every_readme_link_lands_on_a_file_and_heading_that_exist() -> None:
    """A page renamed or a heading reworded breaks no README link unnoticed."""
    assert broken_links(README.read_text(), REPO) == []


def test_the_link_check_finds_a_missing_page_and_a_missing_heading(tmp_path: Path) -> None:
    """The check above can fail: a link to no file, and one to no heading, are reported."""
    (tmp_path / "page.md").write_text("# Title\n\n## The two forms\n")
    text = "[a](page.md) [b](page.md#the-two-forms) [c](gone.md#x) [d](page.md#nope) [e](https://x)"
    assert broken_links(text, tmp_path) == ["gone.md#x", "page.md#nope"]


def test_the_readme_exit_code_summary_names_every_code_of_the_table() -> None:
    """Its table lists each code of ups/exitcodes.py once, with that code's name, in order."""
    text = README.read_text()
    section = text[text.index("## When a run ends") :]
    rows = re.findall(r"^\| (\d+) \| `([a-z_]+)` \|", section, re.M)
    assert rows == [(str(code.code), code.name) for code in exitcodes.TABLE]
