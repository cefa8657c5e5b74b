"""Column centering and scaling applied inside the passes, never as a copy of ``A``.

Centered (and standardized) factorizations work on ``A_c = (A - 1 mu^T) D^{-1}`` with ``mu`` the
column means and ``D`` the column standard deviations (or ``I``). ``A_c`` is never formed: the
kernels apply it as a rank-one correction of the products with ``A``,

    ``A_c Q = A (D^{-1} Q) - 1 (mu^T D^{-1} Q)``,   ``A_c^T Y = D^{-1} (A^T Y - mu (1^T Y))``,

so a pass costs what the uncentered pass costs plus ``O(rows x columns of Q)``. The algorithms work
on the tall orientation ``B`` of ``A`` (``B = A`` or ``A^T``), where the correction reads

    ``B_c = diag(r) (B - a b^T) diag(c)``

with ``a = 1, b = mu, c = 1/sd, r = 1`` for ``B = A`` and ``a = mu, b = 1, c = 1, r = 1/sd`` for
``B = A^T``; :class:`Shift` holds these four vectors. The means and variances come from one pass over
``A`` (:func:`column_moments`), computed in float64 with Chan, Golub and LeVeque's pairwise update,
so they do not suffer the cancellation of ``E[x^2] - E[x]^2``. The update adds ``n_1 n_2 / n d^2`` for
the difference ``d`` of two parts' means, so an error in a part's mean enters the variance at first
order, ``2 d delta``: each part keeps its mean as a *shift* (its mean as first summed, a float64) plus the
mean of its deviations from that shift (:func:`_strip_moments`), and ``d`` is formed from the shifts'
difference (exact by Sterbenz's lemma where the data's spread is small beside its means) plus the
offsets' (:func:`_merge`). With a part's mean summed directly, the rounding of a sum of values of size
``|mu|`` (about ``u sqrt(r) |mu|``) had given standard deviations off by ``3e-10`` relative where the means
were ``10^7`` times the spread; with the shifts they are within a few ``u`` of two-pass NumPy's.

Complex data (LAPACK's conventions, as :func:`blocklin.svd`): the means are complex (complex128), the
variances real, ``mean |x - mu|^2``; the pairwise update adds ``|d|^2`` and the co-moments
``conj(d) d^T`` (the entries of ``A_c^H A_c`` are ``sum_i conj(a_ij) a_ik``), and the correction of
the adjoint products reads ``B_c^H Y = diag(c) (B^H (r Y) - conj(b) (a^H r Y))``.

The correction is exact in exact arithmetic; in floating point the products ``A Q`` are formed
before the mean is removed, so their rounding error is relative to ``||A||`` rather than
``||A - 1 mu^T||``: when the means dwarf the spread of the columns by ``10^3`` or more, float32
loses that factor of accuracy and float64 is the remedy (or a matrix that fits the budget, which is
centered in memory before any product).

References
----------
T. F. Chan, G. H. Golub, R. J. LeVeque, "Algorithms for computing the sample variance: analysis and
recommendations", The American Statistician 37(3), 1983.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from blocklin.device import pool
from blocklin.device.syrk import block_rows, syrk_acc, symmetrize_lower
from blocklin.errors import BudgetError
from blocklin.plan.gram import MAX_GRAM_STRIP_BYTES, MIN_GRAM_ROWS
from blocklin.plan.passes import PassMemory
from blocklin.runtime.passes import plan_kernel_pass, row_kernel, run_pass, source


@dataclasses.dataclass(frozen=True)
class Moments:
    """Column means and variances (``ddof=0``) of an ``m x n`` matrix, over its ``m`` rows: float64, or
    of complex data complex128 means and real float64 variances ``mean |x - mu|^2``. ``nonzero``: whether
    each column holds a nonzero entry (:func:`nonzero_columns`; ``None``: not known), which a mean and
    variance that underflowed to 0 no longer tell."""

    mean: np.ndarray
    var: np.ndarray
    count: int
    nonzero: np.ndarray | None = None

    def variance(self, ddof: int = 0) -> np.ndarray:
        """Column variances with ``ddof`` delta degrees of freedom (``ddof=1``: the sample variance)."""
        return self.var * (self.count / max(self.count - ddof, 1))

    @property
    def constant(self) -> np.ndarray:
        """The columns taken as constant (:func:`constant_columns`)."""
        return constant_columns(self.var, self.mean, self.count)

    @property
    def std(self) -> np.ndarray:
        """Population standard deviations, with 1 for a constant column (as scikit-learn's
        ``StandardScaler``: a constant column stays zero after centering instead of becoming NaN)."""
        return np.where(self.constant, 1.0, np.sqrt(self.var))


def constant_columns(var: np.ndarray, mean: np.ndarray, count: int) -> np.ndarray:
    """Columns whose variance is within the rounding of their sums: scikit-learn's ``StandardScaler``
    rule (``_is_constant_feature``), ``var <= m eps var + (m |mean| eps)^2`` over ``m`` rows. A column
    of one repeated value has a variance of rounding (``5e-16`` relative to its mean, measured), not 0:
    divided by its square root it became a component of noise (found by a randomized search)."""
    eps = float(np.finfo(np.float64).eps)
    var = np.asarray(var, dtype=np.float64)
    return var <= count * eps * var + (count * np.abs(mean) * eps) ** 2


def nonzero_columns(b: Any, mean: np.ndarray) -> np.ndarray:
    """Whether each column of the block ``b`` holds a nonzero entry, given the block's column means as
    summed: a column whose mean is nonzero does; only the others (zero columns, or sums that cancelled or
    underflowed to 0) are read again, so well-scaled data costs a comparison per column. Exact: the
    moments of a column of entries ``2^-600`` that sum to 0 are 0, as a zero column's are."""
    nonzero = np.asarray(mean) != 0
    rest = np.flatnonzero(~nonzero)
    if rest.size:
        nonzero[rest] = np.any(np.asarray(b)[:, rest] != 0, axis=0)
    return nonzero


def acc_dtype(dtype: Any) -> np.dtype:
    """The accumulation dtype of sums over the data: float64, complex128 of complex data."""
    return np.dtype(np.complex128 if np.dtype(dtype).kind == "c" else np.float64)


def abs2(d: np.ndarray) -> np.ndarray:
    """``|d|^2`` (real, without the square root and square of ``abs``)."""
    if d.dtype.kind != "c":
        return d * d
    return d.real * d.real + d.imag * d.imag


def _merge(n1: int, k1: np.ndarray, o1: np.ndarray, s1: np.ndarray, n2: int, k2: np.ndarray, o2: np.ndarray,
           s2: np.ndarray) -> tuple:
    """Chan, Golub and LeVeque's pairwise update of (count, shift, mean offset, sum of squared deviations),
    each part's mean ``k + o``; ``|d|^2`` of complex means.

    ``d = (k_2 - k_1) + (o_2 - o_1)``: the shifts' difference is exact where they are within a factor 2
    of each other (Sterbenz), the offsets are small, so ``d`` is accurate relative to itself rather than to
    the means, and the term ``n_1 n_2 / n |d|^2`` stays accurate however large the means (T. F. Chan,
    G. H. Golub, R. J. LeVeque, "Algorithms for computing the sample variance: analysis and
    recommendations", The American Statistician 37(3), 1983, eq. 1.5, with shifted data, sec. 3). The
    result keeps the first part's shift."""
    n = n1 + n2
    d = (k2 - k1) + (o2 - o1)
    return n, k1, o1 + d * (n2 / n), s1 + s2 + abs2(d) * (n1 * n2 / n)


def _shift_and_offset(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``x`` (a float64 or complex128 block, ``r x w``, overwritten) turned into its deviations from its
    column means, and those means as (shift, offset): the shift is the mean as first summed, the offset
    the mean of ``x - shift``, which the naive sum's rounding (about ``u sqrt(r) |mean|``) leaves."""
    r = max(x.shape[0], 1)
    shift = x.sum(axis=0) / r
    x -= shift
    offset = x.sum(axis=0) / r
    x -= offset
    return shift, offset


def _acc_bytes(source: Any) -> int:
    return acc_dtype(source.dtype).itemsize


def _moments_memory(params: Any, sources: tuple) -> PassMemory:
    w, e = sources[0].width, _acc_bytes(sources[0])
    # mean and M2 accumulators, and the deviations of one cache-sized block of rows (twice: complex |d|^2)
    return PassMemory(fixed=4 * w * e + 2 * params["sub_bytes"] + 2 * e * w, chunk_temporaries=True, write_row_bytes=0)


#: Bytes of the float64 deviations of one sub-block of a strip: small enough to stay in cache (a whole
#: strip's float64 copy is memory-bound and took several times the pass's products).
_SUB_BYTES = 1 << 21


def sub_bytes(job: Any, memory: int | None) -> int:
    """The bytes of one block of float64 deviations: :data:`_SUB_BYTES`, within a 32nd of the budget (the
    means pass runs within the budget planned for the method's own passes, which do not count it)."""
    return max(1, min(_SUB_BYTES, (memory or job.cfg.memory) // 32))


def _strip_moments(b: Any, sub: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Column means, as (shift, offset), and sums of squared deviations of a strip, in float64 (complex128
    means of complex data): the shift is the mean as first summed; the deviations from it, by cache-sized
    blocks of rows, give the offset (their mean, what the sum's rounding left) and their squares, whose
    sum less ``r |offset|^2`` is the strip's M2 (no cancellation: the offset is at the rounding level of the
    mean). The mean ``shift + offset`` is then accurate to its own rounding, which the pairwise update
    needs (:func:`_merge`). Last, which columns hold a nonzero entry (:func:`nonzero_columns`)."""
    b = np.asarray(b)
    r = b.shape[0]
    acc = acc_dtype(b.dtype)
    shift = b.sum(axis=0, dtype=acc) / max(r, 1)
    total = np.zeros(b.shape[1], dtype=acc)
    m2 = np.zeros(b.shape[1])
    step = max(1, sub // (acc.itemsize * max(1, b.shape[1])))
    for i in range(0, r, step):
        d = b[i:i + step].astype(acc)
        d -= shift
        total += d.sum(axis=0)
        if acc.kind == "c":
            m2 += abs2(d).sum(axis=0)
            continue
        np.square(d, out=d)
        m2 += d.sum(axis=0)
    offset = total / max(r, 1)
    return shift, offset, np.maximum(m2 - abs2(offset) * r, 0.0), nonzero_columns(b, shift)


@row_kernel(memory=_moments_memory, device="cpu")  # a reduction of the data read: no device products
def moments_kernel(device: Any, arrays: tuple, rows: slice, params: Any, state: Any) -> tuple[Any, None]:
    """Per strip, the (count, mean, M2) of its columns merged into the state (``axis=0``), or, for
    column strips of ``A`` (``params["rows_are_columns"]``), the complete mean and M2 of each row
    collected as blocks."""
    if params["rows_are_columns"]:
        shift, offset, m2, nonzero = _strip_moments(np.asarray(arrays[0]).T, params["sub_bytes"])
        blocks = state or []
        blocks.append((rows.start, shift + offset, m2, nonzero))
        return blocks, None
    *part, nonzero = _strip_moments(arrays[0], params["sub_bytes"])
    r = rows.stop - rows.start
    if state is None:
        return (r, *part, nonzero), None
    return (*_merge(*state[:4], r, *part), state[4] | nonzero), None


def _moments_normal_memory(params: Any, sources: tuple) -> PassMemory:
    n, c = params["Q"].shape
    w = params["Q"].dtype.itemsize
    e = _acc_bytes(sources[0])
    base = _moments_memory(params, sources)
    # Q, the float64 Z and one strip's product B_i^T Y_i (and its float64 copy); per row Y_i (and its
    # conjugate of complex data)
    return PassMemory(fixed=base.fixed + n * c * (w + e + w + e), per_row=c * w * (2 if e == 16 else 1),
                      chunk_temporaries=True, write_row_bytes=0)


@row_kernel(memory=_moments_normal_memory, device="cpu")
def moments_normal_kernel(device: Any, arrays: tuple, rows: slice, params: Any, state: Any) -> tuple[Any, None]:
    """The column moments (as :func:`moments_kernel`) and the uncentered ``Z = A^T (A Q)`` of one pass:
    ``Y_i = A_i Q`` and ``A_i^T Y_i`` in the working precision per strip, summed over strips in float64
    (complex: ``A_i^H Y_i = conj(A_i^T conj(Y_i))``, summed in complex128; ``A_i`` is never conjugated)."""
    b = np.asarray(arrays[0])
    y = b @ params["Q"]
    if y.dtype.kind == "c":
        z = np.conjugate(b.T @ np.conjugate(y)).astype(np.complex128)
    else:
        z = (b.T @ y).astype(np.float64)
    *part, nonzero = _strip_moments(b, params["sub_bytes"])
    r = rows.stop - rows.start
    if state is None:
        return (r, *part, z, nonzero), None
    return (*_merge(*state[:4], r, *part), state[4] + z, state[5] | nonzero), None


def _merge_comoments(n1: int, k1: np.ndarray, o1: np.ndarray, c1: np.ndarray, n2: int, k2: np.ndarray,
                     o2: np.ndarray, c2: np.ndarray | None) -> tuple:
    """:func:`merge_comoments` of parts whose means are kept as (shift, offset), as :func:`_merge` keeps
    them (the rank-one term from ``d = (k_2 - k_1) + (o_2 - o_1)``, accurate however large the means):
    ``(n, k_1, offset, c_1)``, ``c_1`` updated in place."""
    n = n1 + n2
    d = (k2 - k1) + (o2 - o1)
    if c2 is not None:
        c1 += c2
    c1 += np.outer(np.conjugate(d), d * (n1 * n2 / n))
    return n, k1, o1 + d * (n2 / n), c1


def merge_comoments(n1: int, m1: np.ndarray, c1: np.ndarray, n2: int, m2: np.ndarray,
                     c2: np.ndarray | None) -> tuple:
    """:func:`_merge` for co-moment matrices, in place in ``c1``: ``C = C_1 + C_2 + (n_1 n_2 / n) d d^T``
    (``c2`` ``None``: already added to ``c1``); of complex data ``conj(d) d^T``, the rank-one term of
    ``A^H A``."""
    n = n1 + n2
    d = m2 - m1
    if c2 is not None:
        c1 += c2
    c1 += np.outer(np.conjugate(d), d * (n1 * n2 / n))
    return n, m1 + d * (n2 / n), c1


#: Bytes of the float64 (complex128) deviations the Gram-forming means passes make and sum at a time, a
#: block of a strip's rows: the strip is read from memory once, and a tall strip costs no more than a
#: short one. The means pass of a 1 GiB float32 A (two tasks, the 2-core machine, medians of 4): tall
#: 4194304 x 64 at 64, 128, 256 MiB 1.05, 0.67, 0.87 s with whole strips, 0.70, 0.72, 0.66 by 8 MiB
#: blocks (0.72, 0.71, 0.70 by 2 MiB); wide 64 x 4194304 at 128 and 512 MiB 0.93 and 1.10 s whole,
#: 1.05 and 0.79 by 8 MiB blocks (1.17-1.25 and 0.79 by 2 MiB).
MOMENTS_BLOCK_BYTES = 8 << 20


def _moments_gram_memory(params: Any, sources: tuple) -> PassMemory:
    w, e = sources[0].width, _acc_bytes(sources[0])
    # the co-moment accumulator and the rank-one merge term, means; per row the float64 deviations (a
    # block of at most MOMENTS_BLOCK_BYTES of them: counted per row, so that a small pass's least
    # budget does not hold a whole block); it writes nothing
    return PassMemory(fixed=2 * w * w * e + 4 * w * e, per_row=w * e, chunk_temporaries=True,
                      max_strip_bytes=MAX_GRAM_STRIP_BYTES, min_rows=MIN_GRAM_ROWS, write_row_bytes=0)


@row_kernel(memory=_moments_gram_memory, device="cpu")
def moments_gram_kernel(device: Any, arrays: tuple, rows: slice, params: Any, state: Any) -> tuple[Any, None]:
    """The column count, means and co-moment matrix ``(A_i - 1 m_i^T)^T (A_i - 1 m_i^T)`` of each block
    ``A_i`` of a strip's rows (float64 SYRK of the deviations from the block's own means, lower triangle),
    merged into the state by Chan, Golub and LeVeque's pairwise update: the centered Gram ``A_c^T A_c``
    without the cancellation of ``A^T A - m mu mu^T``. Complex: complex128 deviations, ``A_c^H A_c`` by
    HERK."""
    a = np.asarray(arrays[0])
    r, w = a.shape
    acc = acc_dtype(a.dtype)
    # By blocks of rows (MOMENTS_BLOCK_BYTES; each block centered by its own means and merged as strips
    # are), in a buffer the run's previous strip left (fresh ones fault every page: pool).
    step = block_rows(w, acc, MOMENTS_BLOCK_BYTES)
    with pool.borrowed((min(step, r), w), acc) as buf:
        for r0 in range(0, r, step):
            d = buf[: min(step, r - r0)]
            np.copyto(d, a[r0:r0 + d.shape[0]])
            k = d.shape[0]
            # the block's mean as (shift, offset) and d its deviations from it (the merges need the
            # mean accurate to its rounding: _merge)
            shift, offset = _shift_and_offset(d)
            nonzero = nonzero_columns(a[r0:r0 + k], shift)
            if state is None:
                state = (k, shift, offset, np.zeros((w, w), acc), nonzero)
                syrk_acc(state[3], d)
            else:
                syrk_acc(state[3], d)  # the block's co-moments, added in place
                # rows far from the running means overflow the rank-one term to Inf: each caller reads
                # non-finite co-moments (a refusal, or a scaled repeat of the pass), NumPy's warning would only alarm
                with np.errstate(over="ignore", invalid="ignore"):
                    state = (*_merge_comoments(*state[:4], k, shift, offset, None), state[4] | nonzero)
    return state, None


def plan_moments_gram(job: Any, A: Any, *, memory: int | None = None, reserve: int = 0,
                      min_tasks: int | None = None, workers: int | None = None) -> Any:
    """The pass of :func:`moments_and_gram` within ``memory`` (planned before anything is read: a
    budget too small raises :class:`~blocklin.errors.BudgetError` with the minimum)."""
    return plan_kernel_pass(job, moments_gram_kernel, [source(A)], {}, memory=memory, reserve=reserve,
                            min_tasks=min_tasks, workers=workers)


def moments_and_gram(job: Any, A: Any, *, memory: int | None = None, reserve: int = 0,
                     min_tasks: int | None = None, workers: int | None = None,
                     scale: dict | None = None) -> tuple[Moments, np.ndarray]:
    """The column moments of a tall ``A`` and its centered Gram ``A_c^T A_c`` (full, float64) in one pass.

    Each strip contributes the Gram of its deviations from its own means, and the strips' co-moments
    are merged exactly as the variances are (:func:`_merge`), so the result is as accurate as the Gram
    of the centered matrix, whatever the size of the means. ``A^T A`` itself is
    ``A_c^T A_c + m mu mu^T``. ``min_tasks``, ``workers``: the pass's split (each task keeps its ``n x n``
    sum until the pass ends). Complex: ``A_c^H A_c`` (Hermitian, complex128), ``A^H A = A_c^H A_c + m
    conj(mu) mu^T``."""
    plan = plan_moments_gram(job, A, memory=memory, reserve=reserve, min_tasks=min_tasks, workers=workers)
    states, _ = run_pass(job, moments_gram_kernel, [source(A)], {}, plan=plan, scale=scale,
                         description="column means and the centered Gram (pass over A)")
    cnt, shift, offset, c, nonzero = states[0]
    for st in states[1:]:  # row order: the result does not depend on the scheduler
        cnt, shift, offset, c = _merge_comoments(cnt, shift, offset, c, *st[:4])
        nonzero = nonzero | st[4]
    c = symmetrize_lower(c)
    return Moments(shift + offset, np.diag(c).real.copy() / cnt, cnt, nonzero), c


def _row_gram_memory(params: Any, sources: tuple) -> PassMemory:
    src = sources[0]
    w, e = src.width, _acc_bytes(src)
    # the Gram accumulator and its merge copy (the rows' means and M2, kept by the tasks until the pass
    # ends, are held by the pass as a whole: plan_moments_row_gram); per strip row the float64
    # deviations (a block of at most MOMENTS_BLOCK_BYTES of them, counted per row so that a small
    # pass's least budget does not hold a whole block; the same buffer then holds the rows themselves,
    # divided by their deviations, when standardized without centering), and their squares of complex
    # data. It writes nothing.
    copies = 2 if np.dtype(src.dtype).kind == "c" else 1
    return PassMemory(fixed=2 * w * w * e, per_row=copies * w * e, chunk_temporaries=True,
                      max_strip_bytes=MAX_GRAM_STRIP_BYTES, min_rows=MIN_GRAM_ROWS, write_row_bytes=0)


@row_kernel(memory=_row_gram_memory, device="cpu")
def row_moments_gram_kernel(device: Any, arrays: tuple, rows: slice, params: Any, state: Any) -> tuple[Any, None]:
    """Per strip of rows of ``B = A^T`` (column strips of a wide ``A``: each row a whole column of ``A``),
    each row's mean and sum of squared deviations, and the lower triangle of the Gram of the rows
    centered by their own means (``center``) and/or divided by their standard deviations
    (``standardize``) as they are read: ``B_c^H B_c`` summed by SYRK (HERK) in float64 (complex128)."""
    b = np.asarray(arrays[0])
    h, w = b.shape
    acc = acc_dtype(b.dtype)
    if state is None:
        state = {"g": np.zeros((w, w), acc), "rows": []}
    mean, m2, nonzero = np.empty(h, acc), np.empty(h), np.empty(h, bool)
    # The deviations by blocks of rows (MOMENTS_BLOCK_BYTES; each row's mean is its own), in a buffer the
    # run's previous strip left (fresh ones fault every page: pool), in the strip's own order: a strip of
    # B = A^T comes by columns (A's rows), and SYRK sums it as it lies (device.syrk). On 65536 x 64
    # float32 strips, the whole strip copied into rows and its squares into a temporary took 28.6 ms,
    # the strip summed by columns and its squares' sum taken without a temporary 15.2 ms.
    step = block_rows(w, acc, MOMENTS_BLOCK_BYTES)
    by_columns = not b.flags.c_contiguous
    with pool.borrowed((w, min(step, h)) if by_columns else (min(step, h), w), acc) as buf:
        rows_of = buf.T if by_columns else buf
        for r0 in range(0, h, step):
            r1 = min(h, r0 + step)
            d = rows_of[: r1 - r0]
            np.copyto(d, b[r0:r1])
            mu = mean[r0:r1]
            np.divide(d.sum(axis=1), max(w, 1), out=mu)
            nonzero[r0:r1] = nonzero_columns(b[r0:r1].T, mu)
            d -= mu[:, None]
            m2[r0:r1] = abs2(d).sum(axis=1) if d.dtype.kind == "c" else np.einsum("ij,ij->i", d, d)
            if not params["center"]:  # standardized only: the rows themselves, scaled
                np.copyto(d, b[r0:r1])
            if params["standardize"]:
                var = m2[r0:r1] / max(w, 1)
                # a constant row keeps its scale 1 (Moments.std)
                d /= np.where(constant_columns(var, mu, w), 1.0, np.sqrt(var))[:, None]
            syrk_acc(state["g"], d)
    state["rows"].append((rows.start, mean, m2, nonzero))
    return state, None


def plan_moments_row_gram(job: Any, A: Any, *, center: bool, standardize: bool, memory: int | None = None,
                          reserve: int = 0, min_tasks: int | None = None, workers: int | None = None) -> Any:
    """The pass of :func:`moments_and_row_gram` within ``memory`` (planned before anything is read: a
    budget too small raises :class:`~blocklin.errors.BudgetError` with the minimum).

    Every column's mean and M2 are held until the pass ends, by the tasks that made them: ``n``
    of each in all whatever the split, reserved beside ``reserve`` rather than counted per task."""
    held = A.shape[1] * (acc_dtype(A.dtype).itemsize + 8)
    return plan_kernel_pass(job, row_moments_gram_kernel, [source(A, transposed=True)],
                            {"center": bool(center), "standardize": bool(standardize)}, memory=memory,
                            reserve=reserve + held, min_tasks=min_tasks, workers=workers)


def moments_and_row_gram(job: Any, A: Any, *, center: bool, standardize: bool, memory: int | None = None,
                         reserve: int = 0, min_tasks: int | None = None, workers: int | None = None,
                         scale: dict | None = None) -> tuple[Moments, np.ndarray]:
    """The column moments of a wide ``m x n`` ``A`` and the ``m x m`` Gram of its centered (and/or
    standardized) columns, ``A_c A_c^H`` (of complex data its conjugate, ``B_c^H B_c`` with
    ``B_c = A_c^T``), in one pass over column strips of ``A``.

    Each strip holds whole columns, so every column is centered by its own exact mean before its
    square is added: the Gram is that of the centered matrix, without the cancellation of
    ``A A^H - (A mu) 1^T - 1 (A mu)^H + (mu^H mu) 1 1^T`` (which loses the ratio of the means to the
    spread, squared). Float64 (complex128) sums; the task sums are added in row order, so the bits do
    not depend on the scheduler. ``min_tasks``, ``workers``: the pass's split (each task keeps its
    ``m x m`` sum until the pass ends)."""
    params = {"center": bool(center), "standardize": bool(standardize)}
    plan = plan_moments_row_gram(job, A, center=center, standardize=standardize, memory=memory, reserve=reserve,
                                 min_tasks=min_tasks, workers=workers)
    states, _ = run_pass(job, row_moments_gram_kernel, [source(A, transposed=True)], params, plan=plan, scale=scale,
                         description="column means and the centered Gram of the rows (pass over A)")
    m, n = A.shape
    mean, m2, nonzero, g = np.empty(n, acc_dtype(A.dtype)), np.empty(n), np.empty(n, bool), None
    for st in states:  # row order: the result does not depend on the scheduler
        part = np.asarray(st["g"])
        # the first task's sum is the total where writable (a state from a cluster may be read-only)
        g = (part if part.flags.writeable else part.copy()) if g is None else np.add(g, part, out=g)
        for r0, mu, s, nz in st["rows"]:
            mean[r0:r0 + mu.size], m2[r0:r0 + mu.size], nonzero[r0:r0 + mu.size] = mu, s, nz
    return Moments(mean, m2 / m, m, nonzero), symmetrize_lower(g)


def _moments_params(job: Any, A: Any, memory: int | None, reserve: int) -> dict:
    wide = A.shape[0] < A.shape[1]
    # the deviations' blocks within the part of the budget the pass has (the bits follow the pass's budget)
    pass_memory = None if memory is None else memory - reserve
    return {"rows_are_columns": wide, "sub_bytes": sub_bytes(job, pass_memory)}


def plan_column_moments(job: Any, A: Any, *, memory: int | None = None, reserve: int = 0) -> Any:
    """The pass of :func:`column_moments` within ``memory`` with ``reserve`` of it held outside the pass
    (planned before anything is read: a budget too small raises :class:`~blocklin.errors.BudgetError`
    naming the whole budget that suffices)."""
    return plan_kernel_pass(job, moments_kernel, [source(A, transposed=A.shape[0] < A.shape[1])],
                            _moments_params(job, A, memory, reserve), memory=memory, reserve=reserve)


def column_moments(job: Any, A: Any, *, memory: int | None = None, reserve: int = 0, over: str = "a",
                   scale: dict | None = None) -> Moments:
    """Column means and variances of ``A`` in one pass (row strips of ``A``, or column strips for a
    wide ``A`` so each strip holds whole columns); float64 whatever the dtype of ``A``. ``reserve``: the
    part of ``memory`` held outside the pass (the factorization's in-memory work)."""
    m, n = A.shape
    wide = m < n
    plan = plan_column_moments(job, A, memory=memory, reserve=reserve)
    states, _ = run_pass(job, moments_kernel, [source(A, transposed=wide)], _moments_params(job, A, memory, reserve),
                         plan=plan, over=over, scale=scale, description=f"column means (pass over {over.upper()})")
    if wide:
        mean, m2, nonzero = np.empty(n, acc_dtype(A.dtype)), np.empty(n), np.empty(n, bool)
        for st in states:
            for r0, mu, s, nz in st:
                mean[r0:r0 + mu.size], m2[r0:r0 + mu.size], nonzero[r0:r0 + mu.size] = mu, s, nz
        return Moments(mean, m2 / m, m, nonzero)
    cnt, shift, offset, m2, nonzero = states[0]
    for st in states[1:]:  # row order: the result does not depend on the scheduler
        cnt, shift, offset, m2 = _merge(cnt, shift, offset, m2, *st[:4])
        nonzero = nonzero | st[4]
    return Moments(shift + offset, m2 / cnt, cnt, nonzero)


def moments_and_normal(job: Any, A: Any, q: np.ndarray, *, memory: int | None = None, reserve: int = 0,
                       scale: dict | None = None) -> tuple[Moments, np.ndarray]:
    """The column moments of a tall ``A`` and the centered ``A_c^T A_c Q`` in one pass.

    ``A_c^T A_c Q = A^T (A Q) - m mu (mu^T Q)`` (with ``A^T 1 = m mu``): the first product of a
    centered power or Lanczos iteration needs no means beforehand, so the means cost no pass of their
    own. The uncentered product is rounded relative to ``||A||^2``, as the in-pass correction of the
    later passes is (see the module docstring); its float64 sum over strips keeps the accumulation
    from adding to that. Complex: ``A_c^H A_c Q = A^H (A Q) - m conj(mu) (mu^T Q)``."""
    params = _normal_params(job, A, q, memory, reserve)
    qd = params["Q"]
    states, _ = run_pass(job, moments_normal_kernel, [source(A)], params, memory=memory, reserve=reserve, scale=scale,
                         description="column means and the first product (pass over A)")
    cnt, shift, offset, m2, z, nonzero = states[0]
    for st in states[1:]:  # row order: the result does not depend on the scheduler
        cnt, shift, offset, m2 = _merge(cnt, shift, offset, m2, *st[:4])
        z, nonzero = z + st[4], nonzero | st[5]
    mean = shift + offset
    return Moments(mean, m2 / cnt, cnt, nonzero), z - cnt * np.outer(np.conjugate(mean), mean @ qd.astype(z.dtype))


def moments_and_normal_fits(job: Any, A: Any, q: np.ndarray, *, memory: int | None = None,
                            reserve: int = 0) -> bool:
    """Whether the pass of :func:`moments_and_normal` plans within ``memory`` (its ``Q`` and product
    beside the strips are more than the means pass holds); if not, the means take a pass of their own."""
    try:
        plan_kernel_pass(job, moments_normal_kernel, [source(A)], _normal_params(job, A, q, memory, reserve),
                         memory=memory, reserve=reserve)
    except BudgetError:
        return False
    return True


def _normal_params(job: Any, A: Any, q: np.ndarray, memory: int | None, reserve: int = 0) -> dict:
    pass_memory = None if memory is None else memory - reserve
    return {"Q": np.ascontiguousarray(q.astype(A.dtype)), "rows_are_columns": False,
            "sub_bytes": sub_bytes(job, pass_memory)}


def moments_incore(b: np.ndarray, transposed: bool) -> Moments:
    """:class:`Moments` of ``A`` from its tall orientation ``b`` held in memory (no pass), by blocks of
    rows so that the float64 temporaries stay small beside ``b``."""
    step = max(1, (1 << 20) // max(1, b.shape[1]))
    acc = acc_dtype(b.dtype)
    if transposed:  # each row of b is a column of A
        mean, m2, nonzero = np.empty(b.shape[0], acc), np.empty(b.shape[0]), np.empty(b.shape[0], bool)
        for r0 in range(0, b.shape[0], step):
            x = b[r0:r0 + step].astype(acc)
            mean[r0:r0 + x.shape[0]] = mu = x.mean(axis=1)
            m2[r0:r0 + x.shape[0]] = abs2(x - mu[:, None]).sum(axis=1)
            nonzero[r0:r0 + x.shape[0]] = nonzero_columns(b[r0:r0 + step].T, mu)
        return Moments(mean, m2 / b.shape[1], b.shape[1], nonzero)
    state = nonzero = None
    for r0 in range(0, b.shape[0], step):
        x = b[r0:r0 + step].astype(acc)
        shift, offset = _shift_and_offset(x)  # x: the deviations (the merges need accurate means: _merge)
        nz = nonzero_columns(b[r0:r0 + step], shift)
        part = (x.shape[0], shift, offset, abs2(x).sum(axis=0))
        state, nonzero = (part, nz) if state is None else (_merge(*state, *part), nonzero | nz)
    cnt, shift, offset, m2 = state
    return Moments(shift + offset, m2 / cnt, cnt, nonzero)


@dataclasses.dataclass(frozen=True)
class Shift:
    """``B_c = diag(r) (B - a b^T) diag(c)`` for the tall orientation ``B`` (``None``: all ones;
    ``b`` is ``None`` when nothing is subtracted)."""

    a: np.ndarray | None
    b: np.ndarray | None
    c: np.ndarray | None
    r: np.ndarray | None
    N: int

    @classmethod
    def of(cls, moments: Moments, *, center: bool, scale: bool, transposed: bool) -> Shift:
        inv = 1.0 / moments.std if scale else None
        mu = moments.mean if center else None
        if not transposed:  # B = A: columns of B are the columns of A
            return cls(a=None, b=mu, c=inv, r=None, N=moments.mean.size)
        # B = A^T: the rows of B are the columns of A; N = m
        return cls(a=mu, b=None if mu is None else np.ones(moments.count), c=None, r=inv, N=moments.count)

    def premultiply(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """``(diag(c) Q, b^T diag(c) Q)``: the operand of the pass and the row offset ``beta``."""
        qc = q if self.c is None else q * self.c[:, None]
        beta = None if self.b is None else (self.b @ qc)[None, :]
        return qc, beta

    def finish(self, zraw: np.ndarray, t: np.ndarray | None) -> np.ndarray:
        """``B_c^T Y = diag(c) (B^T (r Y) - b (a^T r Y))`` from the pass's ``B^T (r Y)`` and ``a^T (r Y)``
        (complex: ``B_c^H Y`` from ``B^H (r Y)`` and ``a^H (r Y)``, with ``conj(b)``)."""
        z = zraw if t is None or self.b is None else zraw - np.conjugate(self.b)[:, None] * t
        return z if self.c is None else z * self.c[:, None]

    def params(self, dtype: Any) -> dict:
        """Kernel parameters (``shift_a``: the per-row vector, ``shift_r``: the row scale)."""
        dt = np.dtype(dtype)
        return {"shift_a": None if self.a is None else self.a.astype(dt)[:, None],
                "shift_r": None if self.r is None else self.r.astype(dt)[:, None],
                "shifted": self.b is not None}

    def apply_incore(self, x: np.ndarray) -> None:
        """Center and scale the in-memory tall orientation ``x`` in place (the budget holds it)."""
        if self.b is not None:  # the two forms of :meth:`of`: a = 1 (subtract b from every row) or b = 1
            x -= self.b.astype(x.dtype)[None, :] if self.a is None else self.a.astype(x.dtype)[:, None]
        if self.c is not None:
            x *= self.c.astype(x.dtype)[None, :]
        if self.r is not None:
            x *= self.r.astype(x.dtype)[:, None]
