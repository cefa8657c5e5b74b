"""Ctrl-C while the ``blocklin`` console script starts (importing NumPy, zarr and Dask takes a second or
more) ends like an interrupted command: one line on stderr and exit status 130, no traceback.

The script is run as pip's wrapper runs it (``from MODULE import FUNC; sys.exit(FUNC())``, the entry
point read from pyproject.toml), with SIGINT sent at a fixed point of the start by an import hook of the
test's own: when NumPy, zarr, the CLI's ui module (blocklin's package loaded) or a command's module (while
the parser is built) is first imported. Nothing in blocklin waits for it."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

WRAPPER = """
import os, signal, sys

class SigintOnImport:  # the user's Ctrl-C, at a fixed point of the start
    def find_spec(self, name, path=None, target=None):
        if name == {module!r}:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, SigintOnImport())
sys.argv = ["blocklin", "--version"]
from {entry} import {func}
sys.exit({func}())
"""


def _entry_point() -> tuple[str, str]:
    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["blocklin"]
    module, func = spec.split(":")
    return module, func


@pytest.mark.parametrize("module", ["numpy", "zarr", "blocklin.cli.ui", "blocklin.cli.svd"])
def test_ctrl_c_during_start_prints_one_line_and_exits_130(module):
    entry, func = _entry_point()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, "-c", WRAPPER.format(module=module, entry=entry, func=func)],
                       capture_output=True, text=True, env=env, timeout=120)
    err = p.stderr.strip().splitlines()
    assert p.returncode == 130 and "Traceback" not in p.stderr, (p.returncode, p.stderr[-2000:])
    assert err == ["blocklin: interrupted while starting; nothing was run"], err
    assert p.stdout == ""


def test_the_wrapper_runs_the_cli_when_not_interrupted():
    """The same wrapper with the hook on a module never imported: the command runs (its version)."""
    entry, func = _entry_point()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, "-c", WRAPPER.format(module="no.such.module", entry=entry, func=func)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0 and p.stdout.startswith("blocklin "), p.stderr[-2000:]
