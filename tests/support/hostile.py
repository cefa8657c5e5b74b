"""Helpers of the hostile-input tests: run the CLI in a subprocess under an address-space limit,
on a small tmpfs where root may mount one, and check the one-line error and what is left behind."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

#: Address space of a CLI subprocess: the interpreter, NumPy, zarr and dask take about 1 GiB of
#: virtual memory; a runaway (a block list of a 10^12-row shape) would need far more.
ADDRESS_SPACE = 3 * 2**30
#: Seconds a refused command may take: refusals come up front, before any data moves.
REFUSE_SECONDS = 60


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def run_cli(args: list[str], cwd: Path, env: dict | None = None, timeout: int = REFUSE_SECONDS) -> subprocess.CompletedProcess:
    """``blocklin ARGS --no-progress`` in a subprocess limited to :data:`ADDRESS_SPACE`."""
    (cwd / "tmp").mkdir(exist_ok=True)
    full_env = {**os.environ, "BLOCKLIN_TEMP_DIR": str(cwd / "tmp"), **(env or {})}
    return subprocess.run([sys.executable, "-m", "blocklin.cli.main", *args, "--no-progress"], cwd=cwd,
                          env=full_env, capture_output=True, text=True, timeout=timeout, preexec_fn=_limit)


def assert_refused(proc: subprocess.CompletedProcess, error: str, *patterns: str) -> str:
    """Exit code 1 and one line on stderr, ``blocklin CMD: error: ERROR: ...`` matching ``patterns``."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    assert len(lines) == 1, proc.stderr[-3000:]
    line = lines[0]
    assert f": error: {error}: " in line, line
    assert "Fix: " in line, line
    for p in patterns:
        assert p in line, (p, line)
    return line


def leftovers(*folders: Path) -> list[str]:
    """Hidden partial outputs, stray temporaries and blocklin work folders under ``folders``."""
    found = []
    for folder in folders:
        if not folder.exists():
            continue
        for name in os.listdir(folder):
            if name == "blocklin-tmp":  # the test's own temp dir (tests/conftest.py)
                found.extend(leftovers(folder / name))
            elif ".partial-" in name or name.startswith("blocklin-") or ".tmp-" in name:
                found.append(str(folder / name))
    return found


def write_zarr(path: Path, a: np.ndarray, chunks: tuple[int, int], **kw) -> Path:
    zarr.create_array(str(path), data=a, chunks=chunks, **({"compressors": None} | kw))
    return path


def declared_zarr(path: Path, shape: tuple[int, int], chunks: tuple[int, int]) -> Path:
    """A zarr array whose metadata declares ``shape`` with (almost) no chunk stored."""
    z = zarr.create_array(str(path), shape=shape, chunks=chunks, dtype="float64", fill_value=0.0, compressors=None)
    z[: chunks[0], : chunks[1]] = 1.0
    return path


def edit_metadata(path: Path, **changes) -> None:
    meta = json.loads((path / "zarr.json").read_text())
    meta.update(changes)
    (path / "zarr.json").write_text(json.dumps(meta))


@contextlib.contextmanager
def small_tmpfs(folder: Path, size: str = "20m", read_only: bool = False):
    """A tmpfs of ``size`` mounted at ``folder`` (root only; the test is skipped where mounting fails)."""
    folder.mkdir(parents=True, exist_ok=True)
    opts = f"size={size}" + (",ro" if read_only else "")
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(folder)], capture_output=True,
                              timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        pytest.skip("mount is not available")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()[:200]}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True, timeout=20)


def run_many(cases: list[list[str]], cwd: Path, env: dict | None = None) -> list[subprocess.CompletedProcess]:
    """:func:`run_cli` of several argument lists at once (each waits mostly on imports)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(lambda args: run_cli(args, cwd, env), cases))
