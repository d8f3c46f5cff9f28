"""The repository's scripts (scripts/*.py, named with dashes) as modules, for the tests
that use their functions: the docs' captures, reference pages and message scan."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def script(name: str) -> ModuleType:
    """``scripts/<name>.py`` as a module, loaded once."""
    module_name = f"scripts_{name.replace('-', '_')}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, REPO / f"scripts/{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def captures() -> ModuleType:
    """scripts/captures.py: where each capture is, and its check."""
    return script("captures")
