"""What ups imports, a plain `pip install ups` brings: every third-party module imported
anywhere in ups/ belongs to a distribution named in pyproject.toml's [project] dependencies.

A package that only arrives because a declared one (or a dev extra) depends on it is a gap:
pathspec arrived with the dev extras and a plain install could not run `ups deploy`.
tests/test_plain_install.py installs the wheel for real; this is the quick tier's check.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _imported_top_levels() -> dict[str, set[str]]:
    """Top-level module -> the files of ups/ that import it (absolute imports only)."""
    found: dict[str, set[str]] = {}
    for path in sorted((REPO / "ups").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(str(path.relative_to(REPO)))
    return found


def _declared() -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return {
        _canonical(re.split(r"[^A-Za-z0-9._-]", d, maxsplit=1)[0]) for d in project["dependencies"]
    }


def test_every_third_party_import_of_ups_is_a_declared_dependency() -> None:
    """Each module ups imports is in the standard library, ups itself, or a distribution
    listed in [project] dependencies (not merely installed alongside one)."""
    providers = packages_distributions()
    declared = _declared()
    undeclared = {}
    for module, files in _imported_top_levels().items():
        if module in sys.stdlib_module_names or module in ("ups", "__future__"):
            continue
        dists = {_canonical(d) for d in providers.get(module, [])}
        assert dists, f"{module} (imported by {sorted(files)}) is not installed here"
        if not dists & declared:
            undeclared[module] = (sorted(dists), sorted(files))
    assert not undeclared, f"imported by ups/ but not in [project] dependencies: {undeclared}"
