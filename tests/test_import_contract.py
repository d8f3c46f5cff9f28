"""The import contract: imports only go downward, and no module of ups/ is in a circle.

The layers themselves are import-linter contracts in pyproject.toml (``lint-imports``, run
by scripts/test.sh with the other linters); this test runs them too, and adds what
import-linter has no contract for: a circle between any two modules, anywhere in ups/.
"""

from __future__ import annotations

from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]


def circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The import graph's strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in sorted(graph.find_modules_directly_imported_by(module)):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_module_of_ups_is_in_an_import_circle() -> None:
    """Every import of ups/ (function-level and TYPE_CHECKING ones included) goes one way."""
    graph = grimp.build_graph("ups", include_external_packages=False)
    assert len(graph.modules) > 100  # the whole package was read
    assert circles(graph) == []


def test_circles_are_found() -> None:
    """The circle finder itself sees a circle of three and ignores a chain."""
    graph = grimp.ImportGraph()
    for name in ("a", "b", "c", "d"):
        graph.add_module(name)
    graph.add_import(importer="a", imported="b")
    graph.add_import(importer="b", imported="c")
    graph.add_import(importer="c", imported="a")
    graph.add_import(importer="c", imported="d")
    assert circles(graph) == [["a", "b", "c"]]


def test_the_layer_contracts_are_kept() -> None:
    """``lint-imports`` passes: ups/deploy's rooms import only downward, and the trainer,
    launcher and preflight never import deploy or the command line."""
    from importlinter.cli import lint_imports

    assert lint_imports(config_filename=str(ROOT / "pyproject.toml")) == 0
