"""The docs' reference pages are the code's own tables, never kept by hand.

docs/reference/*.md are written by scripts/docs-reference.py from the argparse parsers,
the fab tasks, the pydantic models, ``ups.exitcodes`` and ``ups.scriptenv``; these tests
fail when a committed page is stale, when a config key has no description, when an exit
code is defined outside the one table, and when a run's ranks get a variable the
environment page does not describe.
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import ModuleType

import pytest
from pydantic import BaseModel

from tests.repo_scripts import script
from ups import ckpt, exitcodes, scriptenv, workload
from ups.launch.plan import LaunchRequest, build_plan
from ups.launch.scriptrun import with_resume

REPO = Path(__file__).resolve().parents[1]


def generator() -> ModuleType:
    return script("docs-reference")


def test_committed_reference_pages_are_what_the_code_gives() -> None:
    """Each page under docs/reference/ equals what the generator writes from the code now
    (a help text, a default, a docstring or an exit code changed without the page fails)."""
    stale = generator().stale()
    assert not stale, (
        f"docs/reference/{', '.join(stale)} differ from the code: run "
        "`.venv/bin/python scripts/docs-reference.py` and commit docs/reference/"
    )


def test_a_key_without_a_description_stops_the_generator() -> None:
    """Every key a user can write is documented under its field: a model with an
    undocumented field is refused, naming it."""

    class Documented(BaseModel):
        size: int = 1
        """How big."""
        colour: str = "red"

    with pytest.raises(SystemExit, match=r"Documented\.colour has no description"):
        generator().model_rows(Documented)


def _exit_literals(source: str, where: str) -> list[str]:
    """``EXIT_X = <int>`` or ``exit_code = <int>`` assignments in one module's source."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Assign) or not isinstance(node.value, ast.Constant):
            continue
        names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        names += [t.attr for t in node.targets if isinstance(t, ast.Attribute)]
        if isinstance(node.value.value, int) and any(
            n.startswith("EXIT_") or n == "exit_code" for n in names
        ):
            found.append(f"{where}:{node.lineno} {names[0]}")
    return found


def test_exit_codes_are_defined_in_one_table() -> None:
    """No module outside ups/exitcodes.py gives an exit code a number of its own: each takes
    it from the table the exit-code page is generated from."""
    own = [
        hit
        for path in sorted((REPO / "ups").rglob("*.py"))
        if path.name != "exitcodes.py"
        for hit in _exit_literals(path.read_text(), str(path.relative_to(REPO)))
    ]
    assert not own, f"exit codes outside ups/exitcodes.py (take them from there): {own}"
    codes = [entry.code for entry in exitcodes.TABLE]
    assert len(codes) == len(set(codes)), "two entries of ups.exitcodes.TABLE share a code"


def test_the_exit_code_scan_finds_both_forms() -> None:
    """The scan above finds a module constant and a class attribute (it can fail)."""
    source = "EXIT_X = 9\n\n\nclass E(Exception):\n    exit_code = 9\n"
    assert _exit_literals(source, "m.py") == ["m.py:1 EXIT_X", "m.py:5 exit_code"]


@pytest.mark.parametrize("gpus", [0, 2])
def test_a_script_run_gets_only_the_variables_the_environment_page_lists(
    tmp_path: Path, gpus: int
) -> None:
    """A real launch plan of a script (on a CPU host and a GPU host), with its resume
    checkpoint and attempt number, sets no variable that ``ups.scriptenv`` does not
    describe, and every ups variable it describes for such a run is set."""
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    req = LaunchRequest(script=str(script), output_dir=str(tmp_path / "runs"), run_id="r1")
    plan = build_plan(req, None, gpu_count=gpus, pick_port=lambda p: p, environ={})
    plan, _ = with_resume(plan)
    env = {**plan.env, scriptenv.ATTEMPT.name: "1"}
    unknown = sorted(set(env) - set(scriptenv.BY_NAME))
    assert not unknown, f"set for a run's ranks but not in ups/scriptenv.py: {unknown}"
    hosts = "GPU hosts" if gpus else "CPU hosts"
    expected = {
        v.name
        for v in scriptenv.TABLE
        if v.set_by == "ups" and v.when in ("every run", "a script's run", hosts)
    }
    assert expected <= set(env), f"described but not set: {sorted(expected - set(env))}"


def test_the_checkpoint_contract_names_are_the_environment_pages() -> None:
    """ups.ckpt (copyable, standard library only) and the environment table name the same
    variables, and a run file may not pass any UPS_ variable of it as a secret."""
    assert scriptenv.CHECKPOINT_DIR.name == ckpt.ENV_DIR
    assert scriptenv.RESUME.name == ckpt.ENV_RESUME
    assert scriptenv.RUN_ID.name == ckpt.ENV_RUN_ID
    assert set(workload.RESERVED_ENV) == {
        v.name for v in scriptenv.TABLE if v.name.startswith("UPS_")
    }
