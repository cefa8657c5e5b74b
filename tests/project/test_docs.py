"""The documentation-test machinery (the root ``conftest.py``) itself: it must be able to fail.

The Markdown blocks and docstring examples are collected from README.md, docs/ and blocklin/ by
Sybil; these tests check the shell-block reader and runner on blocks written here, and that every
document with code is collected.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def docs_conftest():
    spec = importlib.util.spec_from_file_location("blocklin_docs_conftest", ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_prompted_block_pairs_commands_with_output(docs_conftest):
    body = "$ blocklin info A.zarr\nA.zarr\n  shape  3 x 3\n$ ls\nA.zarr\n$ blocklin demo \\\n  --size 64\n"
    commands, reason = docs_conftest._commands(body)
    assert reason is None
    assert commands == [("blocklin info A.zarr", "A.zarr\n  shape  3 x 3"), ("blocklin demo  --size 64", None)]


def test_plain_block_runs_only_blocklin_lines_and_reads_the_reason(docs_conftest):
    body = "python benchmarks/gemm.py --n 8\nblocklin gemm A B -o C  # the product\n"
    commands, reason = docs_conftest._commands(body)
    assert commands == [("blocklin gemm A B -o C  # the product", None)] and reason is None
    _, reason = docs_conftest._commands("# not run: needs a GPU\nblocklin gemm A B -o C --device gpu\n")
    assert reason == "needs a GPU"


def _example(docs_conftest, body: str, path: Path):
    commands = docs_conftest._commands(body)
    namespace: dict = {}
    docs_conftest._enter_folder(namespace, ())
    return SimpleNamespace(parsed=commands, namespace=namespace, path=str(path))


def test_shell_runner_compares_output_and_exit_status(docs_conftest, tmp_path):
    path = ROOT / "docs" / "not-a-doc.md"  # unknown documents get the default samples
    cases = {
        "$ blocklin --version\nblocklin ...\n": None,                   # matches (ELLIPSIS)
        "$ blocklin --version\nsomething else\n": "printed",            # wrong output
        "$ blocklin info missing.zarr\n": "exited with 1",              # failing command
    }
    for body, failure in cases.items():
        ex = _example(docs_conftest, body, path)
        try:
            result = docs_conftest._shell_evaluator(ex)
        finally:
            docs_conftest._leave_folder(ex.namespace)
        if failure is None:
            assert result is None, result
        else:
            assert result is not None and failure in result, result


def test_every_document_with_code_is_collected():
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "README.md", "docs"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    collected = {line.split("::")[0] for line in proc.stdout.splitlines() if "::sybil:" in line}
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text()
        has_code = re.search(r"^```python", text, re.MULTILINE) or re.search(r"^(\$ )?blocklin ", text, re.MULTILINE)
        if has_code:
            assert doc.relative_to(ROOT).as_posix() in collected, f"{doc.name} has code but no collected example"
