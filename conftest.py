"""Documentation tests: the code blocks of README.md and docs/*.md, and the docstring examples.

Collected by Sybil (https://sybil.readthedocs.io). Each Markdown document runs in its own empty
temporary folder (removed afterwards), with the engine's temp dir inside it:

* ``python`` blocks run in order in one namespace, in the document's folder, after the sample files
  of :data:`PYTHON_FILES` for that document are written there (small, seeded).
* Shell blocks (any fenced block with a line ``blocklin ...`` or ``$ blocklin ...``) run each in a
  fresh folder holding the samples of :data:`SHELL_FILES`. Commands run in order with bash, the
  ``blocklin`` command being this interpreter's CLI; with ``$`` prompts, the lines after a command
  are its expected output (doctest rules: ``...`` matches anything, whitespace is normalized). Lines
  whose first word is not ``blocklin`` (installing, benchmarks) are not run. A block is not run when
  it says so, visibly, in a line ``# not run: <reason>`` (a synopsis, a GPU or a cluster address).
* ``<!-- skip: next if(not gpu, reason="...") -->`` before a Python block skips it without a GPU.

Docstring ``Examples`` sections (``>>>`` with their output) in ``blocklin/`` run as doctests, each
module in its own temporary folder.

Temp dirs: for the whole session ``TMPDIR`` and ``BLOCKLIN_TEMP_DIR`` point at one folder under
pytest's own temporary tree (``<basetemp>/system-temp``), so nothing the suite runs (module
fixtures, cluster workers, subprocesses, ``tempfile``) writes to the system temp dir; tests get a
temp dir of their own on top (tests/conftest.py). ``XDG_CACHE_HOME`` (the rates cache) points
inside it too. At the end of the session every leftover that
``blocklin clean`` would find there (work folders, staged inputs, partial outputs), and every one a
test left in its own temp dir, fails the run with its path and the test that left it: a run must
remove what it made, and a test that interrupts a run on purpose cleans up what it kept. Under
pytest-xdist (``-n 2``) each worker has its own session folder and sends what it recorded to the
controller (``pytest_testnodedown``), whose session reports it and fails.
"""

from __future__ import annotations

import doctest
import gc
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from sybil import Document, Region, Sybil
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser
from sybil.parsers.rest import DocTestParser

ROOT = Path(__file__).resolve().parent
#: (test id or "session", leftover path, kind) of what blocklin left behind; filled by
#: :func:`record_leftovers`, reported (and failing the run) at the session's end.
LEFTOVERS: list[tuple[str, str, str]] = []
_TEMP_VARS = ("TMPDIR", "BLOCKLIN_TEMP_DIR")
_saved_env: dict[str, str | None] = {}
_SESSION_TEMP = pytest.StashKey[Path]()
_SYSTEM_TEMP = pytest.StashKey[tuple]()
_SYSTEM_NEW = pytest.StashKey[tuple]()


def _blocklin_entries(folder: Path) -> set[str]:
    try:
        return {name for name in os.listdir(folder) if name.startswith(("blocklin-", ".blocklin-"))}
    except OSError:
        return set()


def record_leftovers(where: str, folder: Path, *, work_only: bool = False) -> None:
    """Record under ``where`` what ``blocklin clean`` finds at or directly under ``folder``.

    ``work_only``: only work folders and staged inputs (a test's own folder may keep partial
    outputs on purpose, to test that readers refuse them; a temp dir may not).
    """
    from blocklin.storage.cleanup import find_leftovers

    if not folder.is_dir():
        return
    for item in find_leftovers([str(folder)], sizes=False):
        if not work_only or item.kind == "work folder":
            LEFTOVERS.append((where, item.path, item.kind))


@pytest.fixture(scope="session", name="record_leftovers")
def _record_leftovers_fixture():
    """:func:`record_leftovers`, for the tests' conftest (which cannot import this one by name)."""
    return record_leftovers


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    # after pytest's tmpdir plugin: its base folder is chosen before TMPDIR moves inside it
    folder = config._tmp_path_factory.mktemp("system-temp", numbered=False)
    config.stash[_SESSION_TEMP] = folder
    config.stash[_SYSTEM_TEMP] = (Path(tempfile.gettempdir()), _blocklin_entries(Path(tempfile.gettempdir())))
    for var in _TEMP_VARS:
        _saved_env[var] = os.environ.get(var)
        os.environ[var] = str(folder)
    tempfile.tempdir = None  # gettempdir() caches its answer: read TMPDIR again
    # the rates cache of `blocklin calibrate` (blocklin/plan/rates.py): the session's own, so that
    # `--explain` in the documents prints the default rates whatever this machine has measured
    _saved_env["XDG_CACHE_HOME"] = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(folder / "cache")


def pytest_unconfigure(config):
    for var, value in _saved_env.items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value
    tempfile.tempdir = None


def pytest_sessionfinish(session, exitstatus):
    folder = session.config.stash.get(_SESSION_TEMP, None)
    if folder is None:
        return
    record_leftovers("session", folder)
    system, before = session.config.stash[_SYSTEM_TEMP]
    session.config.stash[_SYSTEM_NEW] = (system, sorted(_blocklin_entries(system) - before))
    # A document's examples run shell commands whose children may outlive them under load; what they
    # leave in the document's own folder (removed with it) is reported, not failed, until it is traced.
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # a pytest-xdist worker: the controller reports and fails the run (its
        # system temp dir is the controller's session folder, inherited: the controller checks the real one)
        workeroutput["blocklin_leftovers"] = list(LEFTOVERS)
        return
    if any(not where.startswith("examples of ") for where, _path, _kind in LEFTOVERS) and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist's controller: take what a worker's session recorded (its exit status is not the run's)."""
    output = getattr(node, "workeroutput", None) or {}
    LEFTOVERS.extend(tuple(item) for item in output.get("blocklin_leftovers", ()))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if LEFTOVERS:
        terminalreporter.section("blocklin leftovers", sep="=", red=True, bold=True)
        terminalreporter.line("runs left these behind (remove them in the test, or fix the run that leaves them):")
        for where, path, kind in LEFTOVERS:
            terminalreporter.line(f"  {where}: {kind} {path}")
    system, new = config.stash.get(_SYSTEM_NEW, (None, []))
    if new:  # another process on the machine may have made them: a warning, not a failure
        terminalreporter.section("blocklin entries new in the system temp dir", sep="-", yellow=True)
        terminalreporter.line(f"{len(new)} new blocklin-* entries in {system} during the session "
                              f"(the suite writes to {config.stash[_SESSION_TEMP]}): {', '.join(new[:10])}"
                              f"{' ...' if len(new) > 10 else ''}")
SHELL_LANGUAGES = {"", "bash", "sh", "shell", "console", "text"}
FENCE = re.compile(r"^```(?P<lang>[\w-]*)[ \t]*\n(?P<body>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
CHECKER = doctest.OutputChecker()
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


# Sample files, small and seeded: what the documents' examples read.

def _zarr(folder: Path, name: str, data: np.ndarray, chunks: tuple[int, int]) -> None:
    import blocklin as bl

    bl.from_array(data, folder / name, chunks=chunks)


def _normal(shape: tuple[int, int], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape)


def _square(folder: Path, name: str, seed: int) -> None:
    _zarr(folder, name, _normal((600, 600), seed), (256, 256))


def _symmetric(folder: Path, name: str) -> None:
    x = _normal((600, 600), 3)
    _zarr(folder, name, (x + x.T) / 2, (256, 256))


def _spd(folder: Path, name: str) -> None:
    x = _normal((600, 600), 8)
    _zarr(folder, name, x @ x.T / 600 + np.eye(600), (256, 256))


def _shape_only(folder: Path, name: str, n: int) -> None:
    """An ``n x n`` store with no chunk written (all zeros): enough for plans, costs no disk."""
    from blocklin.storage.zarr_store import create_array

    create_array(folder / name, shape=(n, n), dtype="float64", chunks=(1024, 1024))


def _coordinate(path: Path) -> None:
    """A 2000 x 1000 coordinate Matrix Market file of 20000 integer entries (some duplicated)."""
    rng = np.random.default_rng(8)
    r, c, v = rng.integers(1, 2001, 20000), rng.integers(1, 1001, 20000), rng.integers(-9, 10, 20000)
    path.write_text("%%MatrixMarket matrix coordinate integer general\n2000 1000 20000\n"
                    + "".join(f"{a} {b} {d}\n" for a, b, d in zip(r.tolist(), c.tolist(), v.tolist())))


SAMPLES = {
    "A.zarr": lambda f: _square(f, "A.zarr", 1),
    "B.zarr": lambda f: _square(f, "B.zarr", 2),
    "S.zarr": lambda f: _symmetric(f, "S.zarr"),
    "P.zarr": lambda f: _spd(f, "P.zarr"),
    "b.zarr": lambda f: _zarr(f, "b.zarr", _normal((600, 1), 4), (256, 1)),
    "A.npy": lambda f: np.save(f / "A.npy", _normal((1000, 700), 5)),
    "data.bin": lambda f: (f / "data.bin").write_bytes(b"\0" * 128 + _normal((2000, 1000), 6).tobytes(order="F")),
    "table.csv": lambda f: np.savetxt(f / "table.csv", _normal((50, 4), 7), delimiter=";", header="w;x;y;z",
                                      comments=""),
    "A8192.zarr": lambda f: _shape_only(f, "A.zarr", 8192),
    "sparse.mtx": lambda f: _coordinate(f / "sparse.mtx"),
    "B8192.zarr": lambda f: _shape_only(f, "B.zarr", 8192),
}
DEFAULT_FILES = ("A.zarr", "B.zarr", "S.zarr", "b.zarr")
#: Samples written in a document's folder before its Python blocks run (default: DEFAULT_FILES).
PYTHON_FILES = {"README.md": (), "docs/convert.md": ("A.npy",), "docs/engine.md": ("A.zarr",),
                "docs/factor.md": ("P.zarr", "b.zarr", "A.zarr"), "docs/sparse.md": ("sparse.mtx",)}
#: Samples written in each shell block's folder (default: DEFAULT_FILES).
SHELL_FILES = {
    "README.md": ("A.zarr", "B.zarr"),
    "docs/convert.md": ("A.npy", "data.bin", "table.csv"),
    "docs/cluster.md": ("A.npy",),
    "docs/gemm.md": ("A8192.zarr", "B8192.zarr"),
    "docs/factor.md": ("P.zarr", "b.zarr", "A.zarr"),
    "docs/sparse.md": ("sparse.mtx",),
}


def _write_samples(folder: Path, names: tuple[str, ...]) -> None:
    for name in names:
        SAMPLES[name](folder)


def _doc_key(path: str | Path) -> str:
    return Path(path).resolve().relative_to(ROOT).as_posix()


# Markdown documents: one temporary folder each.

def _gpu() -> bool:
    from blocklin.device import gpu_available

    return gpu_available()


def _enter_folder(namespace: dict, files: tuple[str, ...]) -> None:
    import blocklin

    folder = Path(tempfile.mkdtemp(prefix="blocklin-doc-"))
    (folder / "temp").mkdir()
    namespace["_doc"] = {"folder": folder, "cwd": os.getcwd(), "env": os.environ.get("BLOCKLIN_TEMP_DIR"),
                         "shells": 0, "name": _doc_key(namespace["__file__"]) if namespace.get("__file__") else "a document"}
    os.environ["BLOCKLIN_TEMP_DIR"] = str(folder / "temp")
    blocklin.config.reset()
    os.chdir(folder)
    namespace["gpu"] = _gpu()
    _write_samples(folder, files)


def _leave_folder(namespace: dict) -> None:
    import blocklin

    state = namespace.pop("_doc")
    # The document's program has ended: its objects go, as at a script's exit, so that what blocklin
    # removes when a handle is collected (a LinearOperator's staged inputs) is removed before the check.
    for name in [k for k in namespace if not k.startswith("__")]:
        del namespace[name]
    gc.collect()
    os.chdir(state["cwd"])
    if state["env"] is None:
        os.environ.pop("BLOCKLIN_TEMP_DIR", None)
    else:
        os.environ["BLOCKLIN_TEMP_DIR"] = state["env"]
    blocklin.config.reset()
    record_leftovers(f"examples of {state['name']}", state["folder"] / "temp")
    shutil.rmtree(state["folder"], ignore_errors=True)


def _markdown_setup(namespace: dict) -> None:
    key = _doc_key(namespace["__file__"])
    _enter_folder(namespace, PYTHON_FILES.get(key, DEFAULT_FILES))


# Shell blocks.

def _commands(body: str) -> tuple[list[tuple[str, str | None]], str | None]:
    """(command, expected output or None) pairs of a block, and its ``# not run:`` reason if any."""
    reason = next((m.group(1).strip() for m in re.finditer(r"^#\s*not run:?\s*(.*)$", body, re.MULTILINE)), None)
    lines = body.splitlines()
    prompted = any(line.startswith("$ ") for line in lines)
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if prompted and not line.startswith("$ "):
            continue
        cmd = line[2:] if prompted else line
        while cmd.endswith("\\") and i < len(lines):  # continuation lines
            cmd = cmd[:-1] + " " + lines[i].strip()
            i += 1
        expected = None
        if prompted:
            got = []
            while i < len(lines) and not lines[i].startswith("$ "):
                got.append(lines[i])
                i += 1
            expected = "\n".join(got).strip("\n") or None
        if cmd.split(maxsplit=1)[:1] == ["blocklin"]:
            out.append((cmd, expected))
    return out, reason


def _shell_evaluator(example) -> str | None:
    commands, reason = example.parsed
    if reason:
        raise pytest.skip.Exception(f"not run: {reason}")
    state = example.namespace["_doc"]
    state["shells"] += 1
    folder = state["folder"] / f"shell-{state['shells']}"
    folder.mkdir()
    _write_samples(folder, SHELL_FILES.get(_doc_key(example.path), DEFAULT_FILES))
    bindir = state["folder"] / "bin"
    if not bindir.exists():
        bindir.mkdir()
        (bindir / "blocklin").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m blocklin.cli.main "$@"\n')
        (bindir / "blocklin").chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
           "BLOCKLIN_TEMP_DIR": str(state["folder"] / "temp"), "COLUMNS": "100"}
    for cmd, expected in commands:
        proc = subprocess.run(["bash", "-c", cmd], cwd=folder, env=env, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            return f"`{cmd}` exited with {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        if expected is not None and not CHECKER.check_output(expected + "\n", proc.stdout, FLAGS):
            return f"`{cmd}` printed:\n{proc.stdout}\nexpected (doctest rules):\n{expected}"
    return None


def _shell_parser(document) -> list[Region]:
    regions = []
    for m in FENCE.finditer(document.text):
        if m.group("lang") not in SHELL_LANGUAGES:
            continue
        commands, reason = _commands(m.group("body"))
        mentions = re.search(r"^(\$ )?blocklin ", m.group("body"), re.MULTILINE)
        if mentions:
            regions.append(Region(m.start(), m.end(), (commands, reason), _shell_evaluator))
    return regions


class MarkdownDocument(Document):
    """A Markdown document whose namespace knows its path (for the per-document samples)."""

    def __init__(self, text: str, path: str) -> None:
        super().__init__(text, path)
        self.namespace["__file__"] = path


markdown = Sybil(
    parsers=[PythonCodeBlockParser(), _shell_parser, SkipParser()],
    document_types={".md": MarkdownDocument},
    patterns=["README.md", "docs/*.md"],
    setup=_markdown_setup,
    teardown=_leave_folder,
    name="docs",
)


# Docstrings.

def _docstring_setup(namespace: dict) -> None:
    _enter_folder(namespace, ())
    namespace["np"] = np


docstrings = Sybil(
    parsers=[DocTestParser(optionflags=FLAGS)],
    patterns=["blocklin/**/*.py"],
    setup=_docstring_setup,
    teardown=_leave_folder,
    name="docstrings",
)

pytest_collect_file = (markdown + docstrings).pytest()
