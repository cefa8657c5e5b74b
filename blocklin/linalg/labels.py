"""xarray inputs and labelled results: a ``DataArray`` (NumPy- or Dask-backed) given to ``svd``, ``pca``,
``solve`` or ``gram`` is computed from its data as any array is (:func:`blocklin.operands.as_operand`
stages its ``.data``, a Dask array lazily), and the results carry the dimensions and coordinates they
map to, as xeofs users expect: the factors over the sample and feature dimensions and a ``mode``
dimension (1, 2, ...), the solution over the features, the Gram matrix over the features twice.

Stored results (the long factor, ``x``, the Gram matrix) become Dask-backed ``DataArray``s over their
zarr stores: nothing is loaded until asked.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: The dimension of the singular triplets and components (xeofs names it so, counting from 1).
MODE = "mode"


def is_dataarray(x: Any) -> bool:
    """``x`` is an ``xarray.DataArray`` (duck-typed: xarray is an optional dependency)."""
    return type(x).__module__.startswith("xarray") and hasattr(x, "dims") and hasattr(x, "coords")


class Labels:
    """The dimensions and coordinates of a 2-D (or 1-D) ``DataArray`` input."""

    def __init__(self, x: Any) -> None:
        if x.ndim not in (1, 2):
            from blocklin.errors import ShapeError, explain

            raise ShapeError(explain("a", "must be a 1-D or 2-D DataArray", f"dims {x.dims}",
                                     "select or stack dimensions first (DataArray.stack)"))
        self.dims = tuple(x.dims)
        self.coords = {d: x.coords[d] for d in self.dims if d in x.coords}

    def coord(self, dim: str) -> dict:
        return {dim: self.coords[dim]} if dim in self.coords else {}

    @property
    def rows(self) -> str:
        return self.dims[0]

    @property
    def cols(self) -> str | None:
        return self.dims[1] if len(self.dims) > 1 else None


def labels_of(x: Any) -> Labels | None:
    return Labels(x) if is_dataarray(x) else None


def _xr() -> Any:
    import xarray

    return xarray


def _data(x: Any) -> Any:
    """A stored Matrix as a lazy Dask array; NumPy arrays as they are."""
    return x.to_dask() if hasattr(x, "to_dask") else np.asarray(x)


def _modes(k: int) -> dict:
    return {MODE: np.arange(1, k + 1)}


def label_svd(res: Any, lab: Labels) -> Any:
    """``(U, s, Vt)`` as ``DataArray``s: ``U`` over (rows, mode), ``s`` over mode, ``Vt`` over (mode, cols)."""
    xr = _xr()
    U, s, Vt = res
    k = len(s)
    u = None if U is None else xr.DataArray(_data(U), dims=(lab.rows, MODE), coords=lab.coord(lab.rows) | _modes(k))
    vt = None if Vt is None else xr.DataArray(_data(Vt), dims=(MODE, lab.cols),
                                               coords=_modes(k) | lab.coord(lab.cols))
    sv = xr.DataArray(np.asarray(s), dims=(MODE,), coords=_modes(k))
    out = type(res)(u, sv, vt, res.report, mean=res.mean, scale=res.scale, moments=res.moments,
                    scaled=res.scaled_moments)
    out.stored = res  # the Matrix factors themselves (their paths, to_numpy, delete)
    return out


def label_pca(p: Any, lab: Labels) -> Any:
    """The fitted PCA's arrays over (mode, features), mode and features; its transforms label samples."""
    xr = _xr()
    k = int(p.n_components_)
    feats = lab.cols
    p.labels = lab
    p.components_ = xr.DataArray(p.components_, dims=(MODE, feats), coords=_modes(k) | lab.coord(feats))
    for name in ("explained_variance_", "explained_variance_ratio_", "singular_values_"):
        setattr(p, name, xr.DataArray(getattr(p, name), dims=(MODE,), coords=_modes(k)))
    p.mean_ = xr.DataArray(p.mean_, dims=(feats,), coords=lab.coord(feats))
    if p.scale_ is not None:
        p.scale_ = xr.DataArray(p.scale_, dims=(feats,), coords=lab.coord(feats))
    return p


def label_rows(y: np.ndarray, x: Any, dims: tuple[str, str], coords: dict) -> Any:
    """``y`` (one row per row of the input ``x``) as a ``DataArray`` when ``x`` was one: its row
    dimension and coordinate, and ``dims[1]`` with ``coords`` for the columns."""
    if not is_dataarray(x):
        return y
    rows = x.dims[0]
    c = {rows: x.coords[rows]} if rows in x.coords else {}
    return _xr().DataArray(y, dims=(rows, dims[1]), coords=c | coords)


def label_solution(x: Any, a: Labels, b: Labels | None) -> Any:
    """``x`` of ``A x = b`` over A's columns (and b's columns)."""
    xr = _xr()
    data = _data(x)
    if data.shape[1] == 1 and (b is None or b.cols is None):  # one right-hand side given as a vector
        return xr.DataArray(data[:, 0], dims=(a.cols,), coords=a.coord(a.cols))
    other = b.cols if b is not None and b.cols is not None else "rhs"
    coords = a.coord(a.cols) | (b.coord(other) if b is not None else {})
    return xr.DataArray(data, dims=(a.cols, other), coords=coords)


def label_gram(g: Any, lab: Labels, trans: bool) -> Any:
    """The Gram matrix over the columns (rows for ``trans``) twice: ``dim`` and ``dim_2``."""
    dim = lab.rows if trans else lab.cols
    c = lab.coords.get(dim)
    coords = {} if c is None else {dim: c.values, f"{dim}_2": c.values}
    return _xr().DataArray(_data(g), dims=(dim, f"{dim}_2"), coords=coords)
