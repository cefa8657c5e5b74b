"""``blocklin.update(OUT)``: a result brought up to date after rows were appended to its inputs.

Every output records what it was computed from (``covers`` in its ``blocklin`` attribute:
:func:`blocklin.storage.versions.coverage`). :func:`update` checks each input against that record
(:func:`blocklin.storage.versions.growth`: grown by appends alone, nothing else changed) and hands
the new rows to the result's updater, which reads only them and rewrites the result atomically
(the same commit protocol as every output; resumable with ``resume=True``).

Which results can be updated, and how (each updater's module says why its update is exact or
within which bound):

================  ==============================================================================
``gram``           ``A^T A``: the new rows' Gram added to the stored one (:mod:`.gram`)
``matmul``         ``A^T B`` (``trans_a=True``, no ``c``): the new rows' product added (:mod:`.products`)
``qr``             ``R`` alone (``mode="r"``): the R of the old R stacked on the new rows' TSQR (:mod:`.qr`)
``svd``, ``pca``   computed with ``updatable=True``: the kept co-moments merged with the new rows',
                   the factors from the updated Gram, the old scores rotated with a computed error
                   bound; recomputed where a triplet or score would miss ``tol`` (:mod:`.svd`)
``svd`` (sketch)   ``method="sketch", updatable=True``: the new rows' sketch added to the kept state
                   (a sum over rows), the sketch finished again from it: the sketch of the grown
                   matrix with the same seed up to the order of its sums (:mod:`.sketch`)
``solve``          a tall least-squares / ridge solve computed with ``updatable=True``: the kept sums
                   of its normal equations plus the new rows', solved again for the same ``lam``,
                   sequence or rule; recomputed where they are ill-conditioned (:mod:`.solve`)
================  ==============================================================================

Results of a stored sparse matrix (a ``blocklin-csr`` group) record the version they cover as dense
inputs' do; an ``svd``/``pca`` of one kept with ``updatable=True`` is updated the same way, its new
rows read as CSR strips (recomputed by the sparse route where the update would miss ``tol``); its Gram
``S^T S`` and its product ``S^T B`` add the appended rows' sums, read as CSR strips
(:mod:`.sparse_products`); its other results are refused once it grew.

Others are refused with the command that recomputes them: products ``A B`` (the result grows),
inverses and factorizations of square matrices depend on every row; ``eigsh`` results are not
updated yet.
"""

from __future__ import annotations

from typing import Any, Unpack

import numpy as np

from blocklin.config import Settings, resolve
from blocklin.errors import ParameterError, StoreNotFoundError, explain
from blocklin.linalg.update.gram import update_gram
from blocklin.linalg.update.products import update_matmul
from blocklin.linalg.update.qr import update_qr
from blocklin.linalg.update.sketch import is_sketch, update_sketch
from blocklin.linalg.update.solve import update_solve
from blocklin.linalg.update.svd import Recompute, update_svd
from blocklin.linalg.update.svd import load as load_svd
from blocklin.matrix import Matrix
from blocklin.runtime.job import Job
from blocklin.storage.backend import backend
from blocklin.storage.location import as_location
from blocklin.storage.sparse import is_sparse
from blocklin.storage.versions import SPARSE_FORMAT, Growth, growth

#: Operations whose results :func:`update` brings up to date, and their updaters.
UPDATABLE = {"gram": update_gram, "matmul": update_matmul, "qr": update_qr, "svd": update_svd, "solve": update_solve}


def _provenance(out: Any, storage_options: dict | None) -> tuple[Any, dict]:
    import json

    loc = as_location(out, storage_options, name="out")
    raw = backend(loc).try_read("zarr.json")
    if raw is None:
        raise StoreNotFoundError(explain("out", "must name a result blocklin wrote", f"{loc.url!r}, which holds no "
                                         "zarr.json", "pass the output path of the operation to update"))
    prov = (json.loads(raw).get("attributes") or {}).get("blocklin")
    if not isinstance(prov, dict) or "operation" not in prov:
        raise ParameterError(explain("out", "must be a result blocklin wrote", f"{loc.url!r}, without blocklin "
                                     "provenance", "pass the output of a blocklin operation"))
    return loc, prov


def status(out: Any, *, storage_options: dict | None = None) -> dict:
    """Whether a result is current: ``{"operation", "current": bool or None, "inputs": [...],
    "updatable": bool}``, per input its rows then and now, or why it cannot be told."""
    loc, prov = _provenance(out, storage_options)
    covers = prov.get("covers") or []
    inputs, current = [], True if covers else None
    for c in covers:
        try:
            g = growth(c, as_location(c["url"], storage_options, name="input"))
            inputs.append({"url": g.url, "rows_then": g.old_rows, "rows_now": g.rows, "current": g.current})
            current = current and g.current
        except (ParameterError, OSError) as exc:
            inputs.append({"url": c.get("url"), "error": str(exc)})
            current = False
    return {"operation": prov["operation"], "current": current, "inputs": inputs,
            "updatable": _updatable(prov)}


def _updatable(prov: dict) -> bool:
    params = prov.get("params") or {}
    if prov["operation"] == "svd":
        return isinstance(params.get("update"), dict)
    if prov["operation"] == "solve":
        return bool(params.get("updatable"))
    if prov["operation"] == "qr":
        return params.get("mode") == "r"
    if prov["operation"] == "matmul":
        return params.get("route") == "gram" and not params.get("trans_b") or \
            bool(params.get("trans_a")) and not params.get("trans_b") and not params.get("beta") and \
            not params.get("dense_left")  # X S^T of a dense X: its result grows by rows
    return prov["operation"] in UPDATABLE and not params.get("trans")


def update(out: Any, *, resume: bool = False, **settings: Unpack[Settings]) -> Any:
    """Bring a result up to date with rows appended to its inputs since it was computed.

    Reads only the appended rows (:func:`blocklin.append`) and rewrites ``out`` atomically: a reader
    sees the old result or the new one. A result that is already current is returned unchanged.

    Parameters
    ----------
    out : path, URL or Location
        A result blocklin wrote (its provenance records which version of each input it covers).
    resume : bool
        Continue an interrupted update (same inputs: identical bits).
    **settings
        As for every operation: :class:`~blocklin.config.Settings` (``memory``, ``scheduler``,
        ``storage_options`` for URLs, ...).

    Returns
    -------
    Matrix, SVDResult or PCAResult
        The updated result as its operation returns it (a Matrix for ``gram``, ``(U, s, Vt)`` for
        ``svd``, a ``PCAResult`` for ``pca`` with the options it was fitted with: ``n_components``,
        ``whiten``, ``scale``; its factors are ``.svd``), a Matrix with ``.intercept`` for ``solve`` as
        :func:`blocklin.solve` returns it, current or not); ``.report["updated"]`` says which rows were
        read and how the result was updated (``None`` when it was current).

    Raises
    ------
    ParameterError
        When an input changed other than by appended rows (rows rewritten, columns added, chunks
        changed), or when the result's operation cannot be updated: the message names the command
        that recomputes it.

    Examples
    --------
    >>> import numpy as np
    >>> import blocklin as bl
    >>> _ = bl.from_array(np.ones((4, 2)), "U.zarr", chunks=(2, 2))
    >>> _ = bl.gram("U.zarr", "UG.zarr")
    >>> _ = bl.append("U.zarr", np.full((2, 2), 2.0))
    >>> bl.update("UG.zarr").to_numpy()
    array([[12., 12.],
           [12., 12.]])
    """
    options = resolve(storage_options=settings.get("storage_options")).storage_options
    loc, prov = _provenance(out, options)
    op = prov["operation"]
    covers = prov.get("covers")
    name = "pca" if _is_pca(prov) else op
    sparse = _sparse_inputs(prov, options) if not covers else []
    if sparse:  # computed before results of sparse matrices recorded the version they cover
        raise ParameterError(explain(
            "out", "must record which version of each input it covers", f"{loc.url!r}, the {name} of the sparse "
            f"matrix {sparse[0]!r}, records none (computed by a blocklin before 2026-12-07)",
            f"rerun blocklin.{name} with the same arguments and overwrite=True"))
    if not covers:
        raise ParameterError(explain("out", "must record which version of each input it covers", f"{loc.url!r} "
                                     f"({op}) records none (an in-memory input, an integer input read through a float64 copy, or "
                                     "written by an older blocklin)", "recompute it with --overwrite on stored "
                                     "floating-point inputs (blocklin convert --dtype float64 casts integer data)"))
    grown: list[Growth] = [growth(c, as_location(c["url"], options, name="input")) for c in covers]
    stale_sparse = [g for c, g in zip(covers, grown) if c.get("format") == SPARSE_FORMAT and not g.current]
    sums = op in ("gram", "matmul") and _updatable(prov)  # S^T S, S^T B: sums over the rows
    if stale_sparse and not sums and not (op == "svd" and _updatable(prov) and not is_sketch(prov)):
        g = stale_sparse[0]
        kept = ("a Gram S^T S, a product S^T B (matmul(S, B, trans_a=True)), or an svd or pca computed with "
                "updatable=True (it keeps the co-moments an update reads)")
        raise ParameterError(explain(
            "out", f"must be {kept} to be updated from the rows appended to a stored sparse matrix",
            f"{loc.url!r}, the {name} of the sparse matrix {g.url!r}, which grew from {g.old_rows} to {g.rows} rows "
            "since", f"rerun blocklin.{name} with the same arguments and overwrite=True"
            + (" (and updatable=True, for updates after later appends)" if name in ("svd", "pca") else "")))
    if all(g.current for g in grown):
        report = {"operation": op, "updated": None, "current": True}
        if op == "svd":
            return _as_fitted(load_svd(loc, report), loc, prov)
        result = Matrix(loc)
        result.report = report
        if op == "solve":  # as after an update: x.intercept (None without one), kept in its report
            fitted = (prov.get("params") or {}).get("fit_intercept")
            stored = (prov.get("report") or {}).get("intercept")
            result.intercept = np.asarray(stored) if fitted and stored is not None else None
            if result.intercept is not None:
                report["intercept"] = stored
        return result
    updater = update_sketch if op == "svd" and is_sketch(prov) else UPDATABLE.get(op)
    if updater is None:
        cli = {"matmul": "gemm", "eigsh": "eigs"}.get(op, op)  # the command that computes what the function does
        raise ParameterError(explain(
            "out", "must be a result blocklin can update from appended rows (" + ", ".join(sorted(UPDATABLE)) + ")",
            f"{loc.url!r}, {'an' if op[:1] in 'aeiou' else 'a'} {op} result",
            f"recompute it on today's input: rerun blocklin {cli} (blocklin.{op} in Python) with the same "
            "arguments and --overwrite (overwrite=True)"))
    with Job(f"update-{op}", **settings) as job:
        result = updater(job, loc, prov, grown, resume=resume)
    if isinstance(result, Recompute):  # the update would miss tol: a full run, with the same parameters
        try:
            result = _recompute(loc, prov, grown, result.why, settings)
        except ParameterError as exc:  # say that it came from the recompute, not from a call the user made
            if type(exc) is not ParameterError:
                raise
            raise ParameterError(f"{exc} (the update recomputed {loc.url} from every row, since {result.why}; "
                                 "the result is unchanged)") from exc
    if op == "svd":  # the provenance as the update committed it (the co-moments' count)
        result = _as_fitted(result, loc, _provenance(loc, options)[1])
    return result


def _sparse_inputs(prov: dict, options: dict | None) -> list[str]:
    """The stored sparse matrices (``blocklin-csr`` groups) among the inputs a result records."""
    from blocklin.storage.sparse import is_sparse

    found = []
    for url in prov.get("inputs") or []:
        try:
            if isinstance(url, str) and is_sparse(as_location(url, options, name="input")):
                found.append(url)
        except (ParameterError, OSError):
            continue
    return found


def _recompute_sparse(loc: Any, params: dict, url: str, settings: dict) -> Any:
    """The updatable ``svd`` or ``pca`` of a stored sparse matrix run again with its recorded parameters
    (a PCA through its centered operator: :mod:`blocklin.linalg.lowrank.sparse_pca`)."""
    from blocklin.linalg.lowrank.svd import factorize

    upd = params["update"]
    kw = dict(method=upd["method"], oversample=int(upd["oversample"]), tol=upd["tol"], seed=upd["seed"], out=loc,
              overwrite=True, **settings)
    if not isinstance(params.get("pca"), dict):
        return factorize(url, int(upd["k"]), signs=bool(upd["signs"]), updatable=True, **kw)
    from blocklin.linalg.lowrank.sparse_pca import sparse_pca
    from blocklin.sparse import as_sparse_matrix

    res = sparse_pca(as_sparse_matrix(url, settings.get("storage_options")), int(upd["k"]), scale=False,
                     resume=False, updatable=True, factorize=factorize, svd_kw=dict(kw, own_open=True),
                     record=lambda *_: params["pca"])[0]
    return res


def _is_pca(prov: dict) -> bool:
    return isinstance((prov.get("params") or {}).get("pca"), dict)


def stored_factorization(loc: Any, meta: dict | None) -> Any:
    """The ``svd`` or ``pca`` result stored at ``loc`` (a Location) as its operation returns it (an
    ``SVDResult``, or a ``PCAResult`` with the options it was fitted with), its report the stored one;
    ``None`` where ``loc`` holds no committed svd result group (an array, another result, nothing).
    ``meta``: the group's ``zarr.json`` as the caller read it (:func:`blocklin.storage.sparse.group_metadata`;
    None: no group). Small reads: ``S``, ``Vt`` and what a PCA's variances need."""
    prov = ((meta or {}).get("attributes") or {}).get("blocklin")
    if meta is None or not isinstance(prov, dict) or prov.get("operation") != "svd":
        return None
    return _as_fitted(load_svd(loc, dict(prov.get("report") or {})), loc, prov)


def _as_fitted(res: Any, loc: Any, prov: dict) -> Any:
    """A stored PCA's factors as :func:`blocklin.pca` returns them (a ``PCAResult`` with the options it
    was fitted with: :mod:`blocklin.linalg.lowrank.pca_stored`); an svd's as they are."""
    params = prov.get("params") or {}
    if not isinstance(params.get("pca"), dict):
        return res
    from blocklin.linalg.lowrank.pca_stored import stored_pca

    return stored_pca(res, loc, params)


def _recompute(loc: Any, prov: dict, grown: list[Growth], why: str, settings: dict) -> Any:
    """Rerun the operation a result records (its parameters) over its output, updatable again."""
    params = prov["params"]
    g = grown[0]
    if prov["operation"] == "solve":
        from blocklin.linalg.solve.router import solve

        res = solve(g.url, grown[1].url, lam=params["lam"], method=params["method"], refine=params.get("refine", "auto"),
                    fit_intercept=bool(params.get("fit_intercept")), out=loc, overwrite=True, updatable=True, **settings)
    elif is_sparse(as_location(g.url, settings.get("storage_options"), name="input")):
        res = _recompute_sparse(loc, params, g.url, settings)
    else:
        from blocklin.linalg.lowrank.svd import factorize

        upd = params["update"]
        res = factorize(g.url, int(upd["k"]), method=upd["method"], oversample=int(upd["oversample"]), tol=upd["tol"],
                        seed=upd["seed"], out=loc, overwrite=True, center=bool(upd["center"]),
                        scale=bool(upd["scale"]), signs=bool(upd["signs"]), updatable=True,
                        record=(lambda mom, scaled: params["pca"]) if isinstance(params.get("pca"), dict) else None,
                        **settings)
    res.report["updated"] = {"input": g.url, "rows_before": g.old_rows, "rows": g.rows, "rows_read": g.rows,
                             "how": f"recomputed: {why}"}
    return res


__all__ = ["UPDATABLE", "status", "stored_factorization", "update"]
