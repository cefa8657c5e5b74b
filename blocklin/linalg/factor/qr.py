"""``blocklin.qr``: QR factorization of tall and square matrices larger than memory.

Two routes, one result convention (``R`` with a non-negative diagonal):

* ``"tsqr"``: ``R`` alone when it fits in core, from the one-pass streaming TSQR of
  :mod:`blocklin.linalg.blocks.tsqr` (Demmel, Grigori, Hoemmen and Langou 2012): ``A`` is read once.
* ``"tiled"``: left-looking blocked Householder QR over column panels
  (:mod:`blocklin.linalg.factor.householder`), for ``R`` that does not fit in core and for ``Q``.
* ``"tiles"``: the tile Householder QR of Buttari, Langou, Kurzak and Dongarra (2009) on square
  tiles (:mod:`blocklin.linalg.factor.qr_tiles`): a task holds a few tiles, not an ``m``-row panel, so
  its tiles (and GEMMs) are larger within one budget; for square and near-square matrices.
"""

from __future__ import annotations

import math
from typing import Any, Unpack

import numpy as np

from blocklin.config import Settings, format_size
from blocklin.errors import BudgetError, ParameterError, warn
from blocklin.errors import explain as _msg
from blocklin.linalg.blocks.scaling import max_abs, refuse_nonfinite
from blocklin.linalg.blocks.streaming_qr import tsqr_pass
from blocklin.linalg.blocks.tsqr import MIN_STRIP_ROWS, diagonal_signs, positive_diagonal, signed_columns
from blocklin.matrix import Matrix
from blocklin.operands import decoded_chunks
from blocklin.plan.factor import QR_PANEL_BUFFERS, FactorPlan, plan_qr
from blocklin.plan.qrtiles import TileQRPlan, plan_tile_qr
from blocklin.plan.solve import small_bytes
from blocklin.runtime.blockops import BlockOps, Region
from blocklin.linalg.factor.householder import qr_extract_r, qr_form_q, qr_panels
from blocklin.linalg.factor.qr_tiles import tile_qr, tile_qr_form_q, tile_qr_stores
from blocklin.runtime.job import Job
from blocklin.runtime.tiles import check_finite
from blocklin.storage.identity import plan_settings, resume_token
from blocklin.storage.backend import backend
from blocklin.storage.space import named_as_output
from blocklin.storage.zarr_store import create_array, open_zarr, write_block
from blocklin.validate import choice, float_operand, not_empty, size

MODES = ("r", "reduced")
#: ``"auto"`` takes the streaming TSQR for ``R`` alone when its strips can hold this many times ``n``
#: rows: each strip costs a QR of ``[R; strip]``, ``2 (s + n) n^2`` flops for ``s`` rows, so short strips
#: multiply the work (measured for 8192 x 2048 float64 in 300 MiB, strips of about 1.2 n: TSQR 172 s,
#: tiled 35 s).
TSQR_STRIP_RATIO = 4
METHODS = ("auto", "tiled", "tiles", "tsqr")
REPORT_KEYS = ("method", "method_reason", "seconds", "flops", "gflops", "peak_memory", "diag_ratio", "tasks",
               "skipped")


def qr(a: Any, out: Any = None, *, q: Any = None, mode: str = "r", method: str = "auto", overwrite: bool = False,
       resume: bool = False, explain: bool = False, tile: int | None = None,
       **settings: Unpack[Settings]) -> Matrix | tuple[Matrix, Matrix] | FactorPlan:
    """QR factorization ``A = Q R`` of a matrix larger than memory, tall, square or wide.

    Parameters
    ----------
    a : path, zarr array, Matrix, NumPy or Dask array
        ``m x n``, float32, float64, complex64 or complex128. Never modified. A wide ``A`` (``m < n``) gives ``R`` ``m x n``
        upper trapezoidal and ``Q`` ``m x m`` (the Householder QR of its leading block in memory, then
        one GEMM pass: :func:`_wide`).
    out : path, optional
        Output store of ``R`` (``n x n``, upper triangular; atomic).
    q : path, optional
        Output store of the thin ``Q`` (``m x n``, orthonormal columns; atomic) with ``mode="reduced"``.
    mode : {"r", "reduced"}
        ``"r"``: ``R`` only (as ``numpy.linalg.qr(a, mode="r")``); ``"reduced"``: ``Q`` and ``R``.
    method : {"auto", "tiled", "tiles", "tsqr"}
        ``"tsqr"``: one streaming pass (``R`` held in core: about ``5 n^2`` float64 and ``3 n^2``
        elements within ``memory``, :func:`tsqr_bytes`; no ``Q``). ``"tiled"``: blocked Householder
        over column panels (``6 m t`` elements per panel of width ``t >= 32`` within ``memory``;
        ``R`` and ``Q`` stored tile by tile). ``"tiles"``: the tile Householder QR on square tiles of
        side ``t`` (``8 t^2`` elements per task; :mod:`blocklin.linalg.factor.qr_tiles`). ``"auto"``:
        ``"tsqr"`` for ``R`` alone when it fits in core with strips of at least ``4 n`` rows (a tall
        ``A``: one pass, the fewest reads), else ``"tiled"`` (faster than ``"tiles"`` on a
        quiet machine, see :func:`_householder`); the report says which and why.
    overwrite, resume : bool
        Replace existing outputs; continue an interrupted tiled run (finished panels are kept).
    explain : bool
        Return the :class:`~blocklin.plan.factor.FactorPlan` of the chosen route without running
        (``operation`` ``"qr"`` for the tiled route, ``"tsqr"`` for the streaming one).
    tile : int, optional
        Panel width (``"tiled"``) or tile side (``"tiles"``) (default: planned from the budget).
    **settings
        As for every operation: :class:`~blocklin.config.Settings`.

    Returns
    -------
    Matrix or (Matrix, Matrix)
        ``R`` (``mode="r"``) or ``(Q, R)``. ``R``'s diagonal is non-negative (the unique ``R`` of a
        full-rank ``A``; LAPACK's and NumPy's may differ from it by the signs of rows, and their ``Q``
        by the signs of columns). Complex ``A``: ``A = Q R`` with ``Q^H Q = I`` and ``R``'s diagonal
        real and non-negative (LAPACK's ``zgeqrf`` and NumPy leave it complex: blocklin's rows are
        theirs times ``conj(r_ii) / |r_ii|``, its ``Q``'s columns theirs times ``r_ii / |r_ii|``);
        the reflectors are LAPACK's complex ones (``I - V T V^H``), applied as ``Q^H`` with ``T^H``
        (``gemqrt``/``tpmqrt`` with ``'C'`` on the tiles route). The streaming TSQR of complex strips
        runs on the CPU. ``R.report``: ``method``, ``method_reason``, ``diag_ratio``
        (``min |R_ii| / max |R_ii|``, a cheap rank indicator: 0 for a rank-deficient ``A``),
        ``seconds``, ``flops``, ``peak_memory``, ``plan``.

    Notes
    -----
    *Tiled.* Column panels of width ``t`` (all ``m`` rows) are factored in a chain of tasks:
    panel ``j`` receives the block reflectors ``Q_k^T = I - V_k T_k^T V_k^T`` of the panels before it
    (left-looking, as the out-of-core QR of Gunter and van de Geijn 2005 and of D'Azevedo and
    Dongarra's out-of-core ScaLAPACK, 2000), then LAPACK ``geqrt`` factors its trailing part
    (Householder reflectors in the compact WY form of Schreiber and Van Loan 1989). Householder QR
    is backward stable whatever the conditioning: ``A + E = Q R`` with ``||E|| <= c m n u ||A||`` and
    ``||Q^T Q - I|| <= c m n u`` (Higham 2002, Thm. 19.4). Every panel is written once and its ``T``
    kept beside the resume markers, so ``resume=True`` skips finished panels; the sums run in a fixed
    order, so the bits do not depend on the scheduler. Cost: ``2 m n^2 - 2 n^3 / 3`` flops for ``R``,
    as much again for ``Q``; ``m n^2 / (2 t)`` elements read.

    *Tiles.* The tile algorithm of Buttari, Langou, Kurzak and Dongarra (Parallel Computing 35,
    2009) with a flat reduction tree (Hadri et al. 2010): for each tile column ``k``, LAPACK
    ``geqrt`` on tile ``(k, k)``, ``gemqrt`` on the tiles right of it, ``tpqrt`` on ``[R_kk; A_ik]``
    for each tile below and ``tpmqrt`` on ``[A_kj; A_ij]``, each a task of a Dask graph that writes
    only what it never reads (so ``resume=True`` skips finished tasks and gives the same bits). The
    same backward error bound holds.

    *TSQR.* Row strips fold into a running triangular factor (Demmel, Grigori, Hoemmen and Langou,
    SIAM J. Sci. Comput. 34(1), 2012): one pass over ``A``, ``2 m n^2`` flops, equally stable.
    """
    mode = choice("mode", mode, MODES, fix="pass mode='r' (R only) or 'reduced' (Q and R)")
    method = choice("method", method, METHODS, fix="pass method='auto'")
    if q is not None and mode != "reduced":
        raise ParameterError(_msg("q", "is the output of Q, which needs mode='reduced'", f"q={q!r} with mode='r'",
                                     "pass mode='reduced', or drop q"))
    tile = size("tile", tile, fix="pass a positive tile side such as tile=256 (--tile 256), or omit it for the "
                "planned one")
    with Job("qr", **settings) as job:
        A = job.operand(a, "a", integers="cast")
        m, n = A.shape
        not_empty(A, "to be factored", "numpy.linalg.qr of an empty matrix is empty: nothing to compute")
        dt = float_operand(A, "qr", complex_ok=True)
        if m < n:
            return _wide(job, A, out, q, mode=mode, overwrite=overwrite, explain=explain)
        route, reason = _route(job, m, n, dt.itemsize, mode, method)
        if route == "tsqr":
            if explain:
                return FactorPlan(operation="tsqr", m=m, n=n, dtype=dt.name, tile=0, tiles=1, workers=1,
                                  peak_memory=tsqr_bytes(n, dt.itemsize), memory=job.cfg.memory, flops=2 * m * n * n,
                                  bytes_read=m * n * dt.itemsize)
            try:
                return _tsqr(job, A, out, overwrite=overwrite, reason=reason)
            except BudgetError:
                if method != "auto":
                    raise
                route, why = _householder(job, m, n)
                reason = f"the streaming TSQR pass does not fit the budget with its strips: {why}, R stored"
        if route == "tiles":
            tplan = plan_tile_qr(m, n, dt, memory=job.cfg.memory, chunks=tuple(A.chunks), tile=tile)
            if explain:
                return tplan
            return _tiles(job, A, tplan, out, q, mode=mode, overwrite=overwrite, resume=resume, reason=reason)
        plan = plan_qr(m, n, dt, memory=job.cfg.memory, chunks=tuple(A.chunks), tile=tile, decoded=decoded_chunks(A))
        if explain:
            return plan
        return _tiled(job, A, plan, out, q, mode=mode, overwrite=overwrite, resume=resume, reason=reason)


def tsqr_bytes(n: int, itemsize: int) -> int:
    """Memory of the streaming TSQR route: the in-core reduction of ``R`` (``small_bytes``), the
    running ``n x n`` factor with LAPACK's copy and output (:mod:`blocklin.linalg.blocks.tsqr`), and strips of
    at least 64 rows (with slack for the strips' chunk temporaries)."""
    return small_bytes(n, 0) + 3 * n * n * itemsize + 4 * MIN_STRIP_ROWS * n * itemsize


def _householder(job: Job, m: int, n: int) -> tuple[str, str]:
    """The Householder route of ``"auto"`` once ``R`` is to be stored: ``("tiled", why)``.

    The column panels (on every BLAS thread) beat the tile QR (one BLAS thread per tile kernel) on a
    quiet machine: with ``Q`` at 4096 x 4096 in 64 MiB, 4.43 s against 11.10 s (R alone 2.31 s against
    6.58 s; ``benchmarks/factor.py --no-cholesky --qr-square --n 4096 --chunk 512 --memory 64MiB``, load
    2). The tile QR won only on the machine loaded by other jobs (0.16-0.45x the panels' time, load
    9-17), where threaded BLAS waits on descheduled threads; it stays available as ``method="tiles"``.
    """
    return "tiled", (f"blocked Householder over column panels ({m} x {n}; every BLAS thread on each panel's "
                     "GEMMs, faster than the single-threaded tile kernels)")


def _route(job: Job, m: int, n: int, itemsize: int, mode: str, method: str) -> tuple[str, str]:
    """``("tsqr" | "tiled" | "tiles", why)``."""
    need = tsqr_bytes(n, itemsize)
    in_core = need <= job.cfg.memory
    if method == "tsqr":
        if mode == "reduced":
            raise ParameterError(_msg("method", "'tsqr' returns R only (Q is never formed)",
                                         "method='tsqr' with mode='reduced'",
                                         "pass method='tiled', 'tiles' or 'auto'"))
        if not in_core:
            raise ParameterError(_msg("method", "'tsqr' holds the n x n R factor in core",
                                         f"R needs {format_size(need)}, over the budget of "
                                         f"{format_size(job.cfg.memory)}",
                                         "pass method='tiled', 'tiles' or raise memory="))
        return "tsqr", "requested: one streaming pass (TSQR)"
    if method == "tiled":
        return "tiled", "requested: blocked Householder over column panels"
    if method == "tiles":
        return "tiles", "requested: tile Householder QR on square tiles"
    if mode == "reduced":
        route, why = _householder(job, m, n)
        return route, f"Q requested: {why}, Q stored"
    if not in_core:
        route, why = _householder(job, m, n)
        return route, (f"R ({n} x {n}, {format_size(need)} to hold and reduce) exceeds the budget of "
                       f"{format_size(job.cfg.memory)}: {why}, R stored")
    strip_rows = (job.cfg.memory - need) // (2 * n * itemsize)
    panels_fit = QR_PANEL_BUFFERS * m * 32 * itemsize <= job.cfg.memory
    if strip_rows >= TSQR_STRIP_RATIO * n or not panels_fit:
        return "tsqr", (f"R ({n} x {n}) fits in core with strips of {strip_rows} rows: one streaming pass over A "
                        "(TSQR), the fewest reads")
    route, why = _householder(job, m, n)
    return route, (f"R fits in core, but the streaming TSQR would refactor it with every strip of {strip_rows} "
                   f"rows (< {TSQR_STRIP_RATIO} n; {-(-m // max(strip_rows, 1))} strips): {why}")


def _tsqr(job: Job, A: Any, out: Any, *, overwrite: bool, reason: str) -> Matrix:
    m, n = A.shape
    # complex strips are factored on the CPU (the device's streaming QR keeps real sums)
    result = tsqr_pass(job, A, None, A.dtype, device="cpu" if np.dtype(A.dtype).kind == "c" else None)
    r = positive_diagonal(result.r).astype(A.dtype, copy=False)
    _refuse_nonfinite_r(job, A, r)
    ao = job.claim(out, [A], overwrite=overwrite)
    chunk = min(max(n, 1), 1024)
    create_array(ao.array_path(), shape=(n, n), dtype=A.dtype, chunks=(chunk, chunk), codec=job.cfg.codec)
    write_block(open_zarr(ao.array_path(), mode="r+"), slice(0, n), slice(0, n), r)
    report = _report(job, A, np.abs(np.diag(r)), method="tsqr", reason=reason, flops=2 * m * n * n,
                     plan=result.report["plan"], norm_a=result.norm_a)
    return job.finish(ao, out, report, operation="qr", plan=result.report["plan"],
                      params={"mode": "r", "method": "tsqr"}, keys=REPORT_KEYS)


def _wide(job: Job, A: Any, out: Any, q: Any, *, mode: str, overwrite: bool,
          explain: bool) -> Matrix | tuple[Matrix, Matrix] | FactorPlan:
    """A wide ``A = [A_1 A_2]`` (``m < n``): ``A_1 = Q R_1`` by LAPACK's Householder QR in memory (the
    ``m x m`` leading block), then ``R_2 = Q^T A_2`` by one out-of-core GEMM pass; ``R = [R_1 R_2]``
    is ``m x n`` upper trapezoidal and ``Q`` ``m x m``, as ``numpy.linalg.qr(a, "reduced")`` returns
    them. Backward stable: ``R_1`` carries Householder QR's bound and ``R_2`` a product's
    (Higham 2002, Thm. 19.4 and 3.5)."""
    m, n = A.shape
    dt = np.dtype(A.dtype)
    wide = np.complex128 if dt.kind == "c" else np.float64
    held = 4 * m * m * np.dtype(wide).itemsize  # A_1, LAPACK's copy, Q and R_1 in float64 (complex128)
    t = max(1, min(m, 1024))
    plan = FactorPlan(operation="qr-wide", m=m, n=n, dtype=dt.name, tile=t, tiles=1, workers=1, peak_memory=held,
                      memory=job.cfg.memory, flops=4 * m * m * m // 3 + 2 * m * m * (n - m),
                      bytes_read=m * n * dt.itemsize)
    if explain:
        return plan
    if held > job.cfg.memory:
        raise BudgetError(_msg("memory", "must hold the m x m leading block of a wide A with its Q and R (4 m^2 "
                               "float64)", format_size(job.cfg.memory), f"raise it to at least {format_size(held)}"),
                          minimum=held)
    a1 = np.asarray(open_zarr(A.path)[:, :m], dtype=wide)
    if job.check_finite:  # A_1 here, A_2 as the GEMM reads it: LAPACK's QR and the product pass NaN on
        check_finite(a1, "a", slice(0, m), slice(0, m))
    q1, r1 = np.linalg.qr(a1)
    del a1
    _refuse_nonfinite_r(job, A, r1)
    d = diagonal_signs(r1)  # the R with a non-negative (real) diagonal, as every blocklin QR
    r1, q1 = positive_diagonal(r1), signed_columns(q1, d)
    ao, qo = _outputs(job, A, "qr", plan.to_dict(), out, q, mode=mode, overwrite=overwrite, resume=False,
                      size=((m + m, n), dt))
    create_array(ao.array_path(), shape=(m, n), dtype=dt, chunks=(t, t), codec=job.cfg.codec)
    write_block(open_zarr(ao.array_path(), mode="r+"), slice(0, m), slice(0, m), np.triu(r1).astype(dt))
    if n > m:
        qt = job.scratch("qt", (m, m), dt, (t, t))
        write_block(open_zarr(qt, mode="r+"), slice(0, m), slice(0, m), np.ascontiguousarray(q1.conj().T).astype(dt))
        tiles = BlockOps(job, t).gemm(ao.array_path(), (0, m), m, n - m, m, qt, (0, 0), A.path, (0, m), dtype=dt,
                                      description="qr (wide): R_2 = Q^H A_2", check_finite=job.check_finite,
                                      names=("q", "a", "c"), peaks=False)
        _refuse_nonfinite_r2(job, A, tiles)
    if qo is not None:
        create_array(qo.array_path(), shape=(m, m), dtype=dt, chunks=(t, t), codec=job.cfg.codec)
        write_block(open_zarr(qo.array_path(), mode="r+"), slice(0, m), slice(0, m), q1.astype(dt))
    report = _report(job, A, np.abs(np.diag(r1)), method="wide",
                     reason="wide A: Householder QR of its leading m x m block in memory, R_2 = Q^T A_2 by one GEMM "
                            "pass", flops=plan.flops, plan=plan.to_dict(), norm_a=None)
    return _commit(job, ao, qo, plan.to_dict(), {"mode": mode, "method": "wide"}, report, out=out, q=q)


def _tiled(job: Job, A: Any, plan: FactorPlan, out: Any, q: Any, *, mode: str, overwrite: bool, resume: bool,
           reason: str) -> Matrix | tuple[Matrix, Matrix]:
    m, n = A.shape
    dt, t = np.dtype(plan.dtype), plan.tile
    # R and, in its partial folder, the Householder work store (m x n)
    ao, qo = _outputs(job, A, "qr", plan.to_dict(), out, q, mode=mode, overwrite=overwrite, resume=resume,
                      size=((n + m, n), dt))
    work = (ao.done / "qr-work.zarr").with_pending(False)  # dropped with the markers at commit
    # a full disk names the output the user can move, not the work store inside its partial folder
    with named_as_output(ao.partial, f"qr's Householder work store ({m} x {n} {dt.name}) beside R"):
        if not backend(work).exists("zarr.json"):
            # panels are read whole (rows k t : m): chunks of about 8 MiB down the column, not t x t
            rows = max(t, min(m, (8 * 2**20) // (t * dt.itemsize) // t * t))
            create_array(work, shape=(m, n), dtype=dt, chunks=(rows, t), codec=job.cfg.codec)
        for o, shape in ((ao, (n, n)), (qo, (m, n))):
            if o is not None and not (o.resumed and o.has_array()):  # interrupted before creating it: create it
                create_array(o.array_path(), shape=shape, dtype=dt, chunks=(t, t), codec=job.cfg.codec)
        ops = BlockOps(job, t)
        ops.workers = 1
        results = qr_panels(ops, Region.of(A.path, A.shape), work, dtype=dt, done_dir=ao.done,
                            check=job.check_finite)
        signs = np.concatenate([r["signs"] for r in results]) if n else np.ones(0)
        qr_extract_r(ops, work, ao.array_path(), m, n, dtype=dt, signs=signs)
    if qo is not None:
        qr_form_q(ops, work, qo.array_path(), m, n, dtype=dt, done_dir=ao.done, signs=signs)
    diag = [(r["min_r"], r["max_r"]) for r in results]
    report = _report(job, A, np.array([d for pair in diag for d in pair]), method="tiled", reason=reason,
                     flops=plan.flops * (2 if qo is not None else 1), plan=plan.to_dict(), norm_a=None)
    return _commit(job, ao, qo, plan.to_dict(), {"mode": mode, "method": "tiled"}, report, out=out, q=q)


def _tiles(job: Job, A: Any, plan: TileQRPlan, out: Any, q: Any, *, mode: str, overwrite: bool, resume: bool,
           reason: str) -> Matrix | tuple[Matrix, Matrix]:
    m, n = A.shape
    dt, t = np.dtype(plan.dtype), plan.tile
    # R and, in its partial folder, the work stores (three m x n, the T tiles and four tile rows)
    ao, qo = _outputs(job, A, "qr-tiles", plan.to_dict(), out, q, mode=mode, overwrite=overwrite, resume=resume,
                      size=((3 * m + 5 * t + plan.row_tiles * plan.inner_block + n, n), dt))
    # a full disk names the output the user can move, not the work stores inside its partial folder
    with named_as_output(ao.partial, f"qr's tile work stores (three {m} x {n} {dt.name}) beside R"):
        stores = tile_qr_stores(ao.done, m, n, t, plan.inner_block, dt, job.cfg.codec)
        if not (ao.resumed and ao.has_array()):
            create_array(ao.array_path(), shape=(n, n), dtype=dt, chunks=(t, t), codec=job.cfg.codec)
        if qo is not None and not (qo.resumed and qo.has_array()):
            create_array(qo.array_path(), shape=(m, n), dtype=dt, chunks=(min(t, m), plan.q_width),
                         codec=job.cfg.codec)
        ops = BlockOps(job, t)
        ops.workers = 1
        results = tile_qr(ops, Region.of(A.path, A.shape), stores, dtype=dt, inner=plan.inner_block,
                          done_dir=ao.done, check=job.check_finite)
        diag = sorted((r for r in results if "col" in r), key=lambda r: r["col"])
        signs = np.concatenate([r["signs"] for r in diag]) if n else np.ones(0)
        qr_extract_r(ops, stores["packed"], ao.array_path(), m, n, dtype=dt, signs=signs)
    if qo is not None:
        tile_qr_form_q(ops, stores, qo.array_path(), m, n, dtype=dt, inner=plan.inner_block, width=plan.q_width,
                       done_dir=ao.done, signs=signs)
    report = _report(job, A, np.array([d for r in diag for d in (r["min_r"], r["max_r"])]), method="tiles",
                     reason=reason, flops=plan.flops * (2 if qo is not None else 1), plan=plan.to_dict(), norm_a=None)
    return _commit(job, ao, qo, plan.to_dict(), {"mode": mode, "method": "tiles"}, report, out=out, q=q)


def _outputs(job: Job, A: Any, kind: str, plan: dict, out: Any, q: Any, *, mode: str, overwrite: bool,
             resume: bool, size: tuple) -> tuple[Any, Any]:
    """The atomic outputs of ``R`` (``size``: with the work stores in its partial folder) and, for
    ``mode="reduced"``, of ``Q`` (else ``None``), under one token of the input, the plan and the job's
    settings (:func:`~blocklin.storage.identity.plan_settings`: the plan names no device, and the tiles are
    updated on the job's)."""
    token = resume_token(kind, [A], plan, plan_settings(job))
    ao = job.claim(out, [A], overwrite=overwrite, resume=resume, token=token, size=size)
    qo = job.claim(q, [A], overwrite=overwrite, resume=resume, token=token + "q",
                   size=((A.shape[0], A.shape[1]), size[1])) if mode == "reduced" else None
    return ao, qo


def _commit(job: Job, ao: Any, qo: Any, plan: dict, params: dict, report: dict, *, out: Any,
            q: Any) -> Matrix | tuple[Matrix, Matrix]:
    """Commit ``R`` (and ``Q`` when asked for) with their provenance: ``R`` or ``(Q, R)``."""
    R = job.finish(ao, out, report, operation="qr", plan=plan, params=params, keys=REPORT_KEYS)
    if qo is None:
        return R
    return job.finish(qo, q, report, operation="qr", plan=plan, params={**params, "factor": "Q"}, keys=REPORT_KEYS), R


def _refuse_nonfinite_r(job: Job, A: Any, r: np.ndarray) -> None:
    """An ``R`` held in core with a NaN or Inf anywhere is refused, as one on its diagonal is
    (:func:`_report`): a NaN of ``A`` can stay above the diagonal alone (``a_12`` of ``2 I``: LAPACK's ``R``
    is ``2 I`` with ``r_12 = NaN``), and that ``R`` had been returned."""
    finite = np.isfinite(r)
    if not finite.all():
        _refuse_nonfinite(job, A, float(np.abs(r[~finite].ravel()[0])))


def _refuse_nonfinite_r2(job: Job, A: Any, tiles: list) -> None:
    """``R_2 = Q^H A_2`` of the wide route with a NaN or Inf is refused, as ``R_1`` is
    (:func:`_refuse_nonfinite_r`), from the peaks each GEMM tile took of the strips it wrote (NaN kept), not
    another pass: with check_finite=False a NaN of ``A_2`` (right of the leading block) had been returned
    inside ``R_2``."""
    top = 0.0
    for r in tiles:
        got = r.get("peaks") if isinstance(r, dict) else None
        if got is not None and got[2].size:
            top = float(np.maximum(top, np.max(got[2])))  # NaN kept (Python's max drops it)
    _refuse_nonfinite(job, A, top)


def _refuse_nonfinite(job: Job, A: Any, peak: float) -> None:
    """A NaN or Inf in ``R`` (``peak``, its largest magnitude) is refused by its cause: a NaN or Inf of
    ``A`` (check_finite=False: one pass for ``max |A|``, on this failure only) as ``NonFiniteError``; else
    ``R`` overflowed (its entries reach the norms of ``A``'s columns, ``sqrt(m)`` times ``max |a|``), named
    with the power of two that brings ``A`` into range. Finite data near the overflow threshold had been
    refused as NaN or Inf in the data that check_finite=False let through, with check_finite on."""
    if math.isfinite(peak):
        return
    amax = max_abs(A, keep_nan=True)
    refuse_nonfinite(amax, "qr")
    e = int(np.frexp(amax)[1]) if amax > 0 else 0
    raise ParameterError(_msg(
        "a", f"must have R within {np.dtype(A.dtype).name}'s range for qr (R's entries reach the norms of a's "
        "columns, up to sqrt(m) max |a_ij|)", f"max |a_ij| = {amax:.3g} (finite): R overflowed to {peak}",
        f"scale a by 2.0**-{e} (exact: R is then scaled by the same power, Q unchanged)"))


def _report(job: Job, A: Any, diag: np.ndarray, *, method: str, reason: str, flops: int, plan: dict,
            norm_a: float | None) -> dict:
    bad = diag[~np.isfinite(diag)]
    if bad.size:  # R of NaN or Inf data (check_finite=False), or R overflowed: not a rank deficiency
        _refuse_nonfinite(job, A, float(bad[0]))
    top = float(diag.max()) if diag.size else 0.0
    ratio = float(diag.min()) / top if top > 0 else 0.0
    if diag.size and float(diag.min()) == 0.0:  # not ratio == 0: a ratio below 1e-308 underflows with no zero
        warn("qr: R has a zero on its diagonal: A is rank-deficient (Q and R are still a valid factorization)")
    return job.report(flops=flops, method=method, method_reason=reason, diag_ratio=ratio, plan=plan, norm_a=norm_a)


__all__ = ["qr", "tsqr_bytes"]
