"""Solves with a stored factorization, as ``scipy.linalg.cho_solve`` and ``lu_solve``: new right-hand
sides against a Cholesky or LU factor :func:`blocklin.cholesky` or :func:`blocklin.lu` wrote (or any
stored factor of that form), without factoring again.

``cho_solve``: ``L y = b``, ``L^H x = y`` (or ``U^H y = b``, ``U x = y`` for an upper factor; ``^H``
the conjugate transpose, ``^T`` of real data).
``lu_solve``: the packed factors of ``P A = L U`` with LAPACK's pivots (``getrf``'s ``ipiv``, 0-based:
row ``i`` swapped with row ``piv[i]``, in order), ``x = U^-1 L^-1 P b``. Each step is a tiled
out-of-core triangular solve (:meth:`blocklin.runtime.blockops.BlockOps.trsm`), backward stable as
LAPACK's ``xPOTRS``/``xGETRS`` (Higham, *Accuracy and Stability*, 2nd ed., Thm 8.5, 9.4 and 10.4).
"""

from __future__ import annotations

from typing import Any, Unpack

import numpy as np

from blocklin.config import Settings
from blocklin.errors import ParameterError, SingularMatrixError, explain
from blocklin.linalg.factor.lu_panels import swaps_to_permutation
from blocklin.linalg.solve.report import solve_report
from blocklin.linalg.solve.triangular import TriangularSetup, scaled_substitution, substitute_in_range
from blocklin.matrix import Matrix
from blocklin.linalg.blocks.scaling import refuse_nonfinite, triangle_max_abs
from blocklin.runtime.blockops import ZERO_DIAGONAL, Region
from blocklin.runtime.job import Job


def _factor_and_flag(f: Any, flag: Any, name: str) -> tuple[Any, Any]:
    """SciPy's ``(c, lower)`` / ``(lu, piv)`` pair, or the factor alone."""
    if isinstance(f, tuple):
        if len(f) != 2:
            raise ParameterError(explain(name, "must be the factor or SciPy's pair (factor, flag)",
                                         f"a tuple of {len(f)}", f"pass {name}=(factor, flag) or the factor"))
        return f
    return f, flag


def cho_solve(c: Any, b: Any, out: Any = None, *, lower: bool | None = None, overwrite: bool = False,
              tile: int | None = None, **settings: Unpack[Settings]) -> Matrix:
    """``A x = b`` from the Cholesky factor of ``A``, as ``scipy.linalg.cho_solve``.

    Parameters
    ----------
    c : path, zarr array, Matrix, NumPy array, or ``(c, lower)``
        The ``n x n`` factor: ``L`` with ``A = L L^H`` (``lower=True``, :func:`blocklin.cholesky`'s
        default) or ``U`` with ``A = U^H U``; only that triangle is read. SciPy's ``(c, lower)`` pair
        is taken too. Real or complex.
    lower : bool, optional
        Which triangle holds the factor. Default: the one :func:`blocklin.cholesky` recorded with
        its output (``U`` of ``lower=False``, or ``blocklin factor cholesky --upper``), else ``True``
        as SciPy's default. A value that contradicts the recorded one is refused: the other
        triangle holds zeros, and solving with it would return a wrong ``x`` without a word.
    b : operand
        ``n x k`` right-hand sides (a 1-D vector is one column). ``x`` has NumPy's promoted dtype of
        ``c`` and ``b`` (a real factor with a complex ``b`` gives complex ``x``).
    out : path, optional
        Output store for ``x`` (atomic).
    overwrite, tile, **settings
        Replace an existing ``out``; the tile side (default planned from the budget); the engine's
        settings.

    Returns
    -------
    Matrix
        ``x`` (``n x k``) with ``.report``.

    Examples
    --------
    >>> import numpy as np
    >>> import blocklin as bl
    >>> a = np.array([[4.0, 2.0], [2.0, 3.0]])
    >>> x = bl.cho_solve(bl.cholesky(a), np.array([1.0, 2.0]))
    >>> bool(np.allclose(a @ x.to_numpy().ravel(), [1.0, 2.0]))
    True
    """
    c, lower = _factor_and_flag(c, lower, "c")
    lower = _factor_triangle(c, lower, settings.get("storage_options"))
    # "C": the conjugate transpose (the transpose of real data), A = L L^H
    steps = (("forward substitution L y = b", True, False), ("back substitution L^H x = y", True, "C")) if lower \
        else (("forward substitution U^H y = b", False, "C"), ("back substitution U x = y", False, False))
    return _solve_with(c, b, out, "cho_solve", steps, overwrite=overwrite, tile=tile, params={"lower": bool(lower)},
                       settings=settings)


def lu_solve(lu: Any, b: Any, out: Any = None, *, piv: Any = None, overwrite: bool = False,
             tile: int | None = None, **settings: Unpack[Settings]) -> Matrix:
    """``A x = b`` from the packed LU factors of ``A``, as ``scipy.linalg.lu_solve``.

    Parameters
    ----------
    lu : path, zarr array, Matrix, NumPy array, or ``(lu, piv)``
        The ``n x n`` packed factors of ``P A = L U`` (unit lower ``L`` below the diagonal, ``U`` on and
        above it), as :func:`blocklin.lu` and ``scipy.linalg.lu_factor`` return them; the factors of a
        rectangular matrix are refused (``ShapeError``), as ``scipy.linalg.lu_solve`` refuses them.
        Real or complex.
    b : operand
        ``n x k`` right-hand sides (a 1-D vector is one column); ``x`` has NumPy's promoted dtype.
    out : path, optional
        Output store for ``x`` (atomic).
    piv : array_like, optional
        LAPACK's pivots (0-based). Default: those :func:`blocklin.lu` recorded in its output.
    overwrite, tile, **settings
        As for :func:`cho_solve`.

    Returns
    -------
    Matrix
        ``x`` (``n x k``) with ``.report``.
    """
    lu, piv = _factor_and_flag(lu, piv, "lu")
    if piv is None:
        piv = _recorded_pivots(lu, settings.get("storage_options"))
    piv = np.asarray(piv)
    if piv.ndim != 1 or piv.dtype.kind not in "iu":
        raise ParameterError(explain("piv", "must be a 1-D integer array (LAPACK's 0-based pivots)",
                                     f"{piv.dtype} of shape {piv.shape}", "pass the pivots blocklin.lu recorded"))
    steps = (("forward substitution L y = P b", True, False), ("back substitution U x = y", False, False))
    return _solve_with(lu, b, out, "lu_solve", steps, overwrite=overwrite, tile=tile, params={}, settings=settings,
                       pivots=piv, square_rule=(
                           "for lu_solve (blocklin.lu of an m x n matrix packs m x n factors; a solve needs square "
                           "L and U)", "factor a square matrix; for least squares with a rectangular a use "
                           "blocklin.lstsq(a, b) or blocklin.solve(a, b)"))


def _singular_factor(err: SingularMatrixError, name: str, operation: str) -> SingularMatrixError:
    """The triangular solve's refusal of a singular factor, said of the factor the caller passed (``lu``
    or ``c``, not the triangular solve's ``t``) with fixes that apply to it (``lu_solve`` has no ``lam``)."""
    text = str(err)
    got = text.split("; got ", 1)[1].split(". Fix:", 1)[0] if "; got " in text else text
    factor = "U" if name == "lu" else "the Cholesky factor"
    return SingularMatrixError(explain(
        name, f"must be the factor of a nonsingular matrix for {operation} (no zero on {factor}'s diagonal)", got,
        "the matrix factored is singular (SciPy's lu_solve/cho_solve would return inf or NaN): solve a "
        "regularized system, blocklin.solve(a, b, lam=...), or the least-squares problem, blocklin.lstsq(a, b)"))


def _provenance(f: Any, storage_options: dict | None) -> dict:
    """What blocklin recorded with the stored factor ``f`` (empty for other factors), read with the call's
    ``storage_options``: an S3 factor read without them had counted as one blocklin did not write, and an
    upper Cholesky factor was solved as lower (its zero triangle read: a wrong ``x``, without a word)."""
    try:
        return f.provenance if isinstance(f, Matrix) else Matrix(f, storage_options=storage_options).provenance
    except Exception:  # not a stored blocklin output (an in-memory array, SciPy's factor)
        return {}


#: Outputs of other factorizations, which a Cholesky solve would read as garbage.
_NOT_CHOLESKY = {"lu": "blocklin.lu_solve (CLI: --factored lu)", "qr": "blocklin.solve(a, b) or blocklin.lstsq(a, b)"}


def _factor_triangle(c: Any, lower: Any, storage_options: dict | None) -> bool:
    """``lower`` for the Cholesky factor ``c``: as given, else as :func:`blocklin.cholesky` recorded it,
    else True; a given value that contradicts the recorded one, and the output of another
    factorization, are refused."""
    prov = _provenance(c, storage_options)
    op = prov.get("operation")
    if op in _NOT_CHOLESKY:
        raise ParameterError(explain("c", "must be a Cholesky factor for cho_solve", f"the output of blocklin.{op}",
                                     f"solve with {_NOT_CHOLESKY[op]}"))
    recorded = (prov.get("params") or {}).get("lower") if op == "cholesky" else None
    if lower is None:
        return True if recorded is None else bool(recorded)
    if recorded is not None and bool(lower) != bool(recorded):
        held, asked = ("L (lower)", "U (upper)") if recorded else ("U (upper)", "L (lower)")
        raise ParameterError(explain("lower", f"must name the triangle blocklin.cholesky wrote: the factor holds "
                                     f"{held}, its other triangle zeros", f"lower={bool(lower)}, which asks for "
                                     f"{asked}", f"drop lower= (the recorded triangle is used), or pass "
                                     f"lower={bool(recorded)}"))
    return bool(lower)


def _recorded_pivots(lu: Any, storage_options: dict | None) -> np.ndarray:
    """The pivots :func:`blocklin.lu` recorded with its output (its report, or the store's attributes read
    with the call's ``storage_options``)."""
    report = getattr(lu, "report", None) or {}
    if "pivots" in report:
        return np.asarray(report["pivots"])
    try:
        attrs = Matrix(lu, storage_options=storage_options).attrs if not isinstance(lu, Matrix) else lu.attrs
    except Exception:  # not a stored blocklin output (an in-memory array): the pivots must be given
        attrs = {}
    piv = (attrs.get("blocklin") or {}).get("pivots")
    if piv is None:
        raise ParameterError(explain("piv", "is needed for factors blocklin.lu did not write (their pivots are not "
                                     "recorded)", "None", "pass piv= (scipy.linalg.lu_factor's second result)"))
    return np.asarray(piv)


def _solve_with(f: Any, b: Any, out: Any, operation: str, steps: tuple, *, overwrite: bool, tile: int | None,
                params: dict, settings: dict, pivots: np.ndarray | None = None,
                square_rule: tuple[str, str] | None = None) -> Matrix:
    """The two tiled triangular solves of ``steps`` (``(description, lower, trans)``), with the row
    permutation of ``pivots`` first (LU); ``square_rule``: the error's ``(why, fix)`` for a factor
    that is not square."""
    with Job(operation, **settings) as job:
        st = TriangularSetup.of(job, f, b, "factor", operation, out=out, overwrite=overwrite, tile=tile,
                                square_rule=square_rule)
        n, k, dt, plan, ao, ops, rhs = st.n, st.k, st.dtype, st.plan, st.ao, st.ops, st.rhs
        if pivots is not None and (pivots.size != n or pivots.min(initial=0) < 0 or pivots.max(initial=-1) >= n):
            raise ParameterError(explain("piv", f"must hold n = {n} row indices in [0, {n})",
                                         f"{pivots.size} pivots in [{pivots.min(initial=0)}, {pivots.max(initial=0)}]",
                                         "pass the pivots of this factorization"))
        freg = Region.of(st.T.path, st.T.shape)
        if pivots is not None:
            pb = Region.of(job.scratch("pb", (n, k), dt, (plan.tile, plan.tile)), (n, k))
            ops.permute_rows(rhs, pb, swaps_to_permutation(pivots), dtype=dt, description="row swaps P b")
            rhs = pb
        y = Region.of(job.scratch("y", (n, k), dt, (plan.tile, plan.tile)), (n, k))
        (d1, lower1, trans1), (d2, lower2, trans2) = steps
        name = "lu" if pivots is not None else "c"  # SciPy's parameter, which refusals of the factor name
        try:
            if pivots is not None:  # L's unit diagonal is not scaled; partial pivoting keeps |l_ij| <= 1
                ops.trsm(freg, rhs, y, lower=lower1, trans=trans1, unit=True, dtype=dt, check=job.check_finite,
                         description=d1, name=name)
                q1 = 0
            else:
                q1 = substitute_in_range(ops, st.T, freg, rhs, y, lower=lower1, trans=trans1, dtype=dt,
                                         check=job.check_finite, description=d1, name=name)
            # LU: U's tiles off the diagonal are read here first (the forward step read L's triangle and the
            # diagonal tiles whole): checked as read, or a NaN there was refused as one check_finite=False had
            # let through; the Cholesky factor's second step reads the tiles its first checked. y is finite
            # (the first step refuses a non-finite tile of it), so the check of it never fires
            q2 = substitute_in_range(ops, st.T, freg, y, Region.of(ao.array_path(), (n, k)), lower=lower2,
                                     trans=trans2, dtype=dt, check=job.check_finite and pivots is not None,
                                     description=d2, name=name)
        except SingularMatrixError as err:
            if pivots is not None and ZERO_DIAGONAL not in str(err):
                # check_finite=False: a NaN or Inf below U (in L, solved unscaled) had been named a singular U
                refuse_nonfinite(triangle_max_abs(st.T, lower=True), "a triangular solve", name)
            raise _singular_factor(err, name, operation) from err
        report, recorded = solve_report(job, route="factored", plan=plan.to_dict(), flops=2 * n * n * k,
                                        method="two tiled triangular solves" + (" after the row swaps" if pivots
                                                                                   is not None else ""),
                                        phases={"tile updates (GEMM), diagonal solves (TRSM)": job.device})
        if q1 or q2:
            report["scaling"] = scaled_substitution(q1 or q2)
        return job.finish(ao, out, report, operation=operation, plan=plan.to_dict(), params=params, recorded=recorded)
