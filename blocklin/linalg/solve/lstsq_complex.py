"""``lstsq`` of complex data: the minimum-norm solution from the streaming R factor and its SVD in memory.

The whole-space SVD that real ``lstsq`` takes (:mod:`blocklin.linalg.lowrank`) does not take complex
data; here the one-pass TSQR (:mod:`blocklin.linalg.blocks.tsqr`, Householder QR of complex strips)
gives the ``N x N`` factor ``R`` of ``A``'s tall orientation (``N = min(m, n)``), and LAPACK's SVD of
``R`` gives the singular values of ``A``, its rank at NumPy's ``rcond`` and the truncated-SVD solution
``xGELSS`` returns (Golub and Van Loan, *Matrix Computations*, 4th ed., 5.5.4), with LAPACK's conjugate
transposes:

* tall ``A = Q R`` (``m >= n``): the pass also gives ``Q^H b`` and the residual norms, and with
  ``R = W S Z^H``, ``x = Z S^+ W^H (Q^H b)``: no pass beyond the one over ``A`` and ``b``;
* wide ``A`` (``m < n``): ``A^T = Q R`` from the pass over ``A``'s columns and ``R = W S Z^H``, so
  ``A A^H = conj(Z) S^2 Z^T`` and ``x = A^H y`` with ``y = conj(Z) S^+2 Z^T b``: one more pass over ``A``
  (a GEMM, ``A^H y = conj(A^T conj(y))``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blocklin.linalg.blocks.result_range import check_columns, scaled_columns
from blocklin.linalg.blocks.scaling import Scaling, check_scaled_back_range
from blocklin.linalg.blocks.streaming_qr import tsqr_pass
from blocklin.linalg.blocks.tsqr import reduce_r, tsqr_kernel
from blocklin.linalg.solve.rcond import rank_cut
from blocklin.plan.solve import small_bytes
from blocklin.runtime.job import Job
from blocklin.runtime.passes import run_pass, source, take_recorded_peaks
from blocklin.runtime.powers import ldexp, max_exponent

C128 = np.dtype(np.complex128)


def is_complex(a: Any, b: np.ndarray) -> bool:
    """Whether ``lstsq`` of ``a`` and ``b`` is a complex problem (either operand complex)."""
    return np.iscomplexobj(b) or np.dtype(getattr(a, "dtype", np.float64)).kind == "c"


def lstsq_complex(a: Any, bb: np.ndarray, rcond: float | None, settings: dict) -> tuple:
    """``(x, residuals, rank, s, report)`` of ``min ||A x - b||`` of minimum norm, complex ``A`` or ``b``
    (``bb``: ``m x k`` in memory), computed in complex128 and returned in NumPy's result dtypes."""
    from blocklin.errors import ShapeError, explain
    from blocklin.validate import float_operand

    with Job("lstsq", **settings) as job:
        A = job.operand(a, "a", integers="cast")
        float_operand(A, "lstsq", complex_ok=True)
        m, n = A.shape
        if bb.shape[0] != m:
            raise ShapeError(explain("b", f"must have m = {m} rows (A is {m} x {n})", f"shape {bb.shape[:1]}",
                                     f"pass a right-hand side of length {m}"))
        rdt = np.result_type(A.dtype, bb.dtype, np.complex64)  # NumPy's result: complex64 stays complex64
        b = bb.astype(C128)
        # finite_for: with check_finite=False a NaN or Inf of A, which makes R non-finite, is refused by name when
        # the pass is judged (_in_range); it had reached NumPy's SVD of R ("SVD did not converge")
        sa = Scaling.of(source(A, transposed=m < n), C128, finite_for="lstsq")
        if m >= n:
            # each column of b near 1 (exact): Q^H b of a b near 2^-1062 had been rounded to subnormal numbers
            eb = column_exponents(b)
            B = job.operand(ldexp(b, -eb[None, :]), "b")
            sr = _in_range(job, sa, lambda sc: tsqr_pass(job, A, B, C128, scale=sc), lambda out: out.r)
            u, s, zh = np.linalg.svd(sr.r, full_matrices=False)  # s of 2^-ea A
            inv, cut, rank = _truncation(s, m, n, rcond)
            kept = (inv != 0)[:, None]  # divided by s (1 / s overflows below 2^-1024: x had been NaN)
            # x = 2^e z: c = U^H Q^H b (each column) and s brought near 1 by a power of two, so that S^+ c stays in
            # the range; one power for all columns had flushed a column 2^1000 below another to 0, silently
            c = np.where(kept, u.conj().T @ sr.qtb, 0.0)
            ec, es = column_exponents(c), max_exponent(s[:1])
            with np.errstate(over="ignore"):  # a dropped s's 1.0 may pass the top: its c is 0
                z = zh.conj().T @ (ldexp(c, -ec[None, :]) / np.where(kept, np.ldexp(s[:, None], -es), 1.0))
            e = ec + eb - es - sa.exponent
            # NumPy's rule: residuals only for a full-rank overdetermined system; ||T e_j||^2 of the
            # pass's residual factor (no difference of squares), of b's columns as scaled: times 2^(2 eb)
            with np.errstate(over="ignore", under="ignore"):  # beyond float64's range: Inf, as NumPy's
                residuals = np.ldexp(sr.rho, eb)**2 if rank == n and m > n else np.empty((0,))
        else:
            r = _in_range(job, sa, lambda sc: _r_of_transpose(job, A, sc), lambda out: out)
            _, s, zh = np.linalg.svd(r, full_matrices=False)  # 2^-ea A^T = Q W S Z^H
            inv, cut, rank = _truncation(s, m, n, rcond)
            z, e = _wide_solution(job, A, s, zh.conj().T, inv != 0, b, sa.exponent)
            residuals = np.empty((0,))
        report = job.report(operation="lstsq", method="streaming QR of A's tall orientation, SVD of R (complex)",
                            rank=rank, rcond=cut / float(s[0]) if s.size and s[0] > 0 else cut,
                            passes_total=job.passes(), scaling=sa.report())
        check_scaled_back_range("a", s, sa.exponent, "singular values")
        s = np.ldexp(s, sa.exponent)
    real = np.finfo(rdt).dtype
    x, cols = scaled_columns(z, e, rdt)  # rounded once; flushed to 0 or beyond the range refused, subnormal warned
    check_columns(cols, e, rdt, op="lstsq")
    return x, residuals.astype(real), rank, s.astype(real), report


def _in_range(job: Job, sa: Scaling, run: Any, r_of: Any) -> Any:
    """``run(scale)``, the pass giving the R factor (``r_of(result)``), with ``A`` divided by ``2^ea``
    (:class:`~blocklin.linalg.blocks.scaling.Scaling`, the real route's rule) where its recorded peaks
    give the power, else unscaled and made again scaled only where its R is not finite or ``max |a|`` is
    below ``2^-970`` (subnormal data): LAPACK's QR rescales by itself, but near ``2^1022`` the norms
    overflowed, and its SVD of that R had failed to converge. Data in range costs one pass (the real route's rerun of every pass beyond ``2^256``
    would add one where nothing overflows)."""
    take_recorded_peaks(job, [sa.source])
    if sa.path in job.amax:
        sa.learn(job)
    out = run(sa.params())
    if not sa.known:
        # and where max |a| is below 2^-970, whose entries eps below it are subnormal: R of such data had been
        # computed in the bits left there (x of A near 2^-1062 off by 3%)
        amax = float(job.amax.get(sa.path, 0.0))
        low = 2.0 ** -970  # tiny / 2^-52 is 2^-970: entries eps below max |a| are subnormal
        if (not np.isfinite(r_of(out)).all() or 0 < amax < low) and sa.learn(job):
            sa.extra_passes += 1
            return run(sa.params())
        sa.e = 0  # computed unscaled
    return out


def _truncation(s: np.ndarray, m: int, n: int, rcond: float | None) -> tuple[np.ndarray, float, int]:
    """``1/s_i`` over the values above ``rcond s_1`` (0 beyond), the cut, the rank (NumPy's default
    ``rcond``: ``eps max(m, n)``, the float64 ``eps`` the SVD ran in; LAPACK's rule for ``rcond`` outside
    ``(0, 1)``: :func:`~blocklin.linalg.solve.rcond.rank_cut`)."""
    cut = rank_cut(s, m, n, rcond, np.dtype(np.float64))
    keep = s > cut
    return np.where(keep, 1.0 / np.where(keep, s, 1.0), 0.0), cut, int(np.count_nonzero(keep))


def _wide_solution(job: Job, A: Any, s: np.ndarray, z: np.ndarray, keep: np.ndarray,
                   b: np.ndarray, ea: int = 0) -> tuple[np.ndarray, int]:
    """``x = A^H (A A^H)^+ b`` with ``(A A^H)^+ = conj(Z) S^+2 Z^T``, in powers of two that keep every
    factor in range: ``1 / s^2`` leaves float64's for ``s`` beyond ``2^+-512`` (entries near ``1e+-154``)
    where ``x`` itself does not (``A`` at ``2^700`` gave ``x = 0``; at ``2^-700``, NaN).

    With ``s = 2^e s'`` and ``b = 2^eb b'``: ``y' = conj(Z) S'^+2 Z^T b'`` is ``2^(2e - eb) y``; the
    product ``A^H y'`` is made on ``y'`` scaled by ``2^-(e + f)`` (``f`` its own power), so that it sits
    near 1, and ``x`` is that times ``2^(eb - e + f)``: only ``x`` itself can leave the range. ``eb`` and ``f``
    per column (columns of ``b`` far apart: one power for all had flushed the small ones). ``s`` and
    ``Z`` may be those of ``2^-ea A``: ``y'`` is then scaled by ``2^-ea`` more, the product being
    ``(2^-ea A)^H y'`` in range. Returns that product and ``eb - e + f - ea`` (the caller rounds ``x``
    once and judges it)."""
    e, eb = max_exponent(s[:1]), column_exponents(b)
    inv = np.where(keep, 1.0 / np.where(keep, np.ldexp(s, -e), 1.0), 0.0)
    y = z.conj() @ (inv[:, None] ** 2 * (z.T @ ldexp(b, -eb[None, :])))
    f = column_exponents(y)
    return _adjoint_product(job, A, ldexp(y, -(e + f + ea)[None, :])), eb - e + f - ea


def column_exponents(x: np.ndarray) -> np.ndarray:
    """:func:`~blocklin.runtime.powers.max_exponent` of each column of ``x``."""
    return np.array([max_exponent(x[:, j]) for j in range(x.shape[1])], dtype=np.int64)


def _r_of_transpose(job: Job, A: Any, scale: dict | None = None) -> np.ndarray:
    """The ``m x m`` R factor of ``A^T`` (``m < n``) from one streaming QR pass over ``A``'s columns
    (divided by the powers of two in ``scale``, :class:`~blocklin.linalg.blocks.scaling.Scaling`)."""
    m = A.shape[0]
    states, _ = run_pass(job, tsqr_kernel, [source(A, transposed=True)], {"dtype": C128.name},
                         reserve=small_bytes(m, 0), description="streaming QR of A^T", device="cpu", scale=scale)
    return np.array(reduce_r([st for st in states if st is not None], m))


def _adjoint_product(job: Job, A: Any, y: np.ndarray) -> np.ndarray:
    """``A^H y`` (``n x k``, in memory) by one out-of-core GEMM: ``conj(A^T conj(y))``."""
    from blocklin.linalg.products.gemm import Gemm
    from blocklin.runtime.tiles import open_array

    product = Gemm.of(A, job.operand(np.ascontiguousarray(y.conj()), "y"), trans_a=True, dtype=C128)
    plan = product.plan(job, read_reserve=True)
    path = job.scratch("x", product.shape, C128, plan.out_chunks)
    product.run(job, plan, path, description="x = A^H y", count_pass="a")
    return np.conj(open_array(path)[...])


__all__ = ["column_exponents", "is_complex", "lstsq_complex"]
