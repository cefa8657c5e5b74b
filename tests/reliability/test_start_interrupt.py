"""Ctrl-C while the ``blocklin`` console script starts (importing NumPy, zarr and Dask takes a second or
more) ends like an interrupted command: one line on stderr and exit status 130, no traceback. Ctrl-C
once the command is done, while the interpreter shuts down, ends it with the command's status.

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


AT_EXIT = """
import atexit, os, signal, sys
sys.argv = ["blocklin", "convert", {npy!r}, {out!r}, "--no-progress"]
from {entry} import {func}
atexit.register(lambda: os.kill(os.getpid(), signal.SIGINT))  # the user's Ctrl-C, as the interpreter shuts down
sys.exit({func}())
"""


def test_ctrl_c_after_the_command_is_done_keeps_its_status(tmp_path):
    """A Ctrl-C after the output was committed and the summary printed, while Python joins the I/O
    threads at exit, had printed a KeyboardInterrupt traceback (or ended the process by SIGINT, status
    -2, with no line). The run is complete: it ends with status 0, its summary, and no traceback."""
    import numpy as np

    entry, func = _entry_point()
    np.save(tmp_path / "a.npy", np.arange(12.0).reshape(3, 4))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    code = AT_EXIT.format(npy=str(tmp_path / "a.npy"), out=str(tmp_path / "a.zarr"), entry=entry, func=func)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0 and "Traceback" not in p.stderr and "KeyboardInterrupt" not in p.stderr, \
        (p.returncode, p.stderr[-2000:])
    assert p.stdout.startswith("wrote ") and (tmp_path / "a.zarr" / "zarr.json").exists(), p.stdout
