"""Running the CLI's output commands in a subprocess and interrupting them at a chosen point.

Shared by the interrupt tests (``tests/reliability/test_signals.py``), the resume-after-changed-input
tests and the decoded-chunk interrupt tests: each command's argv on small matrices, the subprocess
that runs it slowly (``slow_cli.py``), the wait for a point of the run, and what a run left behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import zarr

from blocklin.cli.main import build_parser

SUPPORT = Path(__file__).resolve().parents[1] / "support"
N = 240
#: argv of each command (OUT is replaced by the output path), and whether it takes --resume
COMMANDS = {
    "gemm": ["gemm", "A.zarr", "A.zarr", "-o", "OUT", "--memory", "256KiB"],
    "convert": ["convert", "A.npy", "OUT", "--memory", "256KiB", "--chunks", "40,40"],
    "svd": ["svd", "A.zarr", "-k", "4", "-o", "OUT", "--memory", "1MiB", "--seed", "1"],
    "inv": ["inv", "A.zarr", "-o", "OUT", "--memory", "1MiB"],
    "solve": ["solve", "A.zarr", "B.zarr", "-o", "OUT", "--memory", "4MiB"],  # square: LU, refinement
    "solve-pos": ["solve", "S.zarr", "B.zarr", "-o", "OUT", "--memory", "1MiB", "--assume-a", "pos"],  # Cholesky
    # lam > 0 with the Gram matrix over the budget: SYRK and Cholesky tiles, refinement, out of core
    "solve-gram": ["solve", "A.zarr", "B.zarr", "-o", "OUT", "--memory", "1MiB", "--lambda", "1"],
    "cholesky": ["factor", "cholesky", "S.zarr", "-o", "OUT", "--memory", "1MiB"],
    "lu": ["factor", "lu", "A.zarr", "-o", "OUT", "--memory", "1MiB"],
    "qr": ["factor", "qr", "A.zarr", "-o", "OUT", "--memory", "1MiB", "--method", "tiled"],
    "gram": ["gram", "A.zarr", "-o", "OUT", "--memory", "256KiB"],
    "pca": ["pca", "A.zarr", "-k", "4", "-o", "OUT", "--memory", "768KiB", "--seed", "1"],
    "eigs": ["eigs", "S.zarr", "-k", "3", "-o", "OUT", "--memory", "768KiB", "--seed", "1"],
    "qr-tiles": ["factor", "qr", "A.zarr", "-o", "OUT", "--memory", "1MiB", "--method", "tiles"],
}
def takes_resume(argv: list[str]) -> bool:
    return "resume" in vars(build_parser().parse_args(cli_argv(argv, "X", "T")))


def cli_argv(base: list[str], out: str, tmp: str, *extra: str) -> list[str]:
    return [out if a == "OUT" else a for a in base] + ["--temp-dir", tmp, "--no-progress", *extra]


def load_output(path: Path) -> dict[str, np.ndarray]:
    node = zarr.open(str(path), mode="r")
    if isinstance(node, zarr.Array):
        return {"": node[...]}
    return {k: v[...] for k, v in node.arrays()}


def leftovers(data: Path) -> list[str]:
    here = [f for f in os.listdir(data) if ".partial-" in f or ".old-" in f]
    return sorted(here + [f"tmp/{f}" for f in os.listdir(data / "tmp")])


def backdate(folders: tuple, when: float) -> None:
    """Set the times of each folder and everything in it to ``when``: leftovers of a run gone that
    long, which ``blocklin clean`` judges by their age."""
    for folder in folders:
        for root, dirs, files in os.walk(folder):
            for f in dirs + files:
                os.utime(os.path.join(root, f), (when, when))
        os.utime(folder, (when, when))


def reached(point: str, data: Path, out: str) -> bool:
    if point == "mid":
        return (data / f"{out}.mark").exists()
    return (any(f.startswith(f".{out}.partial-") for f in os.listdir(data))
            or any(f.startswith("blocklin-") for f in os.listdir(data / "tmp")))  # not a file of the user's


def interrupt(data: Path, argv: list[str], sig: str, point: str, out: str) -> subprocess.CompletedProcess:
    """Run ``argv`` through ``slow_cli.py`` and send ``sig`` at ``point``: ``"start"``, once its partial output
    or work folder exists; ``"mid"``, as a streamed item starts after the second one and, for local data,
    after that (a read-only pass before the output is claimed, as the inverse's equilibration scan, streams
    items before anything is written; an object-store output's claim is not seen here)."""
    env = {**os.environ, "BLOCKLIN_TEST_DELAY": "0.05", "BLOCKLIN_TEST_MARK": str(data / f"{out}.mark")}
    proc = subprocess.Popen([sys.executable, str(SUPPORT / "slow_cli.py"), *argv], cwd=data, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    local = not any("://" in a for a in argv)
    for step in (("start", "mid") if point == "mid" and local else (point,)):
        if step == "mid":  # the mark touched again: an item that started after the run wrote its first store
            (data / f"{out}.mark").unlink(missing_ok=True)
        while not reached(step, data, out):
            assert proc.poll() is None, f"finished before {step}: {proc.communicate()}"
            assert time.time() < deadline, f"{step} not reached"
            time.sleep(0.002)
    proc.send_signal(getattr(signal, sig))
    stdout, stderr = proc.communicate(timeout=120)
    (data / f"{out}.mark").unlink(missing_ok=True)
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


def interrupt_after(monkeypatch, module, name: str, n: int) -> None:
    """``module.name`` raises KeyboardInterrupt (as Ctrl-C does) on its call after the ``n``-th."""
    real, seen = getattr(module, name), [0]

    def dying(*args, **kwargs):
        seen[0] += 1
        if seen[0] > n:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, dying)


def tree_bytes(path) -> dict:
    """Every file below ``path`` (relative path -> bytes): what a refused run must leave as it was."""
    out = {}
    for root, _dirs, files in os.walk(path):
        for name in files:
            p = os.path.join(root, name)
            with open(p, "rb") as f:
                out[os.path.relpath(p, path)] = f.read()
    return out

