"""The repository's scripts (benchmarks) loaded as modules by path, for their quick-run tests."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_script(relative: str, name: str) -> ModuleType:
    """The script at ``ROOT / relative`` imported as module ``name`` (not installed: loaded by path)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
