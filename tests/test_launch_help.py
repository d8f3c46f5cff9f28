"""Help texts: every option of every ``ups`` subcommand says what it does, in plain text.

The parsers are taken from the commands themselves (each one's ``main(["--help"])``
builds its parser and asks it to parse), so a command added later is checked too.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
from collections.abc import Iterator

import pytest

from ups.cli import COMMANDS
from ups.cli import main as ups_main


class _Caught(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def _parser_of(command: str) -> argparse.ArgumentParser:
    """The parser ``ups COMMAND`` builds: caught at its first parse, before it does anything."""
    original = argparse.ArgumentParser.parse_known_args

    def catch(self: argparse.ArgumentParser, *_a: object, **_k: object) -> None:
        raise _Caught(self)

    argparse.ArgumentParser.parse_known_args = catch  # type: ignore[method-assign,assignment]
    try:
        module, _, function = COMMANDS[command][0].partition(":")
        getattr(importlib.import_module(module), function or "main")(["--help"])
    except _Caught as caught:
        return caught.parser
    finally:
        argparse.ArgumentParser.parse_known_args = original  # type: ignore[method-assign]
    raise AssertionError(f"`ups {command} --help` parsed no arguments with argparse")


def _walk(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.Action]]:
    """(the parser's prog, action) for the parser and each of its subcommands."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _walk(sub)
        elif not isinstance(action, argparse._HelpAction):
            yield parser.prog, action


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_has_help(command: str) -> None:
    """Each option and argument of ``ups COMMAND`` (and its subcommands) has a help text,
    and no help text or description shows reST markup (double backquotes)."""
    parser = _parser_of(command)
    missing = [
        f"{prog} {'/'.join(a.option_strings) or a.dest}"
        for prog, a in _walk(parser)
        if not a.help or a.help == argparse.SUPPRESS
    ]
    assert not missing, f"options without help: {missing}"
    texts = [parser.format_help()] + [
        sub.format_help()
        for a in parser._actions
        if isinstance(a, argparse._SubParsersAction)
        for sub in a.choices.values()
    ]
    assert not [t for t in texts if "``" in t], f"reST markup in `ups {command} --help`"


def test_launch_help_names_the_options_people_asked_about() -> None:
    """``ups launch --help`` describes --set, --nnodes, --node-rank and --skip-preflight."""
    helps = {
        opt: a.help for _, a in _walk(_parser_of("launch")) for opt in a.option_strings if a.help
    }
    for option in ("--set", "--nnodes", "--node-rank", "--skip-preflight"):
        assert option in helps, option


def test_top_level_help_points_to_command_help_and_version() -> None:
    """``ups --help`` mentions ``ups COMMAND --help`` and ``--version``, which prints one."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert ups_main(["--help"]) == 0
    assert "ups COMMAND --help" in out.getvalue()
    assert "--version" in out.getvalue()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert ups_main(["--version"]) == 0
    assert out.getvalue().strip()[0].isdigit()
