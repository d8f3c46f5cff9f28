"""Fail when ruff or mypy would silently skip part of the project.

ruff's default ``exclude`` holds names such as ``dist`` and ``build``, and mypy checks
only the packages listed in pyproject.toml: a package named or placed wrongly would be
skipped without a word (``ups/dist`` was, for a whole round). This compares what each
tool actually reads against the project's files:

* ruff must read every Python file git knows (tracked, or new and not ignored);
* mypy must check every module of every package the project installs (those that
  ``[tool.setuptools.packages.find] include`` matches), so a new package fails here
  until it is added to ``[tool.mypy] packages``.

Run from the repository root: ``python scripts/lint_coverage.py`` (``make test`` does).
"""

from __future__ import annotations

import fnmatch
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

BIN = Path(sys.executable).parent


def project_files() -> set[Path]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return {Path(line).resolve() for line in out.splitlines() if Path(line).exists()}


def ruff_files() -> set[Path]:
    out = subprocess.run(
        [BIN / "ruff", "check", "--show-files", "."], check=True, capture_output=True, text=True
    ).stdout
    return {Path(line.strip()).resolve() for line in out.splitlines() if line.strip()}


def mypy_modules() -> set[str]:
    with tempfile.TemporaryDirectory() as report:
        subprocess.run([BIN / "mypy", "--linecount-report", report], capture_output=True, text=True)
        lines = (Path(report) / "linecount.txt").read_text().splitlines()
    return {line.split()[-1] for line in lines[1:] if line.strip()}


def package_modules(files: set[Path]) -> set[str]:
    root = Path.cwd().resolve()
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    modules = set()
    for path in files:
        parts = list(path.relative_to(root).with_suffix("").parts)
        if not (root / parts[0] / "__init__.py").exists():
            continue
        if parts[-1] == "__init__":
            parts.pop()
        module = ".".join(parts)
        if any(fnmatch.fnmatch(module, pattern) for pattern in include):
            modules.add(module)
    return modules


def main() -> int:
    files = project_files()
    problems = []
    skipped_by_ruff = sorted(files - ruff_files())
    if skipped_by_ruff:
        problems.append(
            "ruff skips these files (its exclude list or a bad name hides them; rename the "
            "directory or set [tool.ruff] extend-include):\n  "
            + "\n  ".join(str(p.relative_to(Path.cwd().resolve())) for p in skipped_by_ruff)
        )
    skipped_by_mypy = sorted(package_modules(files) - mypy_modules())
    if skipped_by_mypy:
        problems.append(
            "mypy does not check these modules (add their package to [tool.mypy] packages "
            "in pyproject.toml):\n  " + "\n  ".join(skipped_by_mypy)
        )
    for problem in problems:
        print(f"lint coverage: {problem}", file=sys.stderr)
    if not problems:
        print(f"lint coverage: ruff reads all {len(files)} Python files; mypy checks every package")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
