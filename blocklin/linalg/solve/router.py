"""``blocklin.solve`` and ``blocklin.solve_plan``: the parameters checked, the route chosen and called.

The routes: a stored sparse ``a`` (:mod:`~blocklin.linalg.solve.sparse_lsqr`: LSQR on its row-block
products), a square system (:mod:`~blocklin.linalg.solve.square`: LU or Cholesky of ``A`` itself),
the stored regularized Gram matrix when the in-memory one exceeds the budget
(:mod:`~blocklin.linalg.solve.stored_gram`), else the in-memory Tikhonov least squares
(:mod:`~blocklin.linalg.solve.least_squares`: tall ``A`` by the normal equations or the streaming QR,
wide ``A`` by the dual form).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Unpack

import numpy as np

from blocklin.config import Settings, format_size
from blocklin.errors import ParameterError, ShapeError
from blocklin.errors import explain as _msg
from blocklin.linalg.labels import check_rows, is_dataarray, label_solution, labels_of
from blocklin.linalg.solve.least_squares import solve_least_squares
from blocklin.linalg.solve.least_squares_budget import plan_least_squares
from blocklin.linalg.solve.tikhonov import check_lam_max
from blocklin.linalg.solve.weights import check_weights, weight_operand
from blocklin.matrix import Matrix
from blocklin.plan.solve import SolvePlan, plan_solve, small_bytes
from blocklin.runtime.job import Job
from blocklin.sparse import SparseMatrix, as_sparse_matrix
from blocklin.validate import MAX_REFINE, choice, count, flag, float_operand, same_dtype, same_rows

METHODS = ("auto", "normal", "qr")
#: What ``solve`` may assume of ``a``: nothing (least squares; LU for a square system), symmetric
#: positive definite, or symmetric (:mod:`blocklin.linalg.solve.square`).
ASSUME = ("gen", "pos", "sym")


def solve(a: Any, b: Any, *, lam: Any = 0.0, method: str = "auto", assume_a: str = "gen", out: Any = None,
          refine: Any = "auto", overwrite: bool = False, explain: bool = False, fit_intercept: bool = False,
          precision: str = "double", resume: bool = False, updatable: bool = False, tol: Any = None,
          max_iter: Any = None, sample_weight: Any = None, positive: bool = False, lam_per_target: bool = False,
          store_cv_results: bool = False, cv: Any = None, scoring: Any = None,
          **settings: Unpack[Settings]) -> Matrix | SolvePlan:
    """Solve ``min ||A x - b||^2 + lam^2 ||x||^2`` out of core, for tall, square or wide ``A``.

    A stored **sparse** ``a`` (a :class:`~blocklin.sparse.SparseMatrix`, or the path or URL of its
    ``blocklin-csr`` group) is solved by LSQR (Paige and Saunders, ACM TOMS 8(1), 1982) with
    ``damp = lam``, never densified: every iteration is one pass ``S V`` and one pass ``S^T U`` over
    the row blocks for all right-hand sides and lambdas together
    (:mod:`blocklin.linalg.solve.sparse_lsqr`). There ``method`` is ``"auto"`` or ``"lsqr"``, ``lam`` a
    number or a sequence (the rules need the SVD and are refused), ``fit_intercept`` centers
    implicitly, ``tol`` and ``max_iter`` apply, and ``assume_a``, ``precision``, ``refine``, ``resume``
    and ``updatable`` are refused by name. Columns that miss ``tol`` within ``max_iter`` give a
    :class:`~blocklin.errors.ConvergenceWarning` (``x`` is still written; the report says which).

    Parameters
    ----------
    a : path, zarr array, Matrix, NumPy or Dask array, SparseMatrix
        ``m x n``. Never modified.
    b : operand
        ``m x k`` right-hand sides (a 1-D NumPy vector is taken as one column). With a sparse ``a`` it
        is read into memory (``8 m k`` bytes, counted in the plan).
    lam : float, sequence of floats, "gcv", "lcurve", "loo" or ("loo", grid)
        Regularization ``lam >= 0``. A sequence solves every value from one pass (via the SVD of the
        streaming R factor); ``"gcv"`` minimizes generalized cross-validation (Golub, Heath and
        Wahba, 1979) and ``"lcurve"`` takes the corner of the L-curve (Hansen, 1998); both report the
        chosen value and the curve. ``"loo"`` takes the grid value of smallest mean squared
        leave-one-out error, as ``sklearn.linear_model.RidgeCV(alphas=grid**2)`` (its default
        ``cv=None``, ``scoring=None``): the exact errors ``e_i / (1 - h_ii)`` of every grid value
        from one more pass over tall ``A`` (in memory for wide ``A``;
        :mod:`blocklin.linalg.solve.loo`); ``("loo", grid)`` gives the grid (values ``> 0``), ``"loo"``
        alone a grid spanning the spectrum. The report then has ``alpha_`` (``lam**2``),
        ``best_score_`` and ``curve`` (``lam``, ``loo``: the mean squared error per value). ``lam=0``
        is ordinary least squares (full column rank needed for tall ``A``; the minimum-norm solution
        for wide ``A``).
    method : {"auto", "normal", "qr"}
        For tall/square ``A``. ``"normal"``: ``A^T A`` and ``A^T b`` in one pass, Cholesky of
        ``A^T A + lam^2 I``, then (``refine``) passes of iterative refinement against the original
        problem (``r = b - A x``, ``x += K^{-1} (A^T r - lam^2 x)``). ``"qr"``: the R factor and ``Q^T b``
        of a one-pass streaming QR (TSQR, Demmel, Grigori, Hoemmen and Langou, 2012), then the SVD of
        ``R``: accurate when ``lam`` is tiny or ``A`` ill-conditioned (no squaring of the condition
        number). ``"auto"``: the normal equations when the reciprocal condition estimate of
        ``A^T A + lam^2 I`` exceeds ``1e-10``, otherwise QR (one more pass); sequences, GCV and the
        L-curve use QR. The report says which was used and why. Wide ``A`` (``m < n``): ``"normal"`` is the
        dual form ``x = A^T (A A^T + lam^2 I)^{-1} b`` with ``A A^T`` from a SYRK pass (relative error up to
        ``eps ||A||^2 / lam^2``), ``"qr"`` the SVD of the streaming R factor of ``A^T`` (``A A^H = R^H R``, never
        formed; backward stable for ``[A; lam I]``); ``"auto"`` the dual form, switched to the QR route (one
        more pass) where the dual form's error bound at the lambda(s) solved, given or chosen, is
        ``AUTO_DUAL_MARGIN = 100`` times the QR route's or more (:mod:`blocklin.linalg.solve.wide_auto`; not
        with ``sample_weight`` or ``cv=``, whose fits the dual form makes).
    assume_a : {"gen", "pos", "sym"}
        ``"gen"`` (default): the regularized least-squares problem above; a **square** ``A`` with
        ``lam=0`` and ``method="auto"`` is a linear system, solved for any ``n`` by the out-of-core
        LU with partial pivoting (:func:`blocklin.lu`), two out-of-core triangular solves and
        iterative refinement (report ``method="lu"``; ``method="normal"``/``"qr"`` keep the
        least-squares routes, e.g. for a singular ``A``). ``"pos"``: ``A`` square, symmetric positive
        definite, stored in full: the out-of-core tiled Cholesky (:func:`blocklin.cholesky`) instead.
        ``"sym"``: symmetric: Cholesky when it succeeds, else LU (symmetric indefinite). These
        square routes need ``lam=0`` and refine to the dtype's backward error (``out`` keeps ``A``'s
        dtype); see :func:`blocklin.linalg.solve.square.solve_square`.
    precision : {"double", "mixed", "tf32"}
        Square routes only. ``"double"`` (or ``None``): ``A``'s dtype. ``"mixed"``: factor a float64
        ``A`` in float32 and refine in float64 to the float64 backward error (while
        ``cond(A) < ~10^7``; else :class:`~blocklin.errors.ConvergenceError`); the report gives the
        steps and backward error. ``"tf32"``: the same with the factorization's GEMMs on TF32 tensor
        cores on a GPU (for ``cond(A)`` up to about ``10^3``; plain float32 on a CPU).
    out : path, optional
        Output store for ``x`` (``n x k``; for a sequence of ``L`` values ``n x (L k)``, block ``l`` in
        columns ``l k : (l+1) k``). Atomic.
    refine : "auto" or int
        Refinement passes of the normal-equations route. ``"auto"`` (default): one pass when the
        condition estimate of ``A^T A + lam^2 I`` exceeds ``1e4`` (where the normal equations' error
        bound ``cond * eps`` passes ``~1e-12``) or the residual is below ``1e-3 ||b||`` (where
        the Gram formula for it cancels), none otherwise (the residual norm then comes from the
        Gram quantities, ``||b||^2 - 2 x^T A^T b + x^T A^T A x``).
    overwrite : bool
        Replace an existing ``out``.
    explain : bool
        Return the :class:`~blocklin.plan.solve.SolvePlan` without running (kept for compatibility:
        :func:`solve_plan` returns it and always one type).
    resume : bool
        Continue an interrupted run (SIGKILL, Ctrl-C) with the same inputs and parameters: the
        results of its finished passes are loaded instead of recomputed (bit-identical ``x``). The
        square routes (LU, Cholesky) and the stored-Gram route (a Gram matrix over the budget) skip the
        finished tiles of their factorization and their finished steps, kept in a deterministic work
        folder under the temp dir (removed by ``blocklin clean`` once its run is gone).
    fit_intercept : bool
        Fit ``A x + 1 x0 ~ b`` with an unpenalized intercept ``x0`` (per right-hand side), as
        ``sklearn.linear_model.Ridge(alpha=lam**2, fit_intercept=True)``: ``x`` solves the problem
        on the centered ``A - 1 mu^T`` and ``b - 1 bbar``, and ``x0 = bbar - mu^T x``. Nothing is
        copied: tall ``A``'s Gram pass sums the rows less the first row and their column sums, and the
        Gram quantities and refinement residuals get rank-one corrections by the shifted means
        (``A_c^T A_c = A_s^T A_s - m d d^T``, accurate for means far above the spread); wide ``A``
        centers the in-memory ``A A^T`` on both sides. Uses the normal equations (``method="qr"`` is
        refused: the streaming R factor is not centered); lambda sequences and rules then use the
        eigen-decomposition of the centered Gram matrix.
    updatable : bool
        Keep the sums of the normal equations (``A^T A``, ``A^T b``, ``||b||^2``, the means with
        ``fit_intercept``: ``(n + k)^2`` float64) in ``out``, so that :func:`blocklin.update` solves again,
        for the same ``lam`` (or rule), after rows are appended to ``A`` and ``b``
        (:func:`blocklin.append`) by reading only those rows (:mod:`blocklin.linalg.update.solve`). A
        least-squares solve of a tall ``A``; one pass more where the route made no Gram pass (the QR).
    tol : float, optional
        Sparse ``a`` only: LSQR's ``atol = btol`` (default ``1e-10`` for float64 values, ``1e-6`` for
        float32; :data:`blocklin.linalg.solve.sparse_lsqr.DEFAULT_TOL` says why). ``x`` then solves a
        problem whose ``S`` and ``b`` are perturbed by about ``tol`` relative.
    max_iter : int, optional
        Sparse ``a`` only: LSQR iterations at most (two passes each); default ``2 min(m, n)``, at most
        10000.
    sample_weight : vector of length m, optional
        Row weights ``w_i >= 0`` (NumPy, Dask, or a stored vector or ``m x 1`` array; finite, not all
        zero): ``min sum_i w_i (a_i^T x + x0 - b_i)^2 + lam^2 ||x||^2``, as
        ``sklearn.linear_model.Ridge.fit(X, y, sample_weight=w)``: rows scaled by ``sqrt(w_i)`` as they
        are read, the intercept with weighted means (:mod:`blocklin.linalg.solve.weights`). One pass
        over the weights checks them. Tall ``A`` takes the normal equations on the CPU (``method="qr"``
        is refused); GCV and the L-curve apply to the weighted problem with ``m`` the rows of positive
        weight, ``"loo"`` weighs each error by ``sqrt(w_i)`` as ``RidgeCV`` does.
    positive : bool
        Constrain ``x >= 0``, as ``Ridge(positive=True)``: nonnegative least squares on the Cholesky
        factor of the in-memory ``A^T A + lam^2 I`` (exact; :mod:`blocklin.linalg.solve.positive`).
        Tall ``A``, ``lam`` a number or a sequence (the rules choose from the unconstrained spectrum
        and are refused), not ``method="qr"``.
    lam_per_target : bool
        With ``lam="loo"``: one lambda per right-hand side (``RidgeCV(alpha_per_target=True)``);
        ``report["lam"]``, ``alpha_`` and ``best_score_`` are then lists.
    store_cv_results : bool
        With ``lam="loo"``: keep the squared leave-one-out errors of every row, right-hand side and
        grid value in ``x.cv_results_`` and ``report["cv_results_"]`` (NumPy, ``m x k x L``, as
        ``RidgeCV(store_cv_results=True)``'s ``cv_results_`` for a 2-D ``y``; in memory, within the
        budget).
    cv : int, splitter or (train, test) pairs, optional
        With ``lam=("loo", grid)`` (or ``"loo"``): choose lambda by k-fold cross-validation instead of the
        exact leave-one-out, as ``RidgeCV(alphas=grid**2, cv=cv)``: an int is ``KFold(cv)`` without
        shuffling; a splitter (``KFold``, ``GroupKFold``'s splits, ...) or a list of ``(train, test)``
        index pairs whose test sets do not overlap and whose training sets are all other rows. Tall ``A``:
        the per-fold Gram sums from one pass (``folds + 1`` sets of ``n^2 + n k`` float64 in the budget),
        every fold's fit and held-out score from them, then ``x`` at the choice from their totals; wide
        ``A``: every fold in memory from ``A A^T`` (:mod:`blocklin.linalg.solve.kfold`). The grid may hold
        0 (the minimum-norm fit on a fold). The report has ``alpha_``, ``best_score_`` (the mean score over
        the folds at the choice), ``lam_rule="cv"``, ``cv`` and ``curve`` (``score`` per grid value,
        ``fold_scores``); no ``cv_results_`` (``store_cv_results`` and ``lam_per_target`` are refused, as
        RidgeCV refuses them). Real data.
    scoring : str or callable, optional
        The score the cross-validated choice maximizes, scikit-learn's: ``"neg_mean_squared_error"``,
        ``"neg_root_mean_squared_error"``, ``"neg_mean_absolute_error"``, ``"r2"``, ``"explained_variance"``
        (exact from sums of the held-out errors, :mod:`blocklin.linalg.solve.scoring`), or a callable
        ``scoring(estimator, X, y)`` called as ``scoring(identity, predictions, y)`` on the held-out
        predictions (kept in memory: ``lam="loo"``, and ``cv=`` of a wide ``A``; refused with ``cv=`` on a
        tall ``A``, as ``"neg_mean_absolute_error"`` is there). ``None``: RidgeCV's defaults, minus the mean
        squared error for leave-one-out and ``"r2"`` with ``cv``. ``best_score_`` is then the score.
    **settings
        As for every operation: :class:`~blocklin.config.Settings`. The passes of this solver run on the
        CPU; a sparse ``a``'s products run as tasks on the scheduler (groups of row blocks fixed by the
        matrix, :mod:`blocklin.runtime.sparse_pass`: the same bits on every scheduler).

    Returns
    -------
    Matrix
        ``x`` (with a sparse ``a``, also ``iterations``, ``column_iterations``, ``converged``,
        ``column_converged``, ``stop_reasons``, ``tol``, ``nnz``, ``flops`` in ``.report``) with ``.report``:
        ``lam``, ``method`` and ``method_reason``, ``residual_norm``
        (``||A x - b||_2`` per right-hand side), ``solution_norm``, ``objective``, ``passes``,
        ``seconds``, ``peak_memory``, ``cond_estimate`` (of ``A``, or of the regularized problem), and
        ``curve`` for GCV/L-curve. With ``fit_intercept``: ``x.intercept`` (NumPy, ``k`` values, or
        ``L x k`` for a sequence of ``L`` lambdas) and ``report["intercept"]`` (the same as lists).
        An xarray ``DataArray`` ``a`` gives a labelled ``x`` instead (:mod:`blocklin.linalg.labels`): a
        ``DataArray`` over ``a``'s columns, then ``lam`` (the values of a sequence) and ``b``'s columns (a
        2-D ``b``'s dimension, ``"rhs"`` for a matrix without one; renamed ``<name>_2`` where ``a``'s
        columns have that name), which keeps ``report``, ``intercept`` (over ``lam`` and ``b``'s columns
        where ``x`` has them), ``cv_results_`` and the ``Matrix`` itself as ``x.stored``. Two
        ``DataArray`` operands must have equal coordinates along their shared row dimension (rows are
        matched by position: other labels are refused, never reordered).

    Raises
    ------
    ShapeError
        ``b`` does not have one row per row of ``A``.
    ValueError
        ``lam`` negative, NaN, or an unknown rule; unknown ``method``.
    SingularMatrixError
        ``lam = 0`` and ``A`` rank-deficient (numerically): the message gives the condition estimate
        and suggests ``lam > 0`` or ``lam="gcv"``.
    NonFiniteError
        NaN or Inf in ``A`` or ``b``.

    Notes
    -----
    ``cond(A^T A + lam^2 I) <= 1 + (sigma_1 / lam)^2``. Residual and solution norms of the QR and
    sequence routes come from the SVD of ``R`` (``||r||^2 = rho_0^2 + sum (lam^2 beta_i / (s_i^2 + lam^2))^2``);
    the normal route reports ``||b - A x||`` from its refinement pass, updated for the last correction.
    Memory: the in-core problem is ``O((n + k)^2)`` (``O(m^2)`` for wide ``A``); ``A`` streams in row
    strips within the budget. When that in-core problem exceeds the budget (one scalar ``lam``,
    ``method`` "auto" or "normal"), the regularized Gram matrix is stored instead and factored by the
    out-of-core tiled Cholesky (:func:`blocklin.linalg.solve.stored_gram.solve_gram_out_of_core`; the report's
    ``method_reason`` says so), at the accuracy of the normal equations with one refinement step.

    Examples
    --------
    >>> import numpy as np
    >>> import blocklin as bl
    >>> a = np.random.default_rng(0).standard_normal((200, 5))
    >>> x = bl.solve(a, a @ np.arange(5.0)[:, None], lam=0.0)   # ordinary least squares
    >>> np.allclose(x.to_numpy().ravel(), [0, 1, 2, 3, 4]), x.report["method"]
    (True, 'normal')
    """
    extras = {"sample_weight": sample_weight, "positive": positive, "lam_per_target": lam_per_target,
              "store_cv_results": store_cv_results, "cv": cv, "scoring": scoring}
    sparse = as_sparse_matrix(a, settings.get("storage_options"))
    if isinstance(sparse, SparseMatrix):  # a stored sparse matrix: LSQR on its row-block products
        _refuse_sparse_extras(lam, extras)
        return _solve_sparse(sparse, b, lam=lam, method=method, assume_a=assume_a, out=out, refine=refine,
                             overwrite=overwrite, explain=explain, fit_intercept=fit_intercept, precision=precision,
                             resume=resume, updatable=updatable, tol=tol, max_iter=max_iter, settings=settings,
                             own_open=sparse is not a)
    _refuse_sparse_only(method, tol, max_iter)
    _refuse_empty(a, settings.get("storage_options"))
    if is_dataarray(a) and not explain:  # labelled: x over A's columns (and b's), from the unlabelled solve
        check_rows(a, b)  # before anything runs: position-matched rows of other labels solve another problem
        kind, lams = parse_lam(lam, zero_grid=cv is not None)
        x = solve(a.data, b.data if is_dataarray(b) else b, lam=lam, method=method, assume_a=assume_a, out=out,
                  refine=refine, overwrite=overwrite, fit_intercept=fit_intercept, precision=precision, resume=resume,
                  **extras, **settings)
        return label_solution(x, labels_of(a), labels_of(b), b_ndim=_ndim(b),
                              lams=lams if kind == "sequence" else None)
    method, assume_a, kind, lams, precision = _checked(method, assume_a, lam, precision, fit_intercept,
                                                       zero_grid=cv is not None)
    positive, per_target, store_cv = _checked_extras(kind, method, assume_a, sample_weight is not None, positive,
                                                     lam_per_target, store_cv_results)
    scoring = _checked_cv(kind, cv, scoring, per_target, store_cv, method)
    updatable = flag("updatable", updatable)
    weighted = sample_weight is not None
    reason = _square_reason(a, b, assume_a=assume_a, kind=kind, lams=lams, method=method,
                            fit_intercept=fit_intercept or weighted or positive, precision=precision,
                            storage_options=settings.get("storage_options"))
    if updatable and (assume_a != "gen" or reason is not None):
        raise ParameterError(_msg("updatable", "needs a least-squares solve of a tall A (a square system's "
                                  "factors depend on every row)", f"a square solve ({reason or assume_a})",
                                  "recompute after each append, or pass updatable=False"))
    if updatable and (weighted or positive or kind == "loo"):
        what = "sample_weight" if weighted else "positive=True" if positive else "lam='loo'"
        raise ParameterError(_msg("updatable", "keeps the plain normal equations' sums (an update reads only the new "
                                  "rows; leave-one-out errors, weights and the constrained solution need more)", what,
                                  "recompute after each append, or pass updatable=False"))
    if assume_a != "gen" or reason is not None:
        return _solve_square(a, b, assume_a=assume_a, kind=kind, lams=lams, method=method, out=out,
                             overwrite=overwrite, explain=explain, precision=precision, reason=reason, resume=resume,
                             settings=settings)
    refine = count("refine", refine, minimum=0, auto=("auto",), maximum=MAX_REFINE, fix="pass refine=1")
    if explain:  # the plan alone: solve_plan
        return solve_plan(a, b, lam=lam, method=method, refine=refine, fit_intercept=fit_intercept,
                          sample_weight=sample_weight, positive=positive, **settings)
    with Job("solve", **settings) as job:
        A, B = _operands(job, a, b)
        _refuse_complex_extras(A, B, kind=kind, positive=positive, updatable=updatable)
        folds = _folds(cv, A, scoring)
        W = weight_operand(job, sample_weight, A.shape[0]) if weighted else None
        # before anything is written: a refusal names the budget at which every step of the call plans
        plan_least_squares(job, A, B, W, kind=kind, lams=lams, method=method, refine=refine,
                           intercept=bool(fit_intercept), positive=positive, store_cv=store_cv, updatable=updatable,
                           scoring=scoring, folds=folds)
        if _gram_exceeds_budget(job, A, B, kind, method):
            if updatable:
                raise ParameterError(_msg("updatable", "keeps A^T A in memory, which must fit the budget",
                                          f"min(m, n) = {min(A.shape)} columns over memory={format_size(job.cfg.memory)}",
                                          "raise memory=, or pass updatable=False"))
            _refuse_stored_gram_extras(job, A, B, weighted, positive)
            return _solve_gram_stored(job, A, B, lam, lams, method=method, refine=refine, fit_intercept=fit_intercept,
                                      out=out, overwrite=overwrite, resume=resume)
        plan = _least_squares_plan(job, A, B, kind=kind, method=method, refine=refine, fit_intercept=fit_intercept,
                                   weighted=weighted, positive=positive)
        weights = check_weights(job, W) if weighted else None
        return solve_least_squares(job, A, B, plan, lam=lam, kind=kind, lams=lams, method=method, refine=refine,
                                   fit_intercept=fit_intercept, out=out, overwrite=overwrite, resume=resume,
                                   updatable=updatable, W=W, weights=weights, positive=positive,
                                   per_target=per_target, store_cv=store_cv, scoring=scoring, folds=folds)


def solve_plan(a: Any, b: Any, *, lam: Any = 0.0, method: str = "auto", refine: Any = "auto",
               fit_intercept: bool = False, tol: Any = None, max_iter: Any = None, sample_weight: Any = None,
               positive: bool = False, **settings: Unpack[Settings]) -> Any:
    """The plan that :func:`solve` would run, without running it (what ``blocklin solve --explain``
    prints): a :class:`~blocklin.plan.solve.SolvePlan`, or the out-of-core Cholesky plan when the
    regularized Gram matrix exceeds the budget, or the out-of-core LU's plan for a square system
    (square ``a``, ``lam=0``, ``method="auto"``), or for a stored sparse ``a`` the
    :class:`~blocklin.plan.solve.SparseSolvePlan` of its LSQR (passes, bytes read per pass, memory;
    ``fit_intercept``, ``tol`` and ``max_iter`` count there only); same parameters as :func:`solve`
    (``sample_weight`` is not read: the plan names its pass; ``lam="loo"`` the leave-one-out pass)."""
    sparse = as_sparse_matrix(a, settings.get("storage_options"))
    if isinstance(sparse, SparseMatrix):
        _refuse_sparse_extras(lam, {"sample_weight": sample_weight, "positive": positive})
        return _solve_sparse(sparse, b, lam=lam, method=method, assume_a="gen", out=None, refine=refine,
                             overwrite=False, explain=True, fit_intercept=fit_intercept, precision="double",
                             resume=False, updatable=False, tol=tol, max_iter=max_iter, settings=settings,
                             own_open=sparse is not a)
    _refuse_sparse_only(method, tol, max_iter)
    method = choice("method", method, METHODS, fix="pass method='auto'")
    kind, lams = parse_lam(lam)
    weighted = sample_weight is not None
    positive = _checked_extras(kind, method, "gen", weighted, positive, False, False)[0]
    refine = count("refine", refine, minimum=0, auto=("auto",), maximum=MAX_REFINE, fix="pass refine=1")
    if _square_reason(a, b, assume_a="gen", kind=kind, lams=lams, method=method,
                      fit_intercept=bool(fit_intercept) or weighted or positive, precision="double",
                      storage_options=settings.get("storage_options")):  # a square system: the LU's plan
        from blocklin.linalg.factor.lu import lu

        return lu(a, explain=True, **settings)
    with Job("solve", **settings) as job:
        A, B = _operands(job, a, b)
        if _gram_exceeds_budget(job, A, B, kind, method):
            from blocklin.linalg.solve.stored_gram import solve_gram_stored

            _refuse_stored_gram_extras(job, A, B, weighted, positive)
            return solve_gram_stored(job, A, B, lams[0], out=None, overwrite=False, explain=True, refine=refine,
                                     params={})
        return _least_squares_plan(job, A, B, kind=kind, method=method, refine=refine,
                                   fit_intercept=bool(fit_intercept), weighted=weighted, positive=positive)


def _solve_sparse(s: SparseMatrix, b: Any, *, lam: Any, method: str, assume_a: str, out: Any, refine: Any,
                  overwrite: bool, explain: bool, fit_intercept: bool, precision: Any, resume: Any, updatable: Any,
                  tol: Any, max_iter: Any, settings: dict, own_open: bool = False) -> Any:
    """The sparse route (:mod:`~blocklin.linalg.solve.sparse_lsqr`): its refusals, then LSQR or its plan
    (``own_open``: ``s`` opened by the caller from a path)."""
    from blocklin.linalg.solve.sparse_lsqr import refuse_sparse_options, solve_sparse

    kind, lams = parse_lam(lam)
    refuse_sparse_options(method=method, assume_a=assume_a, precision=precision, resume=resume, updatable=updatable,
                          refine=refine, kind=kind)
    return solve_sparse(s, b, lam=lam, kind=kind, lams=lams, method=method, out=out, overwrite=overwrite,
                        explain_only=explain, fit_intercept=flag("fit_intercept", fit_intercept), tol=tol,
                        max_iter=max_iter, settings=settings, own_open=own_open)


def _ndim(b: Any) -> int:
    """``b``'s dimensions as the labelled solution follows them: an array's own (a vector gives one
    solution vector), a stored ``b`` 2 (its columns)."""
    nd = b.ndim if hasattr(b, "ndim") else np.ndim(b) if isinstance(b, (list, tuple)) else 2
    return 1 if nd == 1 else 2


def _refuse_sparse_only(method: str, tol: Any, max_iter: Any) -> None:
    """``method="lsqr"``, ``tol`` and ``max_iter`` belong to the sparse route."""
    given = [name for name, on in (("method", method == "lsqr"), ("tol", tol is not None),
                                   ("max_iter", max_iter is not None)) if on]
    if given:
        raise ParameterError(_msg(given[0], "applies to a stored sparse a only (LSQR); a dense a is solved by the "
                                  "normal equations, QR or LU", f"{given[0]} with a dense a",
                                  f"drop {given[0]}=, or convert a sparse file to a sparse group "
                                  "(blocklin convert A.mtx S.zarr) and pass that"))


def _checked(method: str, assume_a: str, lam: Any, precision: str, fit_intercept: bool,
             zero_grid: bool = False) -> tuple[str, str, str, list[float], str]:
    """``method``, ``assume_a``, ``lam`` (its kind and values; ``zero_grid``: a k-fold grid may hold 0) and
    ``precision`` checked, in that order."""
    method = choice("method", method, METHODS, fix="pass method='auto'")
    hermitian = isinstance(assume_a, str) and assume_a.lower() in ("her", "hermitian")
    assume_a = choice("assume_a", assume_a, ASSUME, fix="pass assume_a='gen' (least squares; LU when square), "
                      "'pos' (SPD) or 'sym' (symmetric)" if not hermitian else
                      "SciPy's 'her' is a Hermitian indefinite factorization (hesv), which blocklin does not have: "
                      "pass assume_a='pos' for a Hermitian positive definite a (Cholesky), else 'gen' (LU)")
    kind, lams = parse_lam(lam, zero_grid=zero_grid)
    from blocklin.linalg.solve.square import solve_precision

    precision = solve_precision(precision)
    if fit_intercept and assume_a != "gen":
        raise ParameterError(_msg("fit_intercept", "needs the least-squares problem (assume_a='gen')",
                                  f"fit_intercept=True with assume_a={assume_a!r}", "drop fit_intercept, or leave "
                                  "assume_a='gen'"))
    return method, assume_a, kind, lams, precision


def parse_lam(lam: Any, zero_grid: bool = False) -> tuple[str, list[float]]:
    """``(kind, values)``: ``"scalar"``, ``"sequence"``, a rule (``"gcv"``, ``"lcurve"``: no values) or
    ``"loo"`` with its grid (empty for the default grid; ``zero_grid``: values ``>= 0``, k-fold's)."""
    if isinstance(lam, str):
        rule = lam.strip().lower()
        if rule in ("gcv", "lcurve", "l-curve"):
            return ("gcv" if rule == "gcv" else "lcurve"), []
        if rule == "loo":
            return "loo", []
        raise ParameterError(_msg("lam", "must be a number >= 0, a sequence of them, 'gcv', 'lcurve', 'loo' or "
                                 "('loo', grid)", repr(lam), "pass lam=1e-3, lam=[1e-4, 1e-3, 1e-2] or lam='gcv'"))
    if isinstance(lam, tuple) and lam and isinstance(lam[0], str):
        if len(lam) == 2:
            _refuse_complex(lam[1], "grid of ('loo', grid)")
        return "loo", _loo_grid(lam, zero_grid)
    _refuse_complex(lam, "")
    if isinstance(lam, (Sequence, np.ndarray)) and not isinstance(lam, str):
        if _has_strings(lam):
            raise ParameterError(_msg("lam", "sequence must hold numbers (a string is not read as one)", repr(lam),
                                     "pass lam=[1e-4, 1e-3, 1e-2]"))
        vals = [float(v) for v in np.asarray(lam, dtype=float).ravel()]
        kind = "sequence"
        if not vals:
            raise ParameterError(_msg("lam", "sequence must not be empty", "[]", "pass at least one value"))
    else:
        try:
            vals = [float(lam)]
        except (TypeError, ValueError):
            raise ParameterError(_msg("lam", "must be a number >= 0, a sequence of them, 'gcv' or 'lcurve'",
                                     repr(lam), "pass lam=1e-3")) from None
        kind = "scalar"
    for v in vals:
        if not math.isfinite(v) or v < 0:
            raise ParameterError(_msg("lam", "must be finite and >= 0 (it multiplies ||x|| in "
                                     "min ||A x - b||^2 + lam^2 ||x||^2)", repr(v), "pass lam=0.0 or a positive value"))
    return kind, vals


def _refuse_complex(values: Any, what: str) -> None:
    """Refuse complex values of ``lam`` (or of its grid), a zero imaginary part included: NumPy's cast to
    float drops the imaginary part with only a ``ComplexWarning``, and ``lam=np.complex128(2j)`` had been
    solved as ``lam=0``."""
    if _has_strings(values):
        return  # refused by the caller, naming the string
    try:
        kind = np.asarray(values).dtype.kind
    except (TypeError, ValueError):
        return
    if kind == "c" or (kind == "O" and any(isinstance(v, (complex, np.complexfloating))
                                           for v in np.asarray(values, dtype=object).ravel())):
        raise ParameterError(_msg("lam", f"{what + ' ' if what else ''}must be real (lam^2 weighs ||x||^2, also of "
                                  "complex data; a complex value is not read as its real part)", repr(values),
                                  "pass real values, e.g. lam=float(np.real(lam)) where the imaginary part is 0"))


def _has_strings(values: Any) -> bool:
    """Strings among ``values``: NumPy would read ``"1"`` as 1.0 (RidgeCV refuses a string alpha)."""
    return any(isinstance(v, (str, bytes)) for v in np.asarray(values, dtype=object).ravel())


def _loo_grid(lam: tuple, zero_ok: bool = False) -> list[float]:
    """The grid of ``lam=("loo", grid)``: values finite and > 0 (the leave-one-out formula divides by
    ``1 - h_ii``, which is 0 for an unregularized fit through a row of leverage 1; RidgeCV refuses 0 too);
    ``zero_ok`` (``cv=``: each fold is fitted, the minimum-norm fit at 0, as RidgeCV takes it): ``>= 0``."""
    fix = "pass lam=('loo', [0.1, 1.0, 10.0]) (lam = sqrt(alpha) of RidgeCV's alphas), or lam='loo'"
    if lam[0].strip().lower() != "loo" or len(lam) > 2:
        raise ParameterError(_msg("lam", "as a tuple must be ('loo', grid)", repr(lam), fix))
    if len(lam) == 1:
        return []
    if _has_strings(lam[1]):
        raise ParameterError(_msg("lam", "grid of ('loo', grid) must be numbers (a string is not read as one)",
                                  repr(lam[1]), fix))
    try:
        vals = [float(v) for v in np.asarray(lam[1], dtype=float).ravel()]
    except (TypeError, ValueError):
        raise ParameterError(_msg("lam", "grid of ('loo', grid) must be numbers", repr(lam[1]), fix)) from None
    if not vals:
        raise ParameterError(_msg("lam", "grid of ('loo', grid) must not be empty", "[]", fix))
    for v in vals:
        if zero_ok and math.isfinite(v) and v >= 0:
            continue
        if not math.isfinite(v) or v <= 0:
            raise ParameterError(_msg("lam", "grid values of ('loo', grid) must be finite and > 0 (leave-one-out "
                                      "divides by 1 - h_ii, which lam = 0 can make 0; with cv= they may be 0)",
                                      repr(v), fix))
    return vals


def _checked_extras(kind: str, method: str, assume_a: str, weighted: bool, positive: Any, per_target: Any,
                    store_cv: Any) -> tuple[bool, bool, bool]:
    """``positive``, ``lam_per_target`` and ``store_cv_results`` checked against the other options."""
    positive = flag("positive", positive)
    per_target = flag("lam_per_target", per_target)
    store_cv = flag("store_cv_results", store_cv)
    for name, on in (("lam_per_target", per_target), ("store_cv_results", store_cv)):
        if on and kind != "loo":
            raise ParameterError(_msg(name, "applies to the leave-one-out choice (lam='loo' or ('loo', grid))",
                                      f"{name}=True with lam of kind {kind!r}", f"pass lam='loo', or drop {name}"))
    if positive and kind in ("gcv", "lcurve", "loo"):
        raise ParameterError(_msg("positive", "needs lam given (a number or a sequence): the rules choose lam from "
                                  "the unconstrained problem's spectrum, which the constrained solution does not have",
                                  f"positive=True with lam={kind!r}", "choose lam without the constraint first "
                                  "(e.g. solve(a, b, lam='loo').report['lam']), then solve with that lam and "
                                  "positive=True; or pass a sequence and compare"))
    for name, on in (("positive", positive), ("sample_weight", weighted)):
        if on and method == "qr":
            raise ParameterError(_msg("method", f"'qr' cannot take {name} (the streaming R factor is of the "
                                      "unweighted, unconstrained A)", f"method='qr' with {name}",
                                      "pass method='auto' or 'normal' (the normal equations)"))
        if on and assume_a != "gen":
            raise ParameterError(_msg(name, "needs the least-squares problem (assume_a='gen')",
                                      f"{name} with assume_a={assume_a!r}", f"drop {name}, or leave assume_a='gen'"))
    return positive, per_target, store_cv


def _checked_cv(kind: str, cv: Any, scoring: Any, per_target: bool, store_cv: bool, method: str) -> Any:
    """``cv`` and ``scoring`` checked against the other options; ``scoring`` as
    :func:`blocklin.linalg.solve.scoring.checked` returns it."""
    from blocklin.linalg.solve import kfold
    from blocklin.linalg.solve import scoring as scorers

    scoring = scorers.checked(scoring)
    if scoring is not None and kind != "loo":
        raise ParameterError(_msg("scoring", "applies to the cross-validated choice of lambda (lam='loo' or "
                                  "('loo', grid), with or without cv=)", f"scoring={scoring!r} with lam of kind "
                                  f"{kind!r}", "pass lam=('loo', grid), or drop scoring"))
    if cv is not None:
        kfold.refuse_options(cv, kind=kind, per_target=per_target, store_cv=store_cv)
        if method == "qr":
            raise ParameterError(_msg("method", "'qr' cannot take cv= (the folds' fits come from their Gram sums)",
                                      "method='qr' with cv", "pass method='auto' or 'normal'"))
    return scoring


def _folds(cv: Any, A: Any, scoring: Any) -> Any:
    """The folds of ``cv`` over ``A``'s rows (None without ``cv``); a tall ``A`` takes the scorers the fold
    sums give."""
    if cv is None:
        return None
    from blocklin.linalg.solve import kfold

    m, n = A.shape
    if m >= n:
        kfold.refuse_tall_scoring(scoring, m, n)
    return kfold.folds_of(cv, m)


def _refuse_sparse_extras(lam: Any, extras: dict) -> None:
    """A stored sparse ``a`` (LSQR) takes none of ``sample_weight``, ``positive``, ``lam='loo'``, ``cv``,
    ``scoring``."""
    kind = parse_lam(lam)[0]
    given = [k for k, v in extras.items()
             if (v is not None if k in ("sample_weight", "cv", "scoring") else bool(v))]
    if kind == "loo" or given:
        what = given[0] if given else "lam"
        raise ParameterError(_msg(what, "is not available for a stored sparse a (LSQR on its row-block products: no "
                                  "row weights, constraints or leave-one-out hat diagonals)",
                                  f"{what} with a sparse a", "drop it, or convert a dense-enough matrix to a dense "
                                  "array (blocklin convert S.mtx D.zarr --dense)"))


def _refuse_stored_gram_extras(job: Job, A: Any, B: Any, weighted: bool, positive: bool) -> None:
    """The stored, out-of-core Gram route neither weighs rows nor constrains ``x``."""
    if weighted or positive:
        (m, n), k = A.shape, B.shape[1]
        what = "sample_weight" if weighted else "positive"
        raise ParameterError(_msg(what, "needs the Gram matrix in memory (the stored, out-of-core Gram route "
                                  "neither weighs rows nor constrains x)",
                                  f"min(m, n) = {min(m, n)} needs {format_size(small_bytes(min(m, n), k))}, over "
                                  f"the budget of {format_size(job.cfg.memory)}", "raise memory="))


def _operands(job: Job, a: Any, b: Any) -> tuple[Any, Any]:
    """``A`` and ``B`` (a 1-D ``b`` as one column), checked."""
    if isinstance(b, np.ndarray) and b.ndim == 1:
        b = b.reshape(-1, 1)
    A, B = job.operand(a, "a", integers="cast"), job.operand(b, "b", integers="cast")
    same_rows(A, B)
    float_operand(A, "solve", complex_ok=True), float_operand(B, "solve", complex_ok=True)
    same_dtype(A, B, complex_promotion=True)  # a real and a complex operand of one precision: complex x
    return A, B


def _refuse_complex_extras(A: Any, B: Any, *, kind: str, positive: bool, updatable: bool) -> None:
    """What the least-squares routes of complex data do not take, each refused by name with its reason."""
    if "c" not in (A.dtype.kind, B.dtype.kind):
        return
    dts = f"a: {A.dtype.name}, b: {B.dtype.name}"
    if positive:
        raise ParameterError(_msg("positive", "applies to real data (x >= 0 is an order complex numbers do not "
                                  "have)", f"positive=True with {dts}", "drop positive, or split the problem into "
                                  "real and imaginary parts ([[Re, -Im], [Im, Re]]) and constrain those"))


def _gram_exceeds_budget(job: Job, A: Any, B: Any, kind: str, method: str) -> bool:
    """A single-lambda solve whose in-core Gram problem does not fit: the stored-Gram Cholesky route."""
    return small_bytes(min(A.shape), B.shape[1]) > job.cfg.memory and kind == "scalar" and method != "qr"


def _solve_gram_stored(job: Job, A: Any, B: Any, lam: Any, lams: list[float], *, method: str, refine: Any,
                       fit_intercept: bool, out: Any, overwrite: bool, resume: bool) -> Matrix:
    """The stored-Gram route, with ``lam`` as given (it does not scale ``A``) and no intercept."""
    from blocklin.linalg.solve.stored_gram import solve_gram_stored

    check_lam_max(lams)
    if fit_intercept:
        (m, n), k = A.shape, B.shape[1]
        raise ParameterError(_msg("fit_intercept", "needs the Gram matrix of the centered problem in "
                                  "memory (the stored, out-of-core Gram route does not center)",
                                  f"min(m, n) = {min(m, n)} needs {format_size(small_bytes(min(m, n), k))}, "
                                  f"over the budget of {format_size(job.cfg.memory)}", "raise memory=, or "
                                  "center A and b "
                                  "yourself and solve without fit_intercept"))
    return solve_gram_stored(job, A, B, lams[0], out=out, overwrite=overwrite, explain=False, refine=refine,
                             params={"lam": lam, "method": method}, resume=resume)


def _least_squares_plan(job: Job, A: Any, B: Any, *, kind: str, method: str, refine: Any,
                        fit_intercept: bool, weighted: bool = False, positive: bool = False) -> SolvePlan:
    """The in-memory route's plan; ``positive`` refused for a wide ``A``."""
    (m, n), k = A.shape, B.shape[1]
    plan = plan_solve(m, n, k, method=method, memory=job.cfg.memory, lam_kind=kind,
                      refine=1 if refine == "auto" else refine, weighted=weighted, positive=positive,
                      fit_intercept=bool(fit_intercept))
    if plan.orientation == "wide" and positive:
        raise ParameterError(_msg("positive", "needs a tall or square a (rows >= columns: the n x n Gram matrix "
                                  "in memory, whose Cholesky factor the nonnegative least squares runs on)",
                                  f"a {m} x {n}", "solve the transposed problem if that is what you mean, or "
                                  "drop positive"))
    return plan


def _refuse_empty(a: Any, storage_options: dict | None) -> None:
    """An ``A`` with no rows or no columns is refused by name: its passes had divided by a zero strip
    size or summed a SYRK of no columns (a ZeroDivisionError or NumPy's "unexpected array size")."""
    from blocklin.linalg.solve.square import operand_shape

    shape = operand_shape(a, storage_options) if not is_dataarray(a) else tuple(a.shape)
    if shape is not None and 0 in shape:
        raise ShapeError(_msg("a", "must have at least one row and one column", f"shape {shape[0]} x {shape[1]}",
                              "blocklin.lstsq(a, b) returns x = 0 (no unknowns, or no equations to fit) for such a "
                              "matrix, as numpy.linalg.lstsq does"))


def _square_reason(a: Any, b: Any, *, assume_a: str, kind: str, lams: list[float], method: str, fit_intercept: bool,
                   precision: str, storage_options: dict | None) -> str | None:
    """Why a ``gen`` problem is solved as a square system (None: least squares); ``precision="mixed"``
    is refused where no square route runs. ``storage_options``: the call's, for operands at URLs."""
    from blocklin.linalg.solve.square import dtypes_known_square, operand_shape, square_route

    shape = operand_shape(a, storage_options) if assume_a == "gen" else None
    reason = square_route(shape, assume_a=assume_a, lam_kind=kind, lams=lams, method=method,
                          fit_intercept=fit_intercept,
                          same_dtypes=dtypes_known_square(a, b, storage_options)) if shape is not None else None
    if assume_a == "gen" and reason is None and precision != "double":
        raise ParameterError(_msg("precision", f"'{precision}' applies to square systems (square a, lam=0, method='auto', "
                                  "or assume_a='pos'/'sym')", f"precision={precision!r} for a least-squares problem "
                                  f"(a {shape}, lam {lams or kind}, method {method!r})", "drop precision="))
    return reason


def _solve_square(a: Any, b: Any, *, assume_a: str, kind: str, lams: list[float], method: str, out: Any,
                  overwrite: bool, explain: bool, precision: str, reason: str | None, resume: bool, settings: dict) -> Any:
    """The square routes: Cholesky (``pos``, ``sym``) or LU (``gen``, ``sym``) of ``A`` itself, any size."""
    if kind != "scalar" or lams[0] != 0.0:
        raise ParameterError(_msg("lam", f"must be 0 with assume_a='{assume_a}' (A itself is factored)",
                                  repr(lams or kind), "drop lam, or leave assume_a='gen' for the regularized "
                                  "least-squares problem"))
    if method != "auto":
        raise ParameterError(_msg("method", f"must be 'auto' with assume_a='{assume_a}' (the method is "
                                  f"{'Cholesky' if assume_a == 'pos' else 'Cholesky or LU'})", repr(method),
                                  "drop method="))
    if explain:
        from blocklin.linalg.factor.cholesky import cholesky
        from blocklin.linalg.factor.lu import lu

        return (cholesky if assume_a == "pos" else lu)(a, explain=True, **settings)
    from blocklin.linalg.solve.square import solve_square

    return solve_square(a, b, out, assume_a=assume_a, precision=precision, reason=reason, overwrite=overwrite,
                        resume=resume, **settings)


__all__ = ["ASSUME", "METHODS", "solve", "solve_plan"]
