"""Help texts: every option of every ``ups`` subcommand says what it does, in plain text,
and ``--help`` answers without importing torch.

The parsers are taken from the commands themselves (each one's ``main(["--help"])``
builds its parser and asks it to parse), so a command added later is checked too.
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import importlib
import io
import sys
import tomllib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.conftest import REPO
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


def _is_ups(name: str) -> bool:
    return name == "ups" or name.startswith("ups.")


@contextlib.contextmanager
def _ups_afresh_without_torch() -> Iterator[list[str]]:
    """Every ``ups`` module imported afresh (so its imports run again), with ``import
    torch`` refused and recorded (even one a ``try`` would swallow); this process's own
    ``ups`` modules are back afterwards."""
    saved = {name: module for name, module in sys.modules.items() if _is_ups(name)}
    for name in saved:
        del sys.modules[name]
    tried: list[str] = []
    real_import = builtins.__import__

    def refuse_torch(name: str, *args: Any, **kwargs: Any) -> Any:
        level = args[3] if len(args) > 3 else kwargs.get("level", 0)
        if level == 0 and name.split(".")[0] == "torch":
            tried.append(name)
            raise ImportError(f"{name} imported by --help")
        return real_import(name, *args, **kwargs)

    builtins.__import__ = refuse_torch
    try:
        yield tried
    finally:
        builtins.__import__ = real_import
        for name in [name for name in sys.modules if _is_ups(name)]:
            del sys.modules[name]
        sys.modules.update(saved)


def _exit_code(main: Callable[[list[str]], int], argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)


def test_help_and_usage_mistakes_answer_without_importing_torch(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--help`` of every console script and every ``ups COMMAND``, and a usage mistake,
    is answered without importing torch (seconds of CPU each; ``ups-train --help`` took
    7 s on a busy 2-core machine when it did): the thin-entry-point rule."""
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    asked = {f"{script} --help": (target, ["--help"], 0) for script, target in scripts.items()}
    asked |= {f"ups {c} --help": ("ups.cli:main", [c, "--help"], 0) for c in COMMANDS}
    asked["ups-train"] = ("ups.train.main:main", [], 2)  # no CONFIG: a usage mistake
    asked["ups launch --nnodes two"] = ("ups.cli:main", ["launch", "--nnodes", "two"], 2)
    with _ups_afresh_without_torch() as tried:
        for said, (target, argv, code) in asked.items():
            module, _, function = target.partition(":")
            main = getattr(importlib.import_module(module), function)
            assert _exit_code(main, argv) == code, said
            assert not tried, f"`{said}` imported {tried[0]}"
    assert "usage: ups-train" in capsys.readouterr().err
