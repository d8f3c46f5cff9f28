"""No test sleeps longer than a second without saying what it waits for.

A long sleep in a test is either a wait on something (then the comment names it, or the
test polls the condition with a deadline instead) or wasted wall time. Read from the
source, no process started: every ``sleep(N)`` call under tests/ with N a number (or a
module-level numeric constant) above ``LIMIT_S`` needs a comment on its line or the line
above. Python scripts that tests keep in string constants (written out and run as
subprocesses) are read the same way.
"""

from __future__ import annotations

import ast
import io
import textwrap
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIMIT_S = 1.0
_SLEEPS = {"sleep", "time.sleep", "asyncio.sleep"}


def _comment_lines(source: str) -> set[int]:
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return {tok.start[0] for tok in tokens if tok.type == tokenize.COMMENT}


def _constants(tree: ast.Module) -> dict[str, float]:
    """Module-level ``NAME = <number>`` assignments, so ``sleep(NAME)`` is read too."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            value = node.value.value
            if isinstance(value, int | float) and not isinstance(value, bool):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        found[target.id] = float(value)
    return found


def _seconds(arg: ast.expr, constants: dict[str, float]) -> float | None:
    if isinstance(arg, ast.Constant) and isinstance(arg.value, int | float):
        return float(arg.value)
    if isinstance(arg, ast.Name):
        return constants.get(arg.id)
    return None


def _is_script(node: ast.AST) -> bool:
    """A multi-line string with a sleep call in it: a script a test writes out and runs."""
    value = node.value if isinstance(node, ast.Constant) else None
    return isinstance(value, str) and "sleep(" in value and "\n" in value


def long_sleeps(source: str, first_line: int = 1) -> list[tuple[int, str]]:
    """``(line, call)`` for each sleep over ``LIMIT_S`` with no comment on its line or the
    line above; ``first_line`` is where ``source`` starts in its file (embedded scripts)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []  # a string constant that only looks like code
    comments = _comment_lines(source)
    constants = _constants(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in _SLEEPS and node.args:
            seconds = _seconds(node.args[0], constants)
            said = comments & {node.lineno, node.lineno - 1}
            if seconds is not None and seconds > LIMIT_S and not said:
                found.append((first_line + node.lineno - 1, ast.unparse(node)))
        elif _is_script(node):
            assert isinstance(node, ast.Constant)
            found += long_sleeps(textwrap.dedent(node.value), first_line + node.lineno - 1)
    return found


def test_every_long_sleep_in_the_tests_says_what_it_waits_for() -> None:
    """Each sleep over a second under tests/ carries a comment on its line or the one above."""
    bare = [
        f"tests/{path.relative_to(REPO / 'tests')}:{line}: {call}"
        for path in sorted((REPO / "tests").rglob("*.py"))
        for line, call in long_sleeps(path.read_text())
    ]
    assert bare == [], (
        f"sleeps over {LIMIT_S:g} s without a comment saying what they wait for (add one, or "
        "poll the condition with a deadline instead):\n" + "\n".join(bare)
    )


def test_the_scanner_finds_a_planted_bare_sleep() -> None:
    """The rule can fail: a bare long sleep is found at its line, in code, through a
    module constant, and inside a script kept in a string; short or commented ones pass."""
    # Spelled NAP here and replaced, so that this file's own scan does not find them.
    planted = textwrap.dedent(
        '''\
        import time
        from time import NAP
        WAIT = 5
        time.NAP(0.5)
        time.NAP(2)
        time.NAP(3)  # the server's restart
        # the lease running out
        time.NAP(4.0)
        NAP(WAIT)
        SCRIPT = """
        import time
        time.NAP(30)
        """
        '''
    ).replace("NAP", "sleep")
    found = [(line, call.replace("sleep", "NAP")) for line, call in long_sleeps(planted)]
    assert found == [(5, "time.NAP(2)"), (9, "NAP(WAIT)"), (12, "time.NAP(30)")]
