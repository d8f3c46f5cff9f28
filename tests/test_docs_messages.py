"""Every message ups prints for a mistake or a host fault has an entry in
docs/troubleshooting.md, under its first words, and every entry matches a message.

The messages are found by scripts/docs-messages.py (an AST scan of ``ups/``: the
user-facing exceptions raised or built, the problem lines of a config, run file or
hosts.yaml, argparse's usage errors); see its docstring for the rules. To add an entry,
run ``.venv/bin/python scripts/docs-messages.py``: it prints the heading each missing
message needs and where the message is raised.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path
from types import ModuleType

from tests.repo_scripts import script

REPO = Path(__file__).resolve().parents[1]
HOW = "run `.venv/bin/python scripts/docs-messages.py` for the headings to add"


def scanner() -> ModuleType:
    return script("docs-messages")


def test_every_message_has_an_entry_and_every_entry_a_message() -> None:
    """The scan of ups/ finds no message without an entry on the troubleshooting page, no
    entry that matches nothing (stale or mistyped), no entry too short to search for, no
    composed message left unexplained, and no exception class left unclassified."""
    m = scanner()
    files = m.read_files()
    messages, composed = m.scan(files)
    keys = m.entries(m.PAGE.read_text())
    gaps = [
        f"{msg.where} ({msg.kind}): needs an entry, e.g. `### {m.suggested_key(msg)}`"
        for msg in m.missing(messages, keys)
    ]
    assert not gaps, f"messages without an entry in docs/troubleshooting.md ({HOW}):\n" + (
        "\n".join(gaps)
    )
    assert not m.unused(messages, keys), (
        f"entries of docs/troubleshooting.md that match no message: {m.unused(messages, keys)}"
    )
    assert not m.too_short(keys), f"entries with fewer than 3 words: {m.too_short(keys)}"
    assert not composed, "messages with fewer than 3 words of their own; name where their " + (
        "words come from in WORDS_FROM or PASSES_ON (scripts/docs-messages.py): "
        + "; ".join(f"{c.where} in {c.function}(): {c.key!r}" for c in composed)
    )
    assert not m.stale_sites(files), (
        f"named in scripts/docs-messages.py, gone: {m.stale_sites(files)}"
    )
    unclassified = m.unclassified(files)
    assert not unclassified, (
        f"exception classes neither USER_FACING nor INTERNAL in scripts/docs-messages.py: "
        f"{unclassified}"
    )
    assert len(messages) > 150  # the scan reads the whole package


def test_every_preflight_check_has_an_entry() -> None:
    """Each preflight check (a row of its table) has an entry under its name."""
    m = scanner()
    keys = set(m.entries(m.PAGE.read_text()))
    assert not [c for c in m.check_names() if c not in keys]


def _scan_source(source: str) -> list[str]:
    m = scanner()
    files = {"ups/probe.py": ast.parse(textwrap.dedent(source))}
    messages, composed = m.scan(files)
    return [msg.key for msg in messages if msg.where.startswith("ups/probe.py")] + [
        f"composed: {c.key}" for c in composed
    ]


def test_the_scan_finds_each_form_of_message() -> None:
    """A raise of a user-facing class (f-string parts as …), a problem line, a usage error
    and a message built and returned are all found; a bare message passed on is reported
    as composed; a message an entry covers by its first words is not missing."""
    keys = _scan_source(
        """
        def f(host, problems, parser, err):
            raise DeployError(f"host {host!r} is gone: deploy again")
            problems.append(f"tasks.{host}.path: data file is missing")
            parser.error("give one of --a and --b")
            raise DeployError(str(err))
        """
    )
    assert sorted(keys) == [
        "composed: …",
        "give one of --a and --b",
        "host … is gone: deploy again",
        "tasks.….path: data file is missing",
    ]
    m = scanner()
    message = m.Message("host … is gone: deploy again", "ups/probe.py:3", "f", "UsageError")
    assert m.missing([message], ["host … is gone"]) == []
    assert m.missing([message], ["host … is here"]) == [message]
