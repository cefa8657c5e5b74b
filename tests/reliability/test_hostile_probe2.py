"""Second hostile probe: complex data refused or right, runaways refused, tracebacks become one line.

Each test reproduces one finding (the command or call that misbehaved) and checks the fix: a right
result (against NumPy) or a clear error naming the parameter, the rule, the actual value and a fix.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import blocklin as bl
from blocklin.cli import ui
from blocklin.cli.main import main
from blocklin.errors import (BudgetError, ConfigError, DTypeError, ParameterError, StorageUnreachableError,
                             StoreNotFoundError)

from support.s3server import s3, s3_server  # noqa: F401 - pytest fixtures

SUPPORT = Path(__file__).resolve().parents[1] / "support"
MEM = "64MiB"
#: An error line of the CLI: ``blocklin CMD: error: ...`` (argparse's and blocklin's own).
ERROR_LINE = "blocklin"


def _cli(argv: list[str], timeout: float = 120, stdin=None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "blocklin.cli.main", *argv], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, stdin=stdin)


def _one_error_line(stderr: str, *words: str) -> str:
    """The one ``blocklin ...: error:`` line of ``stderr`` (no traceback), holding each of ``words``."""
    assert "Traceback" not in stderr, stderr
    lines = [ln for ln in stderr.splitlines() if ln.startswith("blocklin") and ": error:" in ln]
    assert len(lines) == 1, stderr
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def _rand(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


# ---------------------------------------------------------------- complex data


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_gemm_same_operand_transposed_is_the_plain_transpose_product_for_complex(tmp_path, dtype):
    """``gemm Z Z --trans-a`` once took the Gram (SYRK) shortcut and dropped the imaginary parts."""
    z = _rand((60, 40), dtype)
    path = str(tmp_path / "Z.zarr")
    bl.from_array(z, path)
    r = _cli(["gemm", path, path, "-o", str(tmp_path / "C.zarr"), "--trans-a", "--memory", MEM, "--json"])
    assert r.returncode == 0, r.stderr
    got = bl.open(str(tmp_path / "C.zarr")).to_numpy()
    ref = z.astype(np.complex128).T @ z.astype(np.complex128)  # numpy's a.T @ a: no conjugation
    # A product's norm-wise error is at most k eps ||A|| ||B|| (k = 60 terms; factor 4 for complex
    # multiply-adds and the blocked summation order).
    eps = np.finfo(dtype).eps
    assert got.dtype == dtype
    assert np.linalg.norm(got - ref) <= 4 * 60 * eps * np.linalg.norm(z) ** 2
    assert json.loads(r.stdout).get("route", "gemm") != "gram"


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_every_operation_refuses_complex_or_is_right(tmp_path, dtype):
    """Each public operation either takes complex and is right, or raises DTypeError with the recipe."""
    z = _rand((50, 30), dtype)
    s = z.conj().T @ z + 30 * np.eye(30, dtype=dtype)
    Z, S = bl.from_array(z, str(tmp_path / "z.zarr")), bl.from_array(s, str(tmp_path / "s.zarr"))
    refusing = {
        "gram dtype=float64": lambda: bl.gram(Z, dtype="float64", memory=MEM),
        "matmul dtype=float64": lambda: bl.matmul(Z, Z, trans_a=True, dtype="float64", memory=MEM),
    }
    for name, call in refusing.items():
        with pytest.raises(DTypeError) as info:
            call()
        msg = str(info.value)
        assert np.dtype(dtype).name in msg and "Fix:" in msg, (name, msg)
        assert "imaginary" in msg or "complex" in msg, (name, msg)
        assert "convert --dtype float64" not in msg, (name, msg)  # that cast would drop the imaginary parts
    # the ones that take complex are right
    eps = np.finfo(dtype).eps
    c = bl.matmul(Z, S, memory=MEM).to_numpy()
    ref = z.astype(np.complex128) @ s.astype(np.complex128)
    assert np.linalg.norm(c - ref) <= 4 * 30 * eps * np.linalg.norm(z) * np.linalg.norm(s)
    # pca: blocklin's extension, the centered SVD (s^2 / (m - 1) real, within Weyl's bound at ||Z||_2)
    zc = z.astype(np.complex128) - z.astype(np.complex128).mean(axis=0)
    s0 = np.linalg.svd(zc, compute_uv=False)
    p = bl.pca(Z, None, memory=MEM)  # every component (LAPACK's SVD; a truncated one is accurate to its tol)
    b = 4 * 3 * np.sqrt(2) * 50 * eps * np.linalg.norm(z.astype(np.complex128), 2)
    assert np.all(np.abs(p.explained_variance_ - s0 ** 2 / 49) <= (2 * s0 + b) * b / 49)
    # gram is A^H A (HERK; tests/products/test_complex_gram.py checks it in depth): Hermitian, its diagonal
    # real, within 3 sqrt(2) times the real Gram bound 2 m eps ||A||^2
    g = bl.gram(Z, memory=MEM).to_numpy()
    assert np.array_equal(g, g.conj().T) and not np.diagonal(g).imag.any()
    ref = z.astype(np.complex128).conj().T @ z.astype(np.complex128)
    assert np.linalg.norm(g - ref) <= 3 * np.sqrt(2) * 2 * 50 * eps * np.linalg.norm(z) ** 2
    # qr: A = Q R, Q^H Q = I, R's diagonal real and non-negative (tests/factor/test_complex_qr.py in depth);
    # Householder's bounds c n eps ||A|| and c m eps sqrt(n), times 3 sqrt(2)
    for method in ("tiled", "tiles"):
        qf, rf = bl.qr(Z, mode="reduced", method=method, memory=MEM)
        qf, rf = qf.to_numpy().astype(np.complex128), rf.to_numpy().astype(np.complex128)
        assert not np.diagonal(rf).imag.any() and (np.diagonal(rf).real >= 0).all()
        assert np.linalg.norm(z - qf @ rf) <= 3 * np.sqrt(2) * 2 * 30 * eps * np.linalg.norm(z)
        assert np.linalg.norm(qf.conj().T @ qf - np.eye(30)) <= 3 * np.sqrt(2) * 2 * 50 * eps * np.sqrt(30)
    # LU, Cholesky and the square solves take complex (tests/factor/test_complex_factors.py and
    # tests/solve/test_complex_solves.py check them in depth): here, their backward errors
    f = bl.lu(S, memory=MEM)
    perm = np.arange(30)
    for i, p in enumerate(f.report["pivots"]):
        perm[[i, p]] = perm[[p, i]]
    packed = f.to_numpy().astype(np.complex128)
    low, up = np.tril(packed, -1) + np.eye(30), np.triu(packed)
    # GEPP's backward error 2 n eps ||L|| ||U||, times 3 sqrt(2) for complex arithmetic (Higham Lemma 3.5)
    assert np.linalg.norm(s[perm] - low @ up) <= 3 * np.sqrt(2) * 2 * 30 * eps * np.linalg.norm(low) * np.linalg.norm(up)
    c = bl.cholesky(S, memory=MEM).to_numpy().astype(np.complex128)
    assert np.linalg.norm(s - c @ c.conj().T) <= 3 * np.sqrt(2) * 4 * 30 * eps * np.linalg.norm(s)
    rhs = s[:, :2].copy()
    for x in (bl.solve(S, rhs, memory=MEM), bl.solve(S, rhs, assume_a="pos", memory=MEM),
              bl.cho_solve(bl.cholesky(S, memory=MEM), rhs, memory=MEM), bl.lu_solve(f, rhs, memory=MEM)):
        xs = x.to_numpy().astype(np.complex128)
        assert np.linalg.norm(s @ xs - rhs) <= 3 * np.sqrt(2) * 4 * 30 * eps * np.linalg.norm(s) * np.linalg.norm(xs)
    # the entry-wise norms of |z| (moduli): sums of one pass, within n eps of NumPy's (row and column sums
    # of at most 50 terms, and the scaled sum of squares)
    for o in (None, 1, -1, np.inf, -np.inf):
        ref = np.linalg.norm(z.astype(np.complex128), o)
        assert abs(bl.norm(Z, o, memory=MEM) - ref) <= 4 * 50 * eps * ref, o
    # svd, eigsh (Hermitian) and the spectral norms (tests/lowrank/test_complex_svd.py and
    # test_complex_eigsh.py in depth): A = U diag(s) V^H and Weyl's bound, times 3 sqrt(2); s and w real;
    # eigsh's eigenvalues within its residual tolerance 10 sqrt(eps) max |w| (Hermitian: |w - w_ref| <= ||r||)
    z128, s128 = z.astype(np.complex128), s.astype(np.complex128)
    ref = np.linalg.svd(z128, compute_uv=False)
    res = bl.svd(Z, 30, memory=MEM)
    u, vt = res.U.to_numpy().astype(np.complex128), np.asarray(res.Vt, dtype=np.complex128)
    assert res.s.dtype == np.finfo(dtype).dtype and np.max(np.abs(res.s - ref)) <= 3 * np.sqrt(2) * 4 * 50 * eps * ref[0]
    assert np.linalg.norm(z128 - (u * res.s) @ vt) <= 3 * np.sqrt(2) * 4 * 50 * eps * np.linalg.norm(z128)
    w, _ = bl.eigsh(S, 3, order="descending", memory=MEM)
    wref = np.linalg.eigvalsh(s128)[::-1][:3]
    assert np.max(np.abs(w - wref)) <= (10 * np.sqrt(eps) + 3 * np.sqrt(2) * 4 * 30 * eps) * wref[0]
    op = bl.aslinearoperator(Z, memory=MEM)  # A x and the adjoint A^H y, streamed
    try:
        x, y = z128[:30, :2], z128[:, :2]
        assert np.linalg.norm(op.matmat(x) - z128 @ x) <= 3 * np.sqrt(2) * 2 * 30 * eps * np.linalg.norm(z) ** 2
        assert np.linalg.norm(op.rmatmat(y) - z128.conj().T @ y) <= 3 * np.sqrt(2) * 2 * 50 * eps * np.linalg.norm(z) ** 2
    finally:
        op.close()
    for o in (2, -2, "nuc"):
        ref = np.linalg.norm(s128, o)
        assert abs(bl.norm(S, o, memory=MEM) - ref) <= (10 * np.sqrt(eps) + 3 * np.sqrt(2) * 4 * 30 * 30 * eps) * ref, o
    bl.convert(str(tmp_path / "z.zarr"), str(tmp_path / "copy.zarr"))
    assert np.array_equal(bl.open(str(tmp_path / "copy.zarr")).to_numpy(), z)  # a copy: bit for bit


def test_gram_cli_takes_complex128_and_refuses_a_real_dtype(tmp_path):
    path = str(tmp_path / "z.zarr")
    z = _rand((40, 20), np.complex128)
    bl.from_array(z, path)
    r = _cli(["gram", path, "-o", str(tmp_path / "G.zarr"), "--memory", MEM])
    assert r.returncode == 0, r.stderr
    g = bl.open(str(tmp_path / "G.zarr")).to_numpy()
    assert np.linalg.norm(g - z.conj().T @ z) <= 3 * np.sqrt(2) * 2 * 40 * np.finfo(np.float64).eps * np.linalg.norm(z) ** 2
    r = _cli(["gram", path, "-o", str(tmp_path / "G64.zarr"), "--dtype", "float64", "--memory", MEM])
    assert r.returncode == ui.EXIT_ERROR
    _one_error_line(r.stderr, "DTypeError", "complex128", "float64", "Fix:")
    assert not (tmp_path / "G64.zarr").exists()


def test_integers_are_refused_with_the_conversion_by_the_products(tmp_path):
    """Products keep NumPy's integer rule and refuse (blocklin has no integer GEMM); the linalg
    operations cast as numpy.linalg does (tests/engine/test_integer_inputs.py)."""
    A = bl.from_array(np.arange(12, dtype=np.int64).reshape(4, 3), str(tmp_path / "i.zarr"))
    for call in (lambda: bl.gram(A), lambda: bl.matmul(A, A, trans_a=True)):
        with pytest.raises(DTypeError, match="int64.*Fix:.*convert"):
            call()
    assert bl.svd(A, 1).s.dtype == np.float64



def test_integers_with_a_float_dtype_are_cast_and_right(tmp_path):
    """``dtype="float64"`` on integer data is the cast NumPy makes: the Gram and the same-operand
    product are exact here (small integers, sums far below 2^53)."""
    a = np.arange(12, dtype=np.int64).reshape(4, 3)
    A = bl.from_array(a, str(tmp_path / "i.zarr"))
    ref = a.T.astype(np.float64) @ a
    assert np.array_equal(bl.gram(A, dtype="float64")[...], ref)
    assert np.array_equal(bl.matmul(A, A, trans_a=True, dtype="float64")[...], ref)


# ---------------------------------------------------------------- runaways


@pytest.fixture(scope="module")
def spd300(tmp_path_factory):
    d = tmp_path_factory.mktemp("spd")
    a = _rand((300, 300), np.float64, seed=1)
    s = a @ a.T + 300 * np.eye(300)
    bl.from_array(s, str(d / "S.zarr"))
    return d, s


@pytest.mark.parametrize("kind", ["cholesky", "lu", "qr"])
@pytest.mark.parametrize("tile", [0, -5, 5.5, "hi", True])
def test_factor_tile_must_be_a_positive_integer(spd300, kind, tile):
    d, _ = spd300
    factor = {"cholesky": bl.cholesky, "lu": bl.lu, "qr": bl.qr}[kind]
    t0 = time.monotonic()
    with pytest.raises(ParameterError, match="tile.*integer >= 1.*Fix:"):
        factor(str(d / "S.zarr"), out=str(d / f"{kind}.zarr"), tile=tile, memory=MEM)
    assert time.monotonic() - t0 < 30 and not (d / f"{kind}.zarr").exists()


@pytest.mark.parametrize("kind", ["cholesky", "lu", "qr"])
def test_factor_tiny_tiles_are_refused_by_the_task_limit(spd300, kind):
    """``--tile 1`` on 300 x 300: 4.5 million tile updates, once no answer in 300 s; refused at once."""
    from blocklin.plan.factor import MAX_TILE_UPDATES, min_tile, tile_updates

    d, _ = spd300
    method = ["--method", "tiled"] if kind == "qr" else []  # qr's default (TSQR here) has no tiles
    r = _cli(["factor", kind, str(d / "S.zarr"), "-o", str(d / f"t1{kind}.zarr"), "--tile", "1", "--memory", MEM,
              *method], timeout=60)
    assert r.returncode == ui.EXIT_ERROR
    least = min_tile(300)
    _one_error_line(r.stderr, "tile", str(MAX_TILE_UPDATES), f"--tile {least}")
    assert tile_updates(-(-300 // least)) <= MAX_TILE_UPDATES < tile_updates(-(-300 // (least - 1)))
    # the smallest accepted tile runs and is right
    f = bl.cholesky(str(d / "S.zarr"), tile=60, memory=MEM).to_numpy() if kind == "cholesky" else None
    if f is not None:
        s = d / "S.zarr"
        ref = bl.open(str(s)).to_numpy()
        # Cholesky's backward error ||L L^T - A|| <= c n eps ||A|| (Higham Thm 10.3; c = 4 with slack)
        assert np.linalg.norm(f @ f.T - ref) <= 4 * 300 * np.finfo(float).eps * np.linalg.norm(ref)


def test_tile_qr_tiny_tiles_are_refused_with_the_least_tile(spd300):
    """``factor qr --method tiles --tile 1`` on 300 x 300 plans 4.5 million tile tasks: refused at
    once naming the smallest tile side within the limit (not a memory raise, which would not help)."""
    from blocklin.plan.factor import MAX_TILE_UPDATES
    from blocklin.plan.qrtiles import plan_tile_qr, tile_tasks

    d, _ = spd300
    r = _cli(["factor", "qr", str(d / "S.zarr"), "-o", str(d / "tq1.zarr"), "--tile", "1", "--memory", MEM,
              "--method", "tiles"], timeout=60)
    assert r.returncode == ui.EXIT_ERROR and not (d / "tq1.zarr").exists()
    least = int(r.stderr.split("--tile ")[-1].split(")")[0])
    _one_error_line(r.stderr, "tile", str(MAX_TILE_UPDATES), f"--tile {least}")
    assert tile_tasks(300, 300, least) <= MAX_TILE_UPDATES < tile_tasks(300, 300, least - 1)
    assert plan_tile_qr(300, 300, "float64", memory=2**30, tile=least).tile == least  # the fix plans


def test_tile_limit_when_the_budget_forces_small_tiles():
    from blocklin.plan.factor import plan_factor

    with pytest.raises(BudgetError, match="memory.*tile updates.*Fix: raise the memory budget"):
        plan_factor("cholesky", 8192, np.float64, memory=6 * 32 * 32 * 8)  # 32-tiles only: 256 per side


@pytest.mark.parametrize("value", [-1, 0, 5.5, [], "hi", 2**63])
def test_max_passes_is_validated(tmp_path, value):
    A = bl.from_array(_rand((60, 30), np.float64), str(tmp_path / "a.zarr"))
    S = bl.from_array(np.diag(np.arange(1.0, 31.0)), str(tmp_path / "s.zarr"))
    with pytest.raises(ParameterError, match="max_passes.*Fix:"):
        bl.svd(A, 3, max_passes=value, memory=MEM)
    with pytest.raises(ParameterError, match="max_passes.*Fix:"):
        bl.eigsh(S, 3, max_passes=value, order="descending", memory=MEM)


def test_huge_counts_do_not_run_away(tmp_path):
    """``power_iters=2**62`` on an in-core matrix ran for hours; other huge counts are capped or refused."""
    from blocklin.linalg.lowrank.svd import MAX_POWER_ITERS

    A = bl.from_array(_rand((60, 30), np.float64), str(tmp_path / "a.zarr"))
    t0 = time.monotonic()
    with pytest.raises(ParameterError, match=f"power_iters.*<= {MAX_POWER_ITERS}.*Fix:"):
        bl.svd(A, 3, method="rsvd", power_iters=2**62, memory=MEM)
    for call in (lambda: bl.inv(np.eye(4), refine=2**62), lambda: bl.inv(np.eye(4), max_refine=-1),
                 lambda: bl.solve(A, np.ones(60), refine=2**62)):
        with pytest.raises(ParameterError, match="refine.*Fix:"):
            call()
    res = bl.svd(A, 3, block_size=2**62, max_basis=2**62, max_passes=2**62, memory=MEM)
    ref = np.linalg.svd(A.to_numpy(), compute_uv=False)[:3]
    # singular values to the default tolerance (about 10 sqrt(eps) relative) with a factor 10 of slack
    assert np.max(np.abs(res.s - ref) / ref) <= 100 * np.sqrt(np.finfo(float).eps)
    assert time.monotonic() - t0 < 60


#: Every CLI option that takes a size or count, with a valid command line to put it in.
SIZE_OPTIONS = [
    (["factor", "cholesky", "S.zarr", "-o", "o.zarr"], "--tile"),
    (["factor", "lu", "S.zarr", "-o", "o.zarr"], "--tile"),
    (["factor", "qr", "S.zarr", "-o", "o.zarr"], "--tile"),
    (["factor", "cholesky", "S.zarr", "-o", "o.zarr"], "--workers"),
    (["gemm", "S.zarr", "S.zarr", "-o", "o.zarr"], "--workers"),
    (["gemm", "S.zarr", "S.zarr", "-o", "o.zarr"], "--memory"),
    (["gram", "S.zarr", "-o", "o.zarr"], "--memory"),
    (["svd", "S.zarr", "-o", "o.zarr", "-k", "2"], "-k"),
    (["svd", "S.zarr", "-o", "o.zarr", "-k", "2"], "--max-passes"),
    (["svd", "S.zarr", "-o", "o.zarr", "-k", "2"], "--oversample"),
    (["svd", "S.zarr", "-o", "o.zarr", "-k", "2"], "--power-iters"),
    (["svd", "S.zarr", "-o", "o.zarr", "-k", "2"], "--workers"),
    (["pca", "S.zarr", "-k", "2"], "-k"),
    (["pca", "S.zarr", "-k", "2"], "--oversample"),
    (["eigs", "S.zarr", "-o", "o.zarr", "-k", "2"], "-k"),
    (["eigs", "S.zarr", "-o", "o.zarr", "-k", "2"], "--max-passes"),
    (["inv", "S.zarr", "-o", "o.zarr"], "--refine"),
    (["inv", "S.zarr", "-o", "o.zarr"], "--memory"),
    (["solve", "S.zarr", "S.zarr", "-o", "o.zarr"], "--refine"),
    (["solve", "S.zarr", "S.zarr", "-o", "o.zarr"], "--workers"),
    (["convert", "S.zarr", "o.zarr"], "--chunks"),
    (["convert", "S.zarr", "o.zarr"], "--offset"),
    (["convert", "S.zarr", "o.zarr"], "--skip-rows"),
    (["convert", "S.zarr", "o.zarr"], "--shape"),
    (["info", "S.zarr"], "--offset"),
    (["info", "S.zarr"], "--skip-rows"),
    (["info", "S.zarr"], "--shape"),
    (["demo"], "--size"),
]
#: Options that take 0 (a count of extra things, or a byte offset): only negative values are bad.
ZERO_OK = {"--oversample", "--power-iters", "--refine", "--offset", "--skip-rows"}
#: Commands whose option takes 0 where the same option of others does not: pca -k 0, scikit-learn's
#: PCA(n_components=0) (the isotropic model).
ZERO_OK_IN = {("pca", "-k")}


def _bad_values(option: str, command: str = ""):
    from hypothesis import strategies as st

    negative = st.integers(max_value=-1).map(str)
    huge = st.integers(min_value=2**63, max_value=2**70).map(str)
    fractional = st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: x != int(x)).map(repr)
    words = st.sampled_from(["hi", "", "1e3x", "2**63", "nan"])
    zero_ok = option in ZERO_OK or (command, option) in ZERO_OK_IN
    values = [negative, huge, fractional, words] + ([] if zero_ok else [st.just("0")])
    if option in ("--chunks", "--shape"):
        return st.one_of(*values).map(lambda v: f"{v},10")
    return st.one_of(*values)


@pytest.mark.parametrize("argv,option", SIZE_OPTIONS, ids=[f"{a[0]}{'-' + a[1] if a[0] == 'factor' else ''}{o}"
                                                          for a, o in SIZE_OPTIONS])
def test_every_size_option_refuses_bad_values_at_once(tmp_path, monkeypatch, capsys, argv, option):
    """0 (where the option does not take it), negative, huge (>= 2**63) and non-integer values: exit 2
    (usage) with one error line naming the option, before any file is read (the matrix named here does
    not exist)."""
    from hypothesis import HealthCheck, given, settings

    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)

    @settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(value=_bad_values(option, argv[0]))
    def check(value):
        t0 = time.monotonic()
        with pytest.raises(SystemExit) as info:
            main([*argv, f"{option}={value}"])
        err = capsys.readouterr().err
        assert info.value.code == ui.EXIT_USAGE, (value, err)
        line = _one_error_line(err, f"argument {option}")
        assert "Fix:" in line or "must be" in line, line
        assert time.monotonic() - t0 < 5
        assert not list(work.iterdir())  # nothing written

    check()


def test_workers_and_memory_in_the_api_are_validated(tmp_path):
    A = bl.from_array(_rand((20, 20), np.float64), str(tmp_path / "a.zarr"))
    from blocklin.config import MAX_WORKERS

    for bad in (0, -5, 5.5, "hi", True, 2**62, MAX_WORKERS + 1):  # 2**62 workers: plans looped down from it
        with pytest.raises(ConfigError, match="workers"):
            bl.matmul(A, A, workers=bad)
    # a tile beyond the matrix is one tile; the most workers the budget holds run
    S = bl.from_array(np.eye(40) * 4, str(tmp_path / "s.zarr"))
    t0 = time.monotonic()
    L = bl.cholesky(S, tile=2**62, workers=MAX_WORKERS, memory=MEM)
    assert L.report["plan"]["tile"] == 40 and np.allclose(L.to_numpy(), 2 * np.eye(40))
    assert time.monotonic() - t0 < 30
    for bad in ("5.5", 0, "-5", 2**63, "hi"):
        with pytest.raises(ConfigError, match="memory"):
            bl.matmul(A, A, memory=bad)
    for bad in ((0, 5), (-1, 5), (2**63, 5), (5.5, 5), (True, 4), "hi"):
        with pytest.raises(ConfigError, match="chunks.*positive integers"):
            bl.convert(str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr"), chunks=bad)
    assert not (tmp_path / "b.zarr").exists()


# ---------------------------------------------------------------- tracebacks


def test_json_into_a_closed_pipe_ends_quietly(tmp_path):
    """``blocklin gemm ... --json | head -c0``: once two BrokenPipeError tracebacks."""
    path = str(tmp_path / "a.zarr")
    bl.from_array(_rand((30, 30), np.float64), path)
    read_fd, write_fd = os.pipe()
    os.close(read_fd)  # the reader is gone before anything is written
    proc = subprocess.run([sys.executable, "-m", "blocklin.cli.main", "gemm", path, path, "-o",
                           str(tmp_path / "c.zarr"), "--json"], stdout=write_fd, stderr=subprocess.PIPE,
                          text=True, timeout=120)
    os.close(write_fd)
    assert proc.returncode == ui.EXIT_BROKEN_PIPE
    assert proc.stderr == ""  # nothing scary: the output is committed
    assert np.array_equal(bl.open(str(tmp_path / "c.zarr")).to_numpy().shape, (30, 30))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_s3_endpoint_with_no_server(tmp_path):
    port = _free_port()  # nothing listens there
    opts = ["--storage-option", "key=testing", "--storage-option", "secret=testing",
            "--storage-option", f"endpoint_url=http://127.0.0.1:{port}"]
    r = _cli(["gemm", "s3://bucket/a.zarr", "s3://bucket/a.zarr", "-o", "s3://bucket/c.zarr", *opts], timeout=120)
    assert r.returncode == ui.EXIT_ERROR
    _one_error_line(r.stderr, "StorageUnreachableError", f"127.0.0.1:{port}", "--resume", "Fix:")
    so = {"key": "testing", "secret": "testing", "endpoint_url": f"http://127.0.0.1:{port}"}
    with pytest.raises(StorageUnreachableError, match=f"127.0.0.1:{port}.*resume"):
        bl.matmul("s3://bucket/a.zarr", "s3://bucket/a.zarr", out="s3://bucket/c.zarr", storage_options=so)


def test_s3_missing_bucket(s3, tmp_path):  # noqa: F811
    base, opts = s3
    bl.from_array(_rand((20, 20), np.float64), f"{base}/a.zarr", storage_options=opts)
    so = [x for k, v in opts.items() for x in ("--storage-option", f"{k}={v}")]
    r = _cli(["gemm", f"{base}/a.zarr", f"{base}/a.zarr", "-o", "s3://blocklin-no-such-bucket/c.zarr", *so])
    assert r.returncode == ui.EXIT_ERROR
    _one_error_line(r.stderr, "StoreNotFoundError", "s3://blocklin-no-such-bucket", "bucket", "Fix:")
    with pytest.raises(StoreNotFoundError, match="bucket.*Fix:"):
        bl.matmul(f"{base}/a.zarr", f"{base}/a.zarr", out="s3://blocklin-no-such-bucket/c.zarr", storage_options=opts)


def test_s3_server_stopped_mid_job_then_resumed(tmp_path):
    """The server goes away between tiles: one error line naming the endpoint and --resume; once it
    is back, ``--resume`` completes the output, equal to NumPy's product."""
    import s3fs

    server_mod = pytest.importorskip("moto.server")
    port = _free_port()
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    opts = {"key": "testing", "secret": "testing", "endpoint_url": f"http://127.0.0.1:{port}"}
    try:
        s3fs.S3FileSystem(**opts).mkdir("blocklin-midjob")
        a, b = _rand((256, 64), np.float64), _rand((64, 256), np.float64, seed=2)
        bl.from_array(a, "s3://blocklin-midjob/a.zarr", chunks=(32, 64), storage_options=opts)
        bl.from_array(b, "s3://blocklin-midjob/b.zarr", chunks=(64, 32), storage_options=opts)
        so = [x for k, v in opts.items() for x in ("--storage-option", f"{k}={v}")]
        argv = ["gemm", "s3://blocklin-midjob/a.zarr", "s3://blocklin-midjob/b.zarr", "-o",
                "s3://blocklin-midjob/c.zarr", "--memory", "256KiB", "--workers", "1", "--resume", *so]
        mark = tmp_path / "mark"
        env = {**os.environ, "BLOCKLIN_TEST_DELAY": "0.3", "BLOCKLIN_TEST_MARK": str(mark),
               "BLOCKLIN_TEST_MARK_AFTER": "3"}
        proc = subprocess.Popen([sys.executable, str(SUPPORT / "slow_cli.py"), *argv], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while not mark.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert mark.exists(), proc.communicate()
        server.stop()
        _, stderr = proc.communicate(timeout=300)
        assert proc.returncode == ui.EXIT_ERROR, stderr
        _one_error_line(stderr, "StorageUnreachableError", f"127.0.0.1:{port}", "--resume")
        server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()  # moto keeps its buckets in this process: the data written so far is there
        r = _cli(argv, timeout=300)
        assert r.returncode == 0, r.stderr
        got = bl.open("s3://blocklin-midjob/c.zarr", storage_options=opts).to_numpy()
        # ||C - AB|| <= k eps ||A|| ||B|| (k = 64 terms, factor 2 for the blocked summation)
        assert np.linalg.norm(got - a @ b) <= 2 * 64 * np.finfo(float).eps * np.linalg.norm(a) * np.linalg.norm(b)
    finally:
        server.stop()


@pytest.mark.parametrize("address,words", [
    ("tcp://", ["host"]), ("tcp://127.0.0.1", ["port"]), ("tcp://:8786", ["host"]),
    ("tcp://127.0.0.1:99999", ["port"]), ("udp://127.0.0.1:8786", ["tcp://"]),
])
def test_scheduler_address_is_checked_up_front(tmp_path, address, words):
    path = str(tmp_path / "a.zarr")
    bl.from_array(_rand((10, 10), np.float64), path)
    t0 = time.monotonic()
    r = _cli(["gemm", path, path, "-o", str(tmp_path / "c.zarr"), "--scheduler", address], timeout=60)
    assert r.returncode == ui.EXIT_ERROR
    _one_error_line(r.stderr, "ConfigError", "scheduler", "Fix:", *words)
    assert time.monotonic() - t0 < 30  # no minute-long hang closing a half-made client
    with pytest.raises(ConfigError, match="scheduler"):
        bl.matmul(path, path, scheduler=address)


def test_scheduler_with_nothing_listening_fails_fast(tmp_path):
    path = str(tmp_path / "a.zarr")
    bl.from_array(_rand((10, 10), np.float64), path)
    port = _free_port()
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=f"reachable.*127.0.0.1:{port}"):
        bl.matmul(path, path, scheduler=f"tcp://127.0.0.1:{port}")
    assert time.monotonic() - t0 < 20


def _strict_loads(text: str):
    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(text, parse_constant=refuse)


def test_json_output_has_no_nan_tokens(capsys):
    import argparse

    args = argparse.Namespace(json=True)
    ui.emit(args, {"residual_norm": float("nan"), "s": [1.0, np.inf], "report": {"g": np.float64(-np.inf)},
                   "ok": 2.5})
    out = _strict_loads(capsys.readouterr().out)
    assert out["residual_norm"] is None and out["s"] == [1.0, None] and out["ok"] == 2.5
    assert out["nonfinite"] == {"residual_norm": "nan", "s[1]": "inf", "report.g": "-inf"}


def test_provenance_attributes_are_strict_json(tmp_path):
    """A report holding NaN (an unknown residual) must still give zarr attributes strict parsers read."""
    from blocklin.storage import atomic

    path = tmp_path / "p.zarr"
    bl.from_array(np.eye(4), str(tmp_path / "src.zarr"))
    m = bl.matmul(str(tmp_path / "src.zarr"), str(tmp_path / "src.zarr"), str(path))
    assert m.shape == (4, 4)
    for meta in path.rglob("zarr.json"):
        _strict_loads(meta.read_text())
    clean = atomic.jsonsafe.strict({"report": {"residual": float("nan")}})
    assert clean == {"report": {"residual": None}, "nonfinite": {"report.residual": "nan"}}


def test_big_endian_zarr_v2_operands(tmp_path):
    """A zarr v2 ``>f8`` operand was refused as "float64 vs float64"; now read as native, results right."""
    import zarr

    a = _rand((50, 30), np.float64, seed=3)
    b = _rand((50, 2), np.float64, seed=4)
    z = zarr.open_array(str(tmp_path / "be.zarr"), mode="w", shape=a.shape, dtype=">f8", chunks=(25, 30),
                        zarr_format=2)
    z[...] = a
    be = str(tmp_path / "be.zarr")
    x = bl.solve(be, b, memory=MEM).to_numpy()
    ref = np.linalg.lstsq(a, b, rcond=None)[0]
    # least squares: forward error ~ cond(A) eps ||x|| (A Gaussian 50 x 30: cond ~ 10; factor 100 slack)
    assert np.linalg.norm(x - ref) <= 100 * 10 * np.finfo(float).eps * np.linalg.norm(ref)
    g = bl.matmul(be, be, trans_a=True, memory=MEM).to_numpy()
    assert g.dtype == np.float64 and g.dtype.isnative
    assert np.linalg.norm(g - a.T @ a) <= 2 * 50 * np.finfo(float).eps * np.linalg.norm(a) ** 2
    c = bl.matmul(be, a.T.copy(), memory=MEM).to_numpy()
    assert np.linalg.norm(c - a @ a.T) <= 2 * 30 * np.finfo(float).eps * np.linalg.norm(a) ** 2
