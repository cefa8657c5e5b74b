"""Eigenpairs of a symmetric out-of-core matrix by thick-restarted block Lanczos.

Each Lanczos step (:func:`blocklin.linalg.lowrank.lanczos.block_lanczos`) is one row pass ``Z = A^T X``
over ``A`` (equal to ``A X`` for symmetric ``A``); the first pass also forms ``A X`` for its random
block, which checks symmetry. A matrix that fits the budget is read once and solved in memory.

A complex matrix must be Hermitian (``A = A^H``): its eigenvalues are real and its eigenvectors complex
(``scipy.linalg.eigh``'s and ARPACK's conventions). The passes form ``A^T conj(X)``, whose conjugate is
``A^H X = A X``; the first one takes ``[X, conj(X)]`` and compares ``A X`` with ``A^H X``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Unpack

import numpy as np

from blocklin.config import Settings
from blocklin.errors import ConvergenceWarning, NotSymmetricError, ParameterError, explain, warn
from blocklin.linalg.blocks.tall_kernels import rmat_kernel
from blocklin.linalg.lowrank.lanczos import (LanczosResult, block_lanczos, check_basis_reaches_k, default_tol,
                                             repeated_beyond_block, rerun_wider_block)
from blocklin.linalg.blocks.orth import orth_against, work_dtype
from blocklin.runtime.powers import ldexp
from blocklin.linalg.blocks.random import STREAM_LANCZOS, gaussian
from blocklin.runtime.checkpoints import Checkpoints
from blocklin.linalg.blocks.results import open_group, write_group
from blocklin.linalg.blocks.scaling import (Scaling, check_finite_result, check_result_range, check_scaled_back_range,
                                           incore_exponent, refuse_nonfinite, unscale)
from blocklin.linalg.lowrank.checkpoint import checkpointed_seed, low_rank_token
from blocklin.linalg.lowrank.run import real_parts
from blocklin.linalg.lowrank.sources import load_incore
from blocklin.linalg.lowrank.laplacian import KINDS
from blocklin.linalg.lowrank.sparse_eigsh import eigen_order, sparse_eigsh, symmetry_rtol
from blocklin.operands import staged_at
from blocklin.plan.minimum import whole_call
from blocklin.plan.svd import SvdPlan, plan_svd
from blocklin.runtime.job import Job
from blocklin.runtime.passes import collect_rows, reduce_sum, run_pass, source
from blocklin.sparse import SparseMatrix, as_sparse_matrix
from blocklin.validate import (check_k, choice, is_int, float_operand, positive, resolve_seed, seed_arg, size, square,
                               start_vector)

WHICH = ("LA", "SA", "LM")


class EighResult(tuple):
    """``(w, V)`` with a ``report`` attribute."""

    def __new__(cls, w: np.ndarray, V: np.ndarray, report: dict, output: Any = None) -> EighResult:
        obj = super().__new__(cls, (w, V))
        obj.report = report
        obj.output = output  # the stored group's Location (its storage options with it), else None
        return obj

    @property
    def w(self) -> np.ndarray:
        return self[0]

    @property
    def V(self) -> np.ndarray:
        return self[1]

    def delete(self) -> None:
        """Remove the result's group where one was written (``report["output"]``: a sparse matrix's
        eigenvectors, or ``out=``); ``w`` stays usable (:func:`~blocklin.linalg.blocks.results.delete_output`)."""
        from blocklin.linalg.blocks.results import delete_output

        delete_output(self)


@rerun_wider_block
def eigsh(a: Any, k: int, *, which: str = "LA", tol: float | None = None, block_size: int | None = None,
          max_basis: int | None = None, max_passes: int = 60, seed: int | None = None, out: Any = None,
          overwrite: bool = False, check_symmetric: bool = True, order: str | None = None, center: bool = False,
          resume: bool = False, v0: Any = None, laplacian: str | None = None,
          **settings: Unpack[Settings]) -> EighResult:
    """``k`` eigenpairs of a symmetric out-of-core matrix by thick-restarted block Lanczos.

    Each Lanczos step is one pass over ``A`` (``Z = A^T X``, equal to ``A X`` for symmetric ``A``).
    The first pass also forms ``A X`` for its random block and compares: a matrix with
    ``||A X - A^T X|| > sqrt(eps) ||A X||`` is refused with :class:`NotSymmetricError` (a sampled
    check: a random block detects any asymmetry with probability one). A matrix that fits the budget
    is read once and solved in memory.

    Parameters
    ----------
    a : path, zarr array, Matrix, NumPy or Dask array
        Symmetric ``n x n``, float32 or float64; or Hermitian complex64 or complex128 (real eigenvalues,
        float32 or float64, complex eigenvectors).
    k : int
        Number of eigenpairs, ``1 <= k < n`` (with ``center=True``, ``1 <= k < min(m, n)`` of the ``m x n``
        data; :func:`blocklin.pca` gives all of them).
    which : {"LA", "SA", "LM"}
        Largest algebraic, smallest algebraic, or largest magnitude eigenvalues.
    tol : float, optional
        Converged when ``||A x - lambda x|| <= tol * max|lambda|`` for every pair;
        default ``10 sqrt(eps)`` of the dtype.
    block_size, max_basis : int, optional
        Lanczos block size and the basis size at which it restarts. A block finds at most as many
        copies of a repeated eigenvalue as it is wide: with ``block_size`` left to the planner, a run
        that finds a value that often (with wanted values after it) is made again with a block twice
        as wide (``report["block_widened"]``, :func:`~blocklin.linalg.lowrank.lanczos.rerun_wider_block`);
        with one given, a :class:`~blocklin.errors.ConvergenceWarning` says so.
    max_passes : int
        Pass limit; a :class:`~blocklin.errors.ConvergenceWarning` says what was reached.
    seed : int, optional
        Seed of the starting block (results are deterministic for a seed).
    v0 : array_like, optional
        A starting vector of length ``n`` (``scipy.sparse.linalg.eigsh``'s ``v0``): the first column of the
        starting block (with ``center=True``, of length ``min(m, n)`` as :func:`blocklin.svd`'s).
    out : path, optional
        Write a zarr group with ``w``, ``V`` and the report in its attributes.
    overwrite : bool
        Replace an existing ``out``.
    check_symmetric : bool
        Refuse a non-symmetric matrix (checked on the first pass).
    order : {"ascending", "descending"}, optional
        Order of the eigenvalues (and of the columns of ``V``): ``"ascending"`` as SciPy's ``eigsh``,
        ``"descending"`` as :func:`blocklin.svd` orders ``s`` (largest first; what ``blocklin eigs``
        writes for ``which="LA"`` and ``"LM"``). Not given: ``"ascending"`` with a ``FutureWarning``
        (deprecation path: the default becomes svd's order, ``"descending"`` for ``LA``/``LM``, in
        the next minor release; pass ``order`` to keep either one without the warning).
    resume : bool
        Continue the interrupted run that was writing ``out`` (same input, parameters and budget):
        the completed Lanczos steps are restored from their checkpoints and skipped; the result is
        identical, bit for bit, to an uninterrupted run. Needs ``out``.
    laplacian : {"combinatorial", "normalized"}, optional
        ``a`` is a stored sparse graph's adjacency ``A`` (weights, symmetric): the eigenpairs of its
        Laplacian ``L = D - W`` or ``I - D^{-1/2} W D^{-1/2}`` (``W``: ``A`` without its diagonal,
        ``D``: the degrees), as ``scipy.sparse.csgraph.laplacian(A, normed=...)`` defines it, by one
        degree pass and then products with ``A`` (``L`` never formed). With ``which="SA"``: the
        smallest eigenpairs, as spectral clustering takes them (von Luxburg, 2007). The values are
        float64.
    center : bool
        ``A`` is a data matrix (``m`` samples x ``n`` features, any shape): the eigenpairs of its
        covariance ``C = (A - 1 mu^T)^T (A - 1 mu^T) / (m - 1)`` without forming ``C`` or a centered
        copy, by the centered SVD (:func:`blocklin.svd` with ``center=True``, block Lanczos to
        ``tol``): ``w = s^2 / (m - 1)`` and ``V`` the right singular vectors. ``which`` must be
        ``"LA"`` or ``"LM"`` (the same for a covariance). Complex data: the Hermitian
        ``A_c^H A_c / (m - 1)``, real ``w`` and ``V = Vt^H``.
    **settings
        As for every operation: :class:`~blocklin.config.Settings`.

    Returns
    -------
    EighResult
        ``w, V = result`` (eigenvalues in ``order``, ascending by default as in SciPy, and the
        eigenvectors as the columns of ``V``, ``n x k``, oriented as :func:`blocklin.svd`'s ``U``), with
        ``result.report``: passes, bytes read, seconds, peak memory, per-pair residuals.

    References
    ----------
    Golub and Underwood (1977), the block Lanczos method; Wu and Simon (2000), thick restart.

    Examples
    --------
    >>> import numpy as np
    >>> import blocklin as bl
    >>> w, V = bl.eigsh(np.diag(np.arange(1.0, 51.0)), 3, which="LA", order="ascending")
    >>> np.round(w, 8), V.shape
    (array([48., 49., 50.]), (50, 3))
    """
    which = choice("which", which, WHICH, fix="pass which='LA'")
    if order is None:
        warn("eigsh: the default order will become 'descending' (largest first, as svd orders s) in the next "
             "minor release; pass order='ascending' to keep SciPy's order, or order='descending'", FutureWarning)
        order = "ascending"
    order = choice("order", order, ("ascending", "descending"), fix="pass order='descending'")
    tol = positive("tol", tol, optional=True, fix="pass tol=1e-6")
    max_passes = size("max_passes", max_passes, optional=False, fix="pass max_passes=60")
    block_size = size("block_size", block_size, fix="pass block_size=8, or None for the planned one")
    max_basis = size("max_basis", max_basis, fix="pass max_basis=32, or None for the planned one")
    seed = seed_arg(seed)  # a generator draws its integer once, before the token names it
    sparse = as_sparse_matrix(a, settings.get("storage_options"))
    if laplacian is not None:
        laplacian = choice("laplacian", laplacian, KINDS, fix="pass laplacian='normalized' or 'combinatorial'")
        if not isinstance(sparse, SparseMatrix):
            raise ParameterError(explain("laplacian", "takes a stored sparse adjacency matrix (a blocklin-csr "
                                         "group)", f"a {type(a).__name__}", "store the graph sparse first: "
                                         "blocklin.from_sparse(adjacency, 'G.zarr') or blocklin convert G.mtx G.zarr"))
    if isinstance(sparse, SparseMatrix):  # a stored sparse matrix: Lanczos on its row-block products
        return EighResult(*sparse_eigsh(
            sparse, k, which=which, tol=tol, max_passes=max_passes, block_size=block_size, max_basis=max_basis,
            seed=resolve_seed(seed), order=order, v0=v0, check_symmetric=check_symmetric, laplacian=laplacian,
            out=out, overwrite=overwrite, refused={"resume": resume, "center": center}, settings=settings,
            own_open=sparse is not a))
    if center:
        return _covariance(a, k, which=which, tol=tol, block_size=block_size, max_basis=max_basis,
                           max_passes=max_passes, seed=seed, out=out, overwrite=overwrite, order=order, resume=resume,
                           v0=v0, **settings)
    with Job("eigsh", **settings) as job:
        A = job.operand(a, "a", integers="cast")
        n = square(A, "(eigsh needs a symmetric matrix)", "use blocklin.svd for rectangular matrices")
        dt = float_operand(A, "eigsh", complex_ok=True)
        check_k(k, n, n, eig=True)
        v0 = start_vector(v0, n)
        tol = default_tol(dt) if tol is None else tol
        plan = whole_call(lambda memory: _plans(job, A, k, dt, memory, max_passes=max_passes, block_size=block_size,
                                                max_basis=max_basis, check=check_symmetric),
                          job.cfg.memory, "eigsh")
        check_basis_reaches_k(k, plan.block, max_passes if not plan.in_core else max(max_passes, 500), n)
        ao = None if out is None else open_group(job, out, A, overwrite, resume=resume, token=low_rank_token(
            job, A, op="eigsh", k=k, which=which, tol=tol, block=plan.block, basis=plan.max_basis, max_passes=max_passes,
            check=check_symmetric, memory=job.cfg.memory, seed=seed, v0=v0))
        ckpt = Checkpoints(ao, enabled=ao is not None and not plan.in_core)
        seed = checkpointed_seed(ckpt, seed)
        state = ckpt.load("lanczos")
        g = gaussian(seed, STREAM_LANCZOS, 0, n, plan.block, work_dtype(dt))
        if v0 is not None:  # SciPy's starting vector: the block's first column
            g[:, 0] = v0
        x0 = orth_against(None, g, seed=seed)
        scaling = Scaling.of(source(A), dt, finite_for="eigsh")  # NaN/Inf refused (check_finite=False)
        saved = ckpt.load("scaling")
        if saved is not None:  # resume: the power of two the checkpointed steps were taken with
            scaling.e, scaling.amax = int(saved["e"]), float(saved["amax"])
        apply, first, phases = _operator(job, A, plan, x0, check_symmetric and state is None, scaling)
        if ckpt.enabled and saved is None and scaling.exponent:  # e = 0: nothing to keep
            ckpt.save("scaling", e=scaling.exponent, amax=float(scaling.amax or 0.0))
        scale = {"v": float(state.pop("scale")) if state is not None else 0.0}  # the threshold's running max

        def threshold(theta: np.ndarray) -> np.ndarray:
            scale["v"] = max(scale["v"], float(np.max(np.abs(theta))) if theta.size else 0.0)
            return np.full(theta.shape, tol * max(scale["v"], np.finfo(np.float64).tiny))

        steps_limit = max_passes if not plan.in_core else max(max_passes, 500)
        res = block_lanczos(apply, n, k, which=which, block=plan.block, max_basis=plan.max_basis,
                            max_steps=steps_limit, threshold=threshold, seed=seed, x0=x0, first=first, state=state,
                            dtype=dt,
                            checkpoint=(lambda st: ckpt.save("lanczos", scale=scale["v"], **st))
                            if ckpt.enabled else None)
        ckpt.clear()
        check_basis_reaches_k(k, plan.block, steps_limit, n, found=len(res.values))
        if scaling.exponent:  # the eigenpairs of 2^-e A: eigenvalues and residuals scale back by 2^e
            check_scaled_back_range("a", res.values, scaling.exponent, "eigenvalues")
            res = dataclasses.replace(res, values=unscale(res.values, scaling.exponent),
                               residuals=unscale(np.asarray(res.residuals, dtype=np.float64), scaling.exponent))
            scale["v"] = float(np.ldexp(scale["v"], scaling.exponent))
        check_finite_result("w", res.values, "the eigenvalues of eigsh")
        check_result_range("a", res.values, dt, "eigenvalues")
        if res.note:
            warn(f"eigsh: {res.note}", ConvergenceWarning)
        if not res.residuals_converged:  # said beside a note too: the note is about the pairs that converged
            warn(f"eigsh: tol={tol:g} not reached within {job.passes('a')} passes over A; reached a relative "
                 f"residual of {float(np.max(res.residuals)) / max(scale['v'], 1e-300):.2e} (max over the {k} "
                 "pairs). Raise max_passes, max_basis or block_size, or loosen tol", ConvergenceWarning)
        result = _result(job, A, plan, res, out, overwrite, tol=tol, which=which, seed=seed, phases=phases,
                         order=order, ao=ao)
        result.report.update(scaling=scaling.report(), resumed=bool(ao is not None and ao.resumed),
                             restored_checkpoints=[name for name in ckpt.restored if name != "seed"])
        if res.repeated:  # as svd reports it
            result.report.update(repeated_beyond_block(res.repeated))
        return result


def _covariance(a: Any, k: int, *, which: str, order: str, **kw: Any) -> EighResult:
    """Eigenpairs of the covariance of the data matrix ``a`` through its centered SVD (no ``C`` formed)."""
    from blocklin.linalg.lowrank.svd import factorize

    if which == "SA":
        raise ParameterError(explain("which", "must be 'LA' or 'LM' with center=True (the leading eigenpairs of a "
                                     "covariance, from its centered SVD)", repr(which), "pass which='LA'"))
    res = factorize(a, k, method="lanczos", center=True, lanczos_tol=default_tol, caller="eigsh",  # eigsh's tol
                    check_shape=lambda m, n, dt: _check_covariance_k(k, m, n), **kw)
    m = res.moments.count
    w = _covariance_values(res.s, m)
    V = (res.Vt.to_numpy() if hasattr(res.Vt, "to_numpy") else np.asarray(res.Vt)).conj().T  # n x k: V = Vt^H
    if res.report.get("output") and kw.get("out") is None:  # the temporary factors are not returned
        from blocklin.storage import remove

        remove((res.U if hasattr(res.U, "location") else res.Vt).location.parent)
    idx = np.arange(k)[::-1] if order == "ascending" else np.arange(k)
    # ||C v - w v|| = s ||A_c^T u - s v|| / (m - 1), since A_c v = s u
    resid = np.asarray(res.report["residuals"]) * (res.s.astype(np.float64) / max(m - 1, 1))  # w fits: so does each
    report = dict(res.report, which=which, order=order, center=True, covariance_ddof=1, residuals=resid[idx].tolist())
    kept = res.output if kw.get("out") is not None else None  # the group delete() removes
    return EighResult(w[idx], np.ascontiguousarray(V[:, idx]), report, output=kept)


def _check_covariance_k(k: Any, m: int, n: int) -> None:
    """Refuse, in eigsh's terms, a ``k`` outside ``1 <= k < min(m, n)`` for the covariance of ``m x n`` data:
    its Lanczos SVD had refused ``k = min(m, n)`` by naming a ``method=`` that eigsh does not take."""
    N = min(m, n)
    if is_int(k) and 1 <= k < N:
        return
    fix = (f"pass 1 <= k <= {N - 1}, or blocklin.pca(a, n_components={N}) for all of them (its explained_variance_ "
           "is w)" if N > 1 else "compute it in memory (numpy.linalg.eigh(numpy.cov(a, rowvar=False)))")
    raise ParameterError(explain("k", f"must be an integer with 1 <= k < min(m, n) = {N} with center=True (the leading "
                                 "eigenpairs of the covariance of m x n data, by block Lanczos on its centered SVD)",
                                 f"k={k!r} for a {m} x {n} matrix", fix))


def _covariance_values(s: np.ndarray, m: int) -> np.ndarray:
    """``w = s^2 / (m - 1)`` in ``s``'s dtype, refused where it leaves that dtype's range: it had been returned
    as Inf (float32 data near ``2^64``, float64 data near ``2^512``) with only NumPy's overflow warning, and
    as 0 or subnormal numbers of few digits, with no word at all, where the largest falls below the normal
    numbers (float32 data near ``2^-64``, float64 data near ``2^-512``)."""
    real = np.finfo(s.dtype)
    s64 = np.abs(s.astype(np.float64))
    e = int(np.frexp(float(s64.max()))[1]) if s64.size else 0  # s_1 < 2^e: squared as (s / 2^e)^2 2^(2e)
    t = np.ldexp(s64, -e) ** 2 / max(m - 1, 1)
    with np.errstate(over="ignore"):
        w64 = np.ldexp(t, 2 * e)
    if w64.size and not float(w64.max()) <= float(real.max):
        top = float(np.log2(t.max())) + 2 * e  # log2 of the largest eigenvalue
        q = int(np.ceil((top - real.maxexp + 2) / 2))  # the data's power of two: its eigenvalues 2^-2q these
        raise ParameterError(explain(
            "a", f"must have covariance eigenvalues within the range of {real.dtype.name}, the precision they are "
                 "returned in", f"a largest eigenvalue of about 2^{top:.0f}, above {real.dtype.name}'s "
                 f"{float(real.max):.4g}",
            f"scale the data by 2.0**-{q} (exact: the covariance eigenvalues of the scaled data are 2^-{2 * q} "
            "times these)" + (", or convert it to float64" if real.dtype == np.float32 else "")))
    if w64.size and 0.0 < float(s64.max()) and float(t.max()) > 0.0 and \
            float(np.log2(t.max())) + 2 * e < real.minexp:  # below the normal numbers: subnormal digits or 0
        top = float(np.log2(t.max())) + 2 * e
        q = int(np.ceil(-top / 2))  # the data's power of two that brings the largest eigenvalue near 1
        raise ParameterError(explain(
            "a", f"must have covariance eigenvalues within the range of {real.dtype.name}, the precision they are "
                 "returned in", f"a largest eigenvalue of about 2^{top:.0f}, below {real.dtype.name}'s smallest "
                 f"normal number {float(real.tiny):.4g} (it would be returned with fewer digits, or as 0)",
            f"scale the data by 2.0**{q} (exact: the covariance eigenvalues of the scaled data are 2^{2 * q} "
            "times these)"))
    return w64.astype(s.dtype)


def _plans(job: Job, A: Any, k: int, dt: Any, memory: int, *, max_passes: int, block_size: int | None,
           max_basis: int | None, check: bool) -> SvdPlan:
    """The plan at ``memory``, and out of core the plan of its widest pass (the first Lanczos step,
    which also takes ``A X`` for the symmetry check: twice the columns for complex data), so that a
    refusal names the least budget at which both plan (:func:`~blocklin.plan.minimum.whole_call`)."""
    from blocklin.device import pass_device
    from blocklin.runtime.passes import plan_kernel_pass

    n = A.shape[0]
    A = staged_at(A, memory)  # in-memory data: a rerun at this budget stages it in chunks of this budget
    plan = plan_svd(n, n, k, dt, method="eigsh", oversample=10, power_iters=None, memory=memory,
                    max_passes=max_passes, block_size=block_size, max_basis=max_basis, square=True)
    if not plan.in_core:
        cols = plan.block * (2 if dt.kind == "c" and check else 1)
        where = pass_device(job.cfg.device, 2.0 * n * n * plan.block, n * n * dt.itemsize, job.device)
        y = np.broadcast_to(np.zeros((), dt), (n, cols))  # its shape and dtype: what the kernel declares
        plan_kernel_pass(job, rmat_kernel, [source(A)], {"Y": y, "n": n, "check": check}, memory=plan.memory,
                         reserve=plan.client_bytes, device=where)
    return plan


def _operator(job: Job, A: Any, plan: SvdPlan, x0: np.ndarray, check_symmetric: bool,
              scaling: Scaling) -> tuple[Callable[[np.ndarray, int], np.ndarray], np.ndarray, dict]:
    """``apply(X, step) = A^T X`` (in memory, or one pass each), ``A^T x0`` (symmetry checked on ``x0``),
    and where the phases run (in memory on a GPU: ``A`` kept on the device for the products). ``A`` is
    divided by ``scaling``'s power of two (:mod:`blocklin.linalg.blocks.scaling`), learned from its first read."""
    dt = A.dtype
    n = A.shape[0]
    cplx = dt.kind == "c"  # A^H X = conj(A^T conj(X)): the products never conjugate A

    def herm(z: np.ndarray) -> np.ndarray:
        return np.conj(z) if cplx else z

    if plan.in_core:
        M = load_incore(job, A, plan)
        scaling.e, scaling.amax = incore_exponent(real_parts(M))
        refuse_nonfinite(scaling.amax, "eigsh")
        if scaling.e:
            ldexp(M, -scaling.e, out=M)
        ax, atx = M @ x0.astype(dt), herm(M.T @ herm(x0.astype(dt)))
        dev = None
        if job.device == "gpu" and M.nbytes * 1.5 <= (job.device_memory() or 0):
            from blocklin.device import get_device

            dev = get_device("gpu", device_memory=job.device_memory())
            job.stack.enter_context(dev.reserve(int(1.5 * M.nbytes)))  # held from the GPU's shared budget
            Md = dev.to_device(M)  # kept on the GPU for the Lanczos products
        phases = {"read A": "cpu", "products with A": "gpu" if dev is not None else "cpu"}

        def apply(x: np.ndarray, step: int) -> np.ndarray:
            if dev is None:
                return herm(M.T @ herm(x.astype(dt))).astype(work_dtype(dt))
            z = dev.zeros((M.shape[1], x.shape[1]), dt)
            dev.gemm_acc(z, Md.T, dev.to_device(herm(x.astype(dt))))
            return herm(np.asarray(dev.to_host(z))).astype(work_dtype(dt))
    else:
        from blocklin.device import pass_device

        src = [source(A)]
        # a Lanczos step does 2 x block flops per entry read: read-bound on a GPU under 'auto' unless wide
        where = pass_device(job.cfg.device, 2.0 * n * n * x0.shape[1], n * n * dt.itemsize, job.device)
        phases = {"passes over A": where}

        def one(x: np.ndarray, step: int, check: bool = False) -> Any:
            y = x.astype(dt)
            b = y.shape[1]
            if cplx:  # A^T conj(X); the check also takes A X from X itself
                y = np.hstack([y, y.conj()]) if check else np.ascontiguousarray(y.conj())
            states = scaling.run(job, lambda sc: run_pass(
                job, rmat_kernel, src, {"Y": y, "n": n, "check": check}, memory=plan.memory,
                reserve=plan.client_bytes,  # a refusal names the total
                description=f"eigsh: Lanczos step {step}", device=where, scale=sc).states)
            z = reduce_sum(states, "Z")
            z = herm(z[:, b:] if cplx and check else z)
            return (z, collect_rows(states, n, y.shape[1])[:, :b]) if check else z

        atx, ax = one(x0, 1, check=True) if check_symmetric else (None, None)  # resumed: checked before
        apply = one
    if check_symmetric:
        wd = work_dtype(dt)
        _check_symmetry(np.asarray(ax, dtype=wd), np.asarray(atx, dtype=wd), symmetry_rtol(dt))
    return apply, atx, phases


def _check_symmetry(ax: np.ndarray, atx: np.ndarray, rtol: float) -> None:
    """``A X`` against ``A^T X`` (``A^H X`` of complex data: a Hermitian matrix is required)."""
    diff = float(np.linalg.norm(ax - atx))
    size = float(np.linalg.norm(ax)) or 1.0
    if diff > rtol * size:
        h = "H" if ax.dtype.kind == "c" else "T"
        raise NotSymmetricError(explain(
            "a", f"must be {'Hermitian' if h == 'H' else 'symmetric'} for eigsh (checked on a random block: "
            f"||A X - A^{h} X|| <= {rtol:.1e} ||A X||)", f"relative asymmetry {diff / size:.2e}",
            f"symmetrize it ((A + A^{h})/2), or use blocklin.svd for a non-{'Hermitian' if h == 'H' else 'symmetric'} "
            "matrix"))


def _result(job: Job, A: Any, plan: SvdPlan, res: LanczosResult, out: Any, overwrite: bool, *, tol: float,
            which: str, seed: int, phases: dict | None = None, order: str = "ascending", ao: Any = None) -> EighResult:
    """Eigenpairs in ``order``, the report, and the output group when ``out`` is given."""
    order = eigen_order(res.values, order, which)
    w = res.values[order].astype(np.finfo(A.dtype).dtype)  # real: float32 of complex64 data
    vecs = res.vectors[:, order].astype(A.dtype)
    report = job.report(passes=job.passes("a"), passes_formula=plan.formula, lanczos_steps=res.steps,
                        restarts=res.restarts, residuals=res.residuals[order].tolist(), tol=tol,
                        converged=res.converged, which=which, seed=seed, block=plan.block, history=res.history,
                        in_core=plan.in_core, plan=plan.to_dict(), phases=phases)
    path = None
    if out is not None:
        path = write_group(job, out, A, {"w": w, "V": vecs}, "eigsh", plan, report, overwrite, ao=ao)
        report["output"] = str(path)
    return EighResult(w, vecs, report, output=path)
