"""``blocklin.lu`` of rectangular matrices (``P A = L U`` of any ``m x n``) against SciPy and LAPACK.

Ported from SciPy's ``linalg/tests/test_decomp_lu.py``: ``TestLU.test_old_lu_smoke_tests`` (the
rectangular ``hrect`` and ``vrect`` with their known ``p``, ``l``, ``u``),
``TestLU.test_simple_lu_shapes_real_complex`` (the real rectangles ``[2, 4]``, ``[4, 2]``,
``[20, 4]``, ``[4, 20]``), ``TestLUFactor.test_hrectangular``/``test_vrectangular``/``test_medium1``
(the packed factors and pivots against ``getrf``'s: ``30 x 40``), ``TestLUFactor.test_shape_dtype``
(shapes ``m, n`` in ``1, 2``: an ``m x n`` result and ``min(m, n)`` pivots). From Dask's
``array/tests/test_linalg.py``: ``test_lu_2``/``test_lu_3`` (integer matrices of sizes 20 to 200,
chunks of 5 and 25) are square there and ``test_lu_errors`` refuses a ``10 x 8`` matrix in chunks
of ``(5, 4)``; here the rectangles of those sizes and chunks are factored.

Bounds (Higham, *Accuracy and Stability*, 2nd ed.): the backward error of LU with partial pivoting,
``||P A - L U||_F <= c n eps ||L||_F ||U||_F`` (Thm 9.3; ``||L|| ||U||`` carries the growth factor),
through :func:`support.tolerances.assert_factorization`; ``|L_ij| <= 1`` (partial pivoting); the pivots
equal LAPACK's up to the first column whose two largest candidates are closer than the rounding of
the Schur complement (a near-tie, where either choice is right); and, with equal pivots, the
factors differ from SciPy's by no more than the perturbation of the LU factors by the two
backward errors allows (:func:`_assert_factors_near`).
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import scipy.linalg as sl

import blocklin as bl
from blocklin.cli.main import main
from blocklin.errors import BlocklinWarning, BudgetError, ParameterError, ShapeError
from support.tolerances import assert_factorization, eps

SCHEDULERS = ["sync", "threads", "processes"]


def unpack(packed, pivots):
    """``(perm, L, U)`` with ``A[perm] = L U`` from the packed ``m x n`` factors and LAPACK's 0-based
    swaps, ``L`` ``m x k`` and ``U`` ``k x n`` (``k = min(m, n)``) as ``scipy.linalg.lu`` shapes them."""
    m, n = packed.shape
    k = min(m, n)
    perm = np.arange(m)
    for i, p in enumerate(np.asarray(pivots)):
        perm[[i, p]] = perm[[p, i]]
    return perm, np.tril(packed, -1)[:, :k] + np.eye(m, k, dtype=packed.dtype), np.triu(packed)[:k]


def _first_near_tie(a, piv_ref, dtype) -> int:
    """The first step of Gaussian elimination (with the reference pivots, in float64) whose two largest
    candidate pivots differ by less than twice the rounding a ``dtype`` elimination may leave in the
    Schur complement, ``gamma_k |L| |U| <= k eps max(|L| |U|)`` (Higham Thm 9.3): there either
    choice is right. ``min(m, n)`` when there is none."""
    s = np.array(a, dtype=np.float64)
    m, n = s.shape
    k = min(m, n)
    _, low, up = unpack(sl.lu_factor(s)[0], piv_ref)
    slack = 2 * 2 * k * eps(dtype) * float((np.abs(low) @ np.abs(up)).max())
    for i in range(k):
        col = np.sort(np.abs(s[i:, i]))[::-1]
        if col.size > 1 and col[0] - col[1] <= slack:
            return i
        p = piv_ref[i]
        s[[i, p]] = s[[p, i]]
        if s[i, i] != 0:
            s[i + 1:, i] /= s[i, i]
            s[i + 1:, i + 1:] -= np.outer(s[i + 1:, i], s[i, i + 1:])
    return k


def _residual(a, perm, low, up) -> float:
    """``||P A - L U||_F`` in float64, plus the float64 rounding of forming ``L U`` (``k eps64 ||L|| ||U||``)."""
    lo, u = low.astype(np.float64), up.astype(np.float64)
    return float(np.linalg.norm(a.astype(np.float64)[perm] - lo @ u)
                 + lo.shape[1] * eps(np.float64) * np.linalg.norm(lo) * np.linalg.norm(u))


def _assert_factors_near(a, got, ref) -> None:
    """``L``, ``U`` (``got``) against SciPy's (``ref``) for the same pivots, by the perturbation of the LU factors.

    Both are exact factors of ``P A`` plus their measured backward errors, so ``L U`` and
    ``L_r U_r`` differ by ``D`` with ``||D||_F <= delta`` (the two residuals). With ``k x k``
    leading blocks ``L_1``, ``U_1`` and ``F = L_r1^-1 dL_1`` (strictly lower), ``G = dU_1 U_r1^-1``
    (upper): ``F + G + F G = X = L_r1^-1 D_11 U_r1^-1``, so ``s = ||[F, G]||_F`` obeys
    ``s <= x + s^2 / 2`` and, from ``s = 0`` at ``D = 0``, ``s <= 1 - sqrt(1 - 2x) <= 2 x`` while
    ``x = ||L_r1^-1||_2 ||U_r1^-1||_2 delta <= 1/2``: ``||dL_1|| <= 2 x ||L_r1||_2``,
    ``||dU_1|| <= 2 x ||U_r1||_2``. A tall matrix's ``L_2 = A_21 U_1^-1`` moves by at most
    ``(delta + ||L_r2||_2 ||dU_1||) ||U_r1^-1||_2 / (1 - ||U_r1^-1||_2 ||dU_1||)``, a wide matrix's
    ``U_2 = L_1^-1 A_12`` by ``(delta + ||dL_1|| ||U_r2||_2) ||L_r1^-1||_2 / (1 - ||L_r1^-1||_2 ||dL_1||)``.
    """
    (perm, low, up), (perm_r, low_r, up_r) = got, ref
    m, n = a.shape
    k = min(m, n)
    delta = _residual(a, perm, low, up) + _residual(a, perm_r, low_r, up_r)
    l1, u1 = low_r[:k].astype(np.float64), up_r[:, :k].astype(np.float64)
    n2 = lambda x: float(np.linalg.norm(x, 2)) if x.size else 0.0  # noqa: E731
    il, iu = n2(np.linalg.inv(l1)), n2(np.linalg.inv(u1))
    x = il * iu * delta
    assert x <= 0.25, f"too ill-conditioned a test matrix for the perturbation bound (x = {x:.3g})"
    dl1, du1 = 2 * x * n2(l1), 2 * x * n2(u1)
    dl2 = (delta + n2(low_r[k:]) * du1) * iu / (1 - iu * du1) if m > k else 0.0
    du2 = (delta + dl1 * n2(up_r[:, k:])) * il / (1 - il * dl1) if n > k else 0.0
    err_l = np.linalg.norm(low[:k] - low_r[:k]), np.linalg.norm(low[k:] - low_r[k:])
    err_u = np.linalg.norm(up[:, :k] - up_r[:, :k]), np.linalg.norm(up[:, k:] - up_r[:, k:])
    for what, err, bound in (("L_1", err_l[0], dl1), ("L_2", err_l[1], dl2), ("U_1", err_u[0], du1),
                             ("U_2", err_u[1], du2)):
        assert err <= bound, f"{what}: {err:.3e} from SciPy's, bound {bound:.3e}"


def check_against_lapack(a, f, dtype, *, ties_ok: bool = False) -> None:
    """The rectangular result ``f`` of ``blocklin.lu(a)`` against ``scipy.linalg.lu`` and ``lu_factor``."""
    m, n = a.shape
    k = min(m, n)
    packed, piv = f[...], np.asarray(f.provenance["pivots"])  # recorded in the output's attributes
    assert packed.shape == (m, n) and f.dtype == dtype and piv.shape == (k,)
    if getattr(f, "report", None):
        np.testing.assert_array_equal(f.report["pivots"], piv)
    perm, low, up = unpack(packed, piv)
    p_ref, l_ref, u_ref = sl.lu(a.astype(dtype))
    # L unit lower trapezoidal, U upper trapezoidal: the shapes and zeros of scipy.linalg.lu's
    assert low.shape == l_ref.shape == (m, k) and up.shape == u_ref.shape == (k, n)
    assert np.array_equal(np.triu(low, 1), np.zeros((m, k))) and np.array_equal(np.diagonal(low), np.ones(k))
    assert np.array_equal(np.tril(up, -1), np.zeros((k, n)))
    assert np.abs(low).max(initial=0.0) <= 1.0  # partial pivoting
    assert_factorization(a.astype(np.float64)[perm], low.astype(np.float64) @ up.astype(np.float64),
                         factors=(low, up), dtype=dtype)
    with warnings.catch_warnings():  # LAPACK's zero pivot of a rank-deficient matrix: expected here
        warnings.simplefilter("ignore", sl.LinAlgWarning)
        _, piv_ref = sl.lu_factor(a.astype(dtype))
        tie = k if not ties_ok else _first_near_tie(a, sl.lu_factor(a.astype(np.float64))[1], dtype)
    np.testing.assert_array_equal(piv[:tie], piv_ref[:tie])
    if tie == k:  # SciPy's p is the permutation of the same swaps, and the factors are its own up to rounding
        np.testing.assert_array_equal(p_ref[perm, np.arange(m)], np.ones(m))
        perm_r = np.argmax(p_ref, axis=0)
        _assert_factors_near(a, (perm, low, up), (perm_r, l_ref, u_ref))


RECTANGLES = [  # (m, n, tile): one panel, several, the panel holding column m of a wide matrix partial
    (2, 4, 1), (4, 2, 1), (20, 4, 2), (4, 20, 2), (30, 40, 8), (40, 30, 8), (1, 5, 1), (5, 1, 1),
    (101, 37, 16), (37, 101, 16), (64, 16, 16), (16, 64, 16), (33, 90, 32), (50, 48, 8), (48, 50, 8)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m,n,tile", RECTANGLES, ids=[f"{m}x{n}-t{t}" for m, n, t in RECTANGLES])
def test_rectangular_lu_matches_lapack(tmp_path, dtype, m, n, tile):
    a = np.random.default_rng(m * 1000 + n).standard_normal((m, n)).astype(dtype)
    f = bl.lu(a, tmp_path / "lu.zarr", tile=tile, scheduler="sync")
    check_against_lapack(a, f, dtype, ties_ok=dtype == np.float32)
    if dtype == np.float64:  # no near-tie in these float64 matrices: every pivot is LAPACK's
        assert _first_near_tie(a, np.asarray(f.report["pivots"]), dtype) == min(m, n)


def test_scipy_smoke_rectangles_known_factors(tmp_path):
    """SciPy's ``TestLU.test_old_lu_smoke_tests`` rectangles, with their known factors, in panels of one and two columns."""
    hrect = np.array([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 12, 12]])
    vrect = np.array([[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 12, 12]])
    known = {
        "h": (hrect, np.array([[0, 1, 0], [0, 0, 1], [1, 0, 0]]), np.array([[1, 0, 0], [1 / 9, 1, 0], [5 / 9, 0.5, 1]]),
              np.array([[9, 10, 12, 12], [0, 8 / 9, 15 / 9, 24 / 9], [0, 0, -0.5, 0]])),
        "v": (vrect, np.eye(4)[[1, 3, 2, 0], :], np.array([[1.0, 0, 0], [0.1, 1, 0], [0.7, -0.5, 1], [0.4, 0.25, 0.5]]),
              np.array([[10, 12, 12], [0, 0.8, 1.8], [0, 0, 1.5]])),
    }
    for a, p, low_k, up_k in known.values():
        for tile in (1, 2):
            f = bl.lu(a, tile=tile, scheduler="sync")  # integers: cast to float64, as numpy.linalg does
            check_against_lapack(a.astype(np.float64), f, np.float64)
            perm, low, up = unpack(f[...], f.report["pivots"])
            np.testing.assert_array_equal(p[perm, np.arange(a.shape[0])], np.ones(a.shape[0]))
            _assert_factors_near(a.astype(np.float64), (perm, low, up), (perm, low_k, up_k))


@pytest.mark.parametrize("m,n", [(1, 2), (2, 1), (1, 1), (2, 2)])
def test_shapes_and_pivot_counts(m, n):
    """SciPy's ``TestLUFactor.test_shape_dtype`` (real): an ``m x n`` result, ``min(m, n)`` pivots, ``eye``'s factors."""
    for dtype in (np.float32, np.float64):
        f = bl.lu(np.eye(m, n, dtype=dtype), scheduler="sync")
        assert f.shape == (m, n) and f.dtype == dtype and len(f.report["pivots"]) == min(m, n)
        lu_ref, piv_ref = sl.lu_factor(np.eye(m, n, dtype=dtype))
        np.testing.assert_array_equal(f[...], lu_ref)  # no rounding: the identity's factors are exact
        np.testing.assert_array_equal(f.report["pivots"], piv_ref)


@pytest.mark.parametrize("m,n,chunk", [(10, 8, 4), (8, 10, 4), (50, 20, 5), (20, 50, 5), (200, 100, 25),
                                       (100, 200, 25)])
def test_dask_integer_rectangles(tmp_path, m, n, chunk):
    """Dask's ``test_lu_2``/``test_lu_3`` data (integers 0 to 9, full of pivot ties) in rectangles of
    its sizes, stored in its chunks; ``test_lu_errors``' ``10 x 8`` is factored here, not refused."""
    a = np.random.default_rng(10).integers(0, 10, (m, n))
    A = bl.from_array(a, tmp_path / "a.zarr", chunks=(chunk, chunk))
    f = bl.lu(A, tile=chunk, scheduler="sync")
    check_against_lapack(a.astype(np.float64), f, np.float64, ties_ok=True)


@pytest.mark.parametrize("m,n", [(300, 100), (100, 300)], ids=["tall", "wide"])
def test_out_of_core_on_every_scheduler(tmp_path, m, n):
    """Several panels planned within a small budget from stored chunks: the same bits on every scheduler."""
    a = np.random.default_rng(7).standard_normal((m, n))
    A = bl.from_array(a, tmp_path / "a.zarr", chunks=(32, 32))
    outs = []
    for s in SCHEDULERS:
        f = bl.lu(A, memory="400KiB", scheduler=s)
        plan = f.report["plan"]
        assert plan["tiles"] >= 4 and plan["peak_memory"] <= 400 * 2**10 and plan["m"] == m
        outs.append((f[...], f.report["pivots"]))
    check_against_lapack(a, f, np.float64)
    for packed, piv in outs[1:]:
        np.testing.assert_array_equal(packed, outs[0][0])
        np.testing.assert_array_equal(piv, outs[0][1])


@pytest.mark.parametrize("m,n", [(300, 70), (70, 300)], ids=["tall", "wide"])
def test_in_memory_is_one_panel(m, n):
    """Within a large budget all the pivots are found in one panel (a wide matrix's columns right of its
    rows then go to panels that are only updated: see plan_lu)."""
    a = np.random.default_rng(8).standard_normal((m, n)).astype(np.float32)
    f = bl.lu(a, memory="256MiB", scheduler="sync")
    plan = f.report["plan"]
    assert plan["tile"] >= min(m, n)
    assert plan["tiles"] == 1 if m > n else plan["tile"] < n and plan["tile"] == -(-m // 32) * 32
    check_against_lapack(a, f, np.float32, ties_ok=True)


@pytest.mark.parametrize("m,n", [(40, 12), (12, 40)], ids=["tall", "wide"])
def test_rank_deficient_keeps_zero_pivots(m, n):
    """A zero column (rank ``min(m, n) - 1``) and a matrix of ones (rank 1): the zero pivots stay, as
    in LAPACK's ``getrf``, with the warning."""
    a = np.random.default_rng(9).standard_normal((m, n))
    a[:, 5] = 0.0  # stays exactly zero under the row operations: U_55 = 0
    with pytest.warns(BlocklinWarning, match=rf"zero pivot: the {m} x {n} A has rank below {min(m, n)}"):
        f = bl.lu(a, tile=4, scheduler="sync")
    assert f.report["min_pivot"] == 0.0 and f[...][5, 5] == 0.0
    check_against_lapack(a, f, np.float64, ties_ok=True)
    ones = np.ones((m, n))
    with pytest.warns(BlocklinWarning, match="zero pivot"):
        g = bl.lu(ones, tile=4, scheduler="sync")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sl.LinAlgWarning)
        lu_ref, piv_ref = sl.lu_factor(ones)  # exact arithmetic: the same bits as getrf
    np.testing.assert_array_equal(g[...], lu_ref)
    np.testing.assert_array_equal(g.report["pivots"], piv_ref)


@pytest.mark.parametrize("m,n", [(30, 20), (20, 30)], ids=["tall", "wide"])
def test_square_only_operations_refuse_rectangular_factors(tmp_path, m, n):
    a = np.random.default_rng(11).standard_normal((m, n))
    f = bl.lu(a, tmp_path / "lu.zarr", scheduler="sync")
    for lu in (f, str(tmp_path / "lu.zarr"), (f[...], f.report["pivots"])):
        with pytest.raises(ShapeError, match=rf"factor: must be square for lu_solve.*{m} x {n}.*blocklin.lstsq"):
            bl.lu_solve(lu, np.ones(m))
    for op in (bl.det, bl.slogdet, np.linalg.det, np.linalg.slogdet):
        with pytest.raises(ShapeError, match=rf"a: must be square for a determinant.*{m} x {n}.*singular values"):
            op(f if op in (np.linalg.det, np.linalg.slogdet) else a)


def test_rectangles_on_an_object_store():
    """URL outputs (the in-place commit protocol): the factors and pivots; no markers or work store left."""
    import fsspec

    for m, n in ((70, 30), (30, 70)):
        a = np.random.default_rng(15).standard_normal((m, n))
        f = bl.lu(a, f"memory://lu-rect-test/lu{m}.zarr", tile=16, scheduler="sync")
        check_against_lapack(a, f, np.float64)
    keys = fsspec.filesystem("memory").find("/lu-rect-test")
    assert keys and not [k for k in keys if "blocklin-done" in k or "lu-work" in k or "pending" in k]
    fsspec.filesystem("memory").rm("/lu-rect-test", recursive=True)


def test_explain_and_budget_of_a_rectangle(tmp_path):
    a = bl.from_array(np.random.default_rng(12).standard_normal((300, 90)), tmp_path / "a.zarr", chunks=(32, 32))
    plan = bl.lu(a, memory="400KiB", explain=True)
    assert (plan.m, plan.n, plan.tile, plan.tiles) == (300, 90, 32, 3)
    assert plan.flops == 300 * 90**2 - 90**3 // 3  # LAPACK's count for m >= n
    assert "lu of a 300 x 90 float64 matrix (tall: L 300 x 90 unit lower trapezoidal, U 90 x 90)" in plan.explain()
    wide = bl.lu(np.zeros((90, 300)), memory="400KiB", explain=True)
    assert "(wide: L 90 x 90, U 90 x 300 upper trapezoidal)" in wide.explain()
    assert "right of column 90 updated only" in wide.explain()
    with pytest.raises(BudgetError, match=r"memory: must hold a column panel of 300 x 32.*at least 334.00 KiB"):
        bl.lu(a, memory="96KiB")


def test_tiny_panels_of_a_rectangle_are_refused():
    """The cap on tile updates counts a rectangle's three sides; the error names the least panel width that passes."""
    from blocklin.plan.factor import MAX_TILE_UPDATES, min_rect_tile, plan_lu, rect_updates

    for m, n in ((4000, 300), (300, 4000)):
        least = min_rect_tile(m, n)
        assert rect_updates(m, n, least) <= MAX_TILE_UPDATES < rect_updates(m, n, least - 1)
        assert plan_lu(n, "float64", m=m, memory=2**30, tile=least).tile == least
        with pytest.raises(ParameterError, match=rf"tile: .*on a {m} x {n} matrix.*pass tile >= {least}"):
            plan_lu(n, "float64", m=m, memory=2**30, tile=least - 1)


def test_cli_factors_a_rectangle(tmp_path, capsys):
    a = np.random.default_rng(13).standard_normal((120, 50))
    bl.from_array(a, tmp_path / "a.zarr", chunks=(16, 16))
    assert main(["factor", "lu", str(tmp_path / "a.zarr"), "-o", str(tmp_path / "lu.zarr"), "--memory", "256KiB",
                 "--explain"]) == 0
    out = capsys.readouterr().out
    assert "lu of a 120 x 50 float64 matrix (tall" in out and not (tmp_path / "lu.zarr").exists()
    assert main(["factor", "lu", str(tmp_path / "a.zarr"), "-o", str(tmp_path / "lu.zarr"), "--memory", "256KiB",
                 "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["shape"] == [120, 50]
    check_against_lapack(a, bl.open(tmp_path / "lu.zarr"), np.float64)


@pytest.mark.gpu
@pytest.mark.parametrize("m,n", [(90, 40), (40, 90)], ids=["tall", "wide"])
def test_rectangular_lu_on_gpu(m, n):
    a = np.random.default_rng(14).standard_normal((m, n))
    f = bl.lu(a, tile=16, device="gpu", scheduler="sync")
    assert f.report["device"] == "gpu"
    check_against_lapack(a, f, np.float64)
