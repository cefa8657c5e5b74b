"""Every script in ``examples/`` runs, checks its own result, and cleans up after itself.

Scripts are discovered, so a new example is covered when it lands. Each runs in a subprocess with
``BLOCKLIN_EXAMPLE_SIZE=small`` (every example reads it and picks reduced sizes; its defaults show
out-of-core work), ``TMPDIR`` and ``BLOCKLIN_TEMP_DIR`` pointing at an empty folder and an empty
working directory; afterwards both must be empty again. Every example prints a ``check:`` line for
the verification it performs (it exits non-zero when the check fails); the table below reads the
figures each known example prints. A script whose docstring has a line ``Requires: gpu`` runs only
where a CUDA device is present.

The same runs at each example's own default size (what README.md describes, out of core) are marked
``slow``: the examples must work as a user first runs them, not only at the reduced size.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
#: Wall-clock limit for one example at the reduced size (most take 2-8 s each here; the cluster
#: example starts a cluster and an S3 server).
TIMEOUT_S = 180
#: ... and at its default size (the longest took about 2 minutes on this 2-core machine under load).
DEFAULT_TIMEOUT_S = 600
EPS64 = np.finfo(np.float64).eps


def _number(pattern: str, text: str) -> float:
    match = re.search(pattern, text)
    assert match, f"expected output matching {pattern!r}, got:\n{text}"
    return float(match.group(1))


def _gemm(out: str, small: bool) -> None:
    planned = _number(r"memory\s+peak ([\d.]+) MiB of", out)
    budget = _number(r"of ([\d.]+) MiB host budget", out)
    assert planned <= budget
    # The example's own check: the error as a fraction of Higham's rounding-error bound.
    assert _number(r"max error \S+ \(([\d.e+-]+) of the rounding-error bound\)", out) <= 1.0
    assert _number(r"cost: ([\d.]+) s", out) > 0


def _pca(out: str, small: bool) -> None:
    assert _number(r"min (0\.\d+|1\.0+), max relative residual", out) >= 0.99
    assert _number(r"cost: (\d+) passes over X", out) == 3  # 2 power iterations + 1 (Halko et al.)
    assert re.search(rf"U is Matrix \({20000 if small else 200000}, 10\)", out)


def _ridge(out: str, small: bool) -> None:
    assert _number(r"GCV chose lambda = ([\d.e+-]+)", out) > 0
    # Optimality residual of the GCV solution (scaled, see the example): order eps.
    assert _number(r"check: optimality residual .* = ([\d.e+-]+)", out) <= 100 * 200 * EPS64
    # Normal equations and QR agree to rounding error on a well-conditioned problem.
    assert _number(r"max difference to the QR solution ([\d.e+-]+)", out) < 1e-10


def _convert(out: str, small: bool) -> None:
    assert re.search(r"check: .* match the originals: True", out)
    assert re.search(r"refused: .*'oops' at line 2, column 2", out)


def _factor(out: str, small: bool) -> None:
    # Backward error of K alpha = y recomputed by the example (not the solver's own figure): order eps.
    assert _number(r"check: backward error .* = ([\d.e+-]+)", out) <= (1500 if small else 8192)**0.5 * EPS64
    assert _number(r"Cholesky: (\d+) tile tasks", out) > 1
    assert _number(r"differ by ([\d.e+-]+) \(relative\)", out) < 1e-10


def _cluster(out: str, small: bool) -> None:
    # Both of the example's checks hold, and its temp dir on the object store is left empty.
    assert len(re.findall(r"^check: .*: True$", out, re.MULTILINE)) == 2, out
    assert re.search(r"temp dir s3://\S+ left empty: True", out), out


def _power_law(out: str, small: bool) -> None:
    # Residuals recomputed by the example in its own pass over the row blocks, not the solvers' figures.
    assert re.search(r"^check: every residual <= 1e-6 .*: True$", out, re.MULTILINE), out
    assert _number(r"difference ([\d.e+-]+) \(relative\)", out) <= 1e-6
    assert _number(r"S: (\d+) x", out) == (5_000 if small else 50_000)


#: What each known example must print, beyond its ``check:`` line.
EXPECTED = {
    "gemm_out_of_core.py": _gemm,
    "pca_out_of_core.py": _pca,
    "ridge_regression.py": _ridge,
    "convert_files.py": _convert,
    "factor_kernel_matrix.py": _factor,
    "cluster_s3.py": _cluster,
    "power_law_graph.py": _power_law,
}


def _marks(script: Path) -> list:
    source = script.read_text()
    return [pytest.mark.gpu] if re.search(r"^Requires:.*\bgpu\b", source, re.MULTILINE) else []


def _run_example(script: Path, tmp_path: Path, *, small: bool) -> None:
    temp, work = tmp_path / "temp", tmp_path / "work"
    temp.mkdir()
    work.mkdir()
    env = {**os.environ, "TMPDIR": str(temp), "BLOCKLIN_TEMP_DIR": str(temp)}
    env.pop("BLOCKLIN_EXAMPLE_SIZE", None)
    if small:
        env["BLOCKLIN_EXAMPLE_SIZE"] = "small"
    proc = subprocess.run([sys.executable, str(script)], cwd=work, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S if small else DEFAULT_TIMEOUT_S)
    assert proc.returncode == 0, f"{script.name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert re.search(r"^check: ", proc.stdout, re.MULTILINE), (
        f"{script.name} must verify its result and print a 'check: ...' line; it printed:\n{proc.stdout}")
    EXPECTED.get(script.name, lambda out, small: None)(proc.stdout, small)
    left = sorted(str(p.relative_to(tmp_path)) for p in [*temp.rglob("*"), *work.rglob("*")])
    assert not left, f"{script.name} left files behind: {left[:10]}"


@pytest.mark.parametrize("script", [pytest.param(s, id=s.name, marks=_marks(s)) for s in EXAMPLES])
def test_example_runs_checks_and_cleans_up(script: Path, tmp_path: Path) -> None:
    _run_example(script, tmp_path, small=True)


@pytest.mark.slow
@pytest.mark.parametrize("script", [pytest.param(s, id=s.name, marks=_marks(s)) for s in EXAMPLES])
def test_example_runs_at_its_default_size(script: Path, tmp_path: Path) -> None:
    """As README.md invites: no size switch, the example's own (out-of-core) defaults."""
    _run_example(script, tmp_path, small=False)


def test_examples_are_found():
    assert set(EXPECTED) <= {s.name for s in EXAMPLES}


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda s: s.name)
def test_example_is_linked_from_readme_and_docs_index(script: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    index = (ROOT / "docs" / "index.md").read_text()
    assert f"(examples/{script.name})" in readme, f"link examples/{script.name} from README.md"
    assert f"(../examples/{script.name})" in index, f"link ../examples/{script.name} from docs/index.md"


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda s: s.name)
def test_example_reads_the_reduced_size_switch(script: Path) -> None:
    # The suite's time budget relies on it: defaults are sized to show out-of-core work.
    assert "BLOCKLIN_EXAMPLE_SIZE" in script.read_text(), (
        f"{script.name}: read os.environ.get('BLOCKLIN_EXAMPLE_SIZE') == 'small' and pick reduced sizes")
