"""Every output the docs show from a real run is a registered capture that a test checks.

scripts/captures.py knows each capture (``<!-- capture:NAME -->`` in README.md or a page
of docs/), how it is made again, and which test compares it with what its own run of ups
prints. These tests hold that registry to the docs and to the tests, and pin down the
comparison the checks share.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.repo_scripts import REPO, captures


def test_every_marker_is_a_registered_capture_found_once() -> None:
    """The capture names in the docs are exactly the registered ones, each in one place
    (a moved section keeps its capture; a copied one would be checked only once)."""
    c = captures()
    found = c.markers()
    assert set(found) == set(c.CAPTURES), (
        f"markers without an entry in CAPTURES: {sorted(set(found) - set(c.CAPTURES))}; "
        f"entries without a marker: {sorted(set(c.CAPTURES) - set(found))}"
    )
    assert {name: len(files) for name, files in found.items()} == dict.fromkeys(found, 1)
    for name in c.CAPTURES:
        assert c.quoted(name).strip(), name


@pytest.mark.parametrize("name", sorted(captures().CAPTURES))
def test_each_capture_is_checked_by_the_test_it_names(name: str) -> None:
    """The test a capture names exists and calls ``check`` on that capture with its own
    run's output."""
    path, _, function = captures().CAPTURES[name].checked_by.partition("::")
    source = (REPO / path).read_text()
    tests = {
        node.name: ast.get_source_segment(source, node) or ""
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef)
    }
    assert function in tests, f"{name}: {path} has no test {function}"
    assert re.search(rf"\.check\(\s*\"{re.escape(name)}\"", tests[function]), (
        f"{path}::{function} does not call captures().check({name!r}, ...)"
    )


def test_in_order_ignores_what_varies_by_run_but_not_words() -> None:
    """The shared comparison passes a capture against output with other numbers, paths,
    digests and fingerprints, and with the parts the docs elide (``...``); it fails when a
    word changed or a piece is missing or out of order."""
    c = captures()
    quoted = (
        "error: host key for [127.0.0.1]:60687 CHANGED: recorded ssh-ed25519\n"
        "SHA256:yaCOfpod/n6h6AMCuP5dmI0L4s ... remove the old one with\n"
        "`ssh-keygen -R '[127.0.0.1]:60687' -f /tmp/a/known_hosts` and deploy again."
    )
    printed = (
        "error: host key for [127.0.0.1]:1234 CHANGED: recorded ssh-ed25519 "
        "SHA256:Zm9vYmFy+/x, host now presents ssh-ed25519 SHA256:YmFy. This is expected. "
        "If you trust it, remove the old one with `ssh-keygen -R '[127.0.0.1]:1234' -f "
        "/home/me/.config/ups/known_hosts` and deploy again.\n"
    )
    assert c.in_order(quoted, printed) == []
    assert c.in_order(quoted, printed.replace("CHANGED", "changed")) != []
    assert c.in_order(quoted, printed.replace("deploy again", "try later")) != []
    swapped = "and deploy again. error: host key for [127.0.0.1]:1 CHANGED: recorded ssh-ed25519"
    assert c.in_order(quoted, swapped) != []


def test_a_rewrite_puts_the_run_s_output_where_the_marker_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With UPS_CAPTURES=rewrite a test-made capture is written in place of the old text,
    in whichever page holds it, and nothing else of the page changes; without it, the
    same output is compared instead."""
    c = captures()
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n<!-- capture:host-key-changed -->\n```\nold words\n```\n\nafter\n")
    monkeypatch.setattr(c, "doc_files", lambda: [page])
    assert c.check("host-key-changed", "error: new words\n") != []
    monkeypatch.setenv(c.ENV, "rewrite")
    assert c.check("host-key-changed", "error: new words\n") == []
    assert page.read_text() == (
        "# A page\n\n<!-- capture:host-key-changed -->\n```\nerror: new words\n```\n\nafter\n"
    )
