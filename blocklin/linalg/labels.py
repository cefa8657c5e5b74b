"""xarray inputs and labelled results: a ``DataArray`` (NumPy- or Dask-backed) given to ``svd``, ``pca``,
``solve`` or ``gram`` is computed from its data as any array is (:func:`blocklin.operands.as_operand`
stages its ``.data``, a Dask array lazily), and the results carry the dimensions and coordinates they
map to, as xeofs users expect: the factors over the sample and feature dimensions and a ``mode``
dimension (1, 2, ...), the solution over the features, the Gram matrix over the features twice.

A result never holds one dimension twice: a name the input already uses (a sample dimension called
``mode``, ``b``'s columns named as ``A``'s) takes the suffix ``_2`` (``_3``, ... while taken), as
``gram``'s second dimension does. Rows are never matched by position where labels say otherwise: two
``DataArray`` operands sharing the row dimension must have equal coordinates there
(:func:`check_rows`), and ``pca.transform`` takes the fitted features only (:func:`check_features`).

Stored results (the long factor, ``x``, the Gram matrix) become Dask-backed ``DataArray``s over their
zarr stores: nothing is loaded until asked.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: The dimension of the singular triplets and components (xeofs names it so, counting from 1).
MODE = "mode"


def is_dataarray(x: Any) -> bool:
    """``x`` is an ``xarray.DataArray`` or a subclass (a labelled :func:`solve` result); duck-typed:
    xarray is an optional dependency."""
    return any(c.__module__.startswith("xarray") for c in type(x).__mro__[:-1]) and hasattr(x, "dims") \
        and hasattr(x, "coords")


def distinct(name: str, taken: Any) -> str:
    """``name``, or ``name_2`` (``_3``, ...) when ``taken`` holds it: a DataArray cannot hold a
    dimension twice, and merging two coordinates of one name keeps the second silently."""
    if name not in taken:
        return name
    i = 2
    while f"{name}_{i}" in taken:
        i += 1
    return f"{name}_{i}"


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

    @property
    def mode(self) -> str:
        """The dimension of the components: ``mode``, or ``mode_2`` when the input has a ``mode``."""
        return distinct(MODE, self.dims)


def labels_of(x: Any) -> Labels | None:
    return Labels(x) if is_dataarray(x) else None


def _xr() -> Any:
    import xarray

    return xarray


def _data(x: Any) -> Any:
    """A stored Matrix as a lazy Dask array; NumPy arrays as they are."""
    return x.to_dask() if hasattr(x, "to_dask") else np.asarray(x)


def _modes(k: int, name: str = MODE) -> dict:
    return {name: np.arange(1, k + 1)}


def label_svd(res: Any, lab: Labels) -> Any:
    """``(U, s, Vt)`` as ``DataArray``s: ``U`` over (rows, mode), ``s`` over mode, ``Vt`` over (mode, cols)
    (``mode`` as :attr:`Labels.mode` names it)."""
    xr = _xr()
    U, s, Vt = res
    k, mode = len(s), lab.mode
    u = None if U is None else xr.DataArray(_data(U), dims=(lab.rows, mode),
                                             coords=lab.coord(lab.rows) | _modes(k, mode))
    vt = None if Vt is None else xr.DataArray(_data(Vt), dims=(mode, lab.cols),
                                               coords=_modes(k, mode) | lab.coord(lab.cols))
    sv = xr.DataArray(np.asarray(s), dims=(mode,), coords=_modes(k, mode))
    out = type(res)(u, sv, vt, res.report, mean=res.mean, scale=res.scale, moments=res.moments,
                    scaled=res.scaled_moments)
    out.stored = res  # the Matrix factors themselves (their paths, to_numpy, delete)
    return out


def label_pca(p: Any, lab: Labels) -> Any:
    """The fitted PCA's arrays over (mode, features), mode and features; its transforms label samples."""
    xr = _xr()
    k, mode = int(p.n_components_), lab.mode
    feats = lab.cols
    p.labels = lab
    p.components_ = xr.DataArray(p.components_, dims=(mode, feats), coords=_modes(k, mode) | lab.coord(feats))
    for name in ("explained_variance_", "explained_variance_ratio_", "singular_values_"):
        setattr(p, name, xr.DataArray(getattr(p, name), dims=(mode,), coords=_modes(k, mode)))
    p.mean_ = xr.DataArray(p.mean_, dims=(feats,), coords=lab.coord(feats))
    if p.scale_ is not None:
        p.scale_ = xr.DataArray(p.scale_, dims=(feats,), coords=lab.coord(feats))
    return p


def label_rows(y: np.ndarray, x: Any, dims: tuple[str, str], coords: dict) -> Any:
    """``y`` (one row per row of the input ``x``) as a ``DataArray`` when ``x`` was one: its row
    dimension and coordinate, and ``dims[1]`` with ``coords`` for the columns (renamed by
    :func:`distinct` where ``x``'s rows have that name)."""
    if not is_dataarray(x):
        return y
    rows, cols = x.dims[0], dims[1]
    c = {rows: x.coords[rows]} if rows in x.coords else {}
    if cols == rows:
        new = distinct(cols, {rows})
        coords = {new if d == cols else d: (v.values if hasattr(v, "values") else v) for d, v in coords.items()}
        cols = new
    return _xr().DataArray(y, dims=(rows, cols), coords=c | coords)


def check_rows(a: Any, b: Any, name: str = "b") -> None:
    """Refuse operands whose rows labels say differ: both ``DataArray``s with ``a``'s row dimension
    in ``b`` but not first (``b`` transposed), or first with other coordinates (another order, other
    samples). Rows are matched by position, so either would silently solve another problem."""
    if not (is_dataarray(a) and is_dataarray(b)) or a.ndim < 1 or b.ndim < 1:
        return
    from blocklin.errors import ParameterError, explain

    rows = a.dims[0]
    if rows in b.dims and b.dims[0] != rows:
        raise ParameterError(explain(name, f"must have the row dimension of a ({rows!r}) first (rows are matched "
                                     "by position)", f"dims {tuple(b.dims)}",
                                     f"pass {name}.transpose({rows!r}, ...)"))
    if b.dims[0] != rows or rows not in a.coords or rows not in b.coords or a.sizes[rows] != b.sizes[rows]:
        return  # no labels to compare (or the sizes differ: the shape check says so)
    _same_coords(name, rows, a.coords[rows], b.coords[rows], "the coordinates of a along the shared row dimension",
                 "rows", "in a", f"align them first: {name} = {name}.sel({rows}=a.{rows}), or "
                 f"a, {name} = xarray.align(a, {name})")


def check_features(lab: Labels | None, x: Any, name: str = "x") -> None:
    """Refuse samples ``x`` whose labels say their features are not those ``lab`` was fitted on: the
    fitted feature dimension first (``x`` transposed), or other coordinates along it (another order,
    other features). Features are matched by position, so either would silently project wrong."""
    if lab is None or lab.cols is None or not is_dataarray(x) or x.ndim != 2:
        return
    from blocklin.errors import ParameterError, explain

    feats = lab.cols
    if x.dims[0] == feats:
        raise ParameterError(explain(name, f"must have the fitted feature dimension {feats!r} last (samples as "
                                     "rows; features are matched by position)", f"dims {tuple(x.dims)}",
                                     f"pass {name}.transpose(..., {feats!r})"))
    if x.dims[1] != feats or feats not in lab.coords or feats not in x.coords \
            or x.sizes[feats] != lab.coords[feats].size:
        return  # no labels to compare (or the sizes differ: the shape check says so)
    _same_coords(name, feats, lab.coords[feats], x.coords[feats], "the fitted coordinates along the feature "
                 "dimension", "features", "when fitted", f"select the fitted features first: {name} = "
                 f"{name}.sel({feats}=model.mean_.{feats})")


def _same_coords(name: str, dim: str, ref: Any, got: Any, rule: str, what: str, where: str, fix: str) -> None:
    """Refuse ``got``'s coordinates along ``dim`` where they differ from ``ref``'s, naming the first
    difference (``what`` are matched by position, so other labels would give another answer)."""
    from blocklin.errors import ParameterError, explain

    at = _first_difference(ref, got)
    if at is not None:
        raise ParameterError(explain(name, f"must have {rule} {dim!r} ({what} are matched by position, never "
                                     "reordered)", f"{dim}[{at}] = {_show(ref.values[at])} {where} but "
                                     f"{_show(got.values[at])} in {name}", fix))


def _show(v: Any) -> str:
    """A coordinate value as a message shows it (``5``, not ``np.int64(5)``)."""
    return repr(v.item() if isinstance(v, np.generic) else v)


def _first_difference(c1: Any, c2: Any) -> int | None:
    """The first position where two coordinates of one length differ (None where they are equal,
    NaNs included, as ``pandas.Index.equals`` compares)."""
    i1, i2 = c1.to_index(), c2.to_index()
    if i1.equals(i2):
        return None
    return next((i for i, (u, v) in enumerate(zip(i1, i2)) if not u == v), 0)


#: The dimension of ``b``'s columns in a solution when ``b`` has none of its own (a NumPy matrix).
RHS = "rhs"
#: The dimension of the values of a ``lam`` sequence in a solution.
LAM = "lam"
#: What a solve's ``Matrix`` carries beside its values, kept on the labelled solution.
SOLUTION_ATTRS = ("report", "intercept", "cv_results_")
_solution_type: Any = None


def solution_type() -> type:
    """:class:`Solution`, made on first use (xarray is imported only then)."""
    global _solution_type
    if _solution_type is None:
        class Solution(_xr().DataArray):
            """A labelled ``solve`` result: a ``DataArray`` that also carries what the unlabelled ``Matrix``
            does, ``report``, ``intercept`` and (``store_cv_results``) ``cv_results_``, and in ``stored``
            that ``Matrix`` itself (its path, ``delete``). xarray operations on it return the same type
            without them."""

            __slots__ = (*SOLUTION_ATTRS, "stored")

        Solution.__module__, Solution.__qualname__ = __name__, "Solution"  # pickled by name: __getattr__ below
        _solution_type = Solution
    return _solution_type


def __getattr__(name: str) -> Any:
    """``Solution`` (PEP 562): found by pickle and imports without importing xarray with this module."""
    if name == "Solution":
        return solution_type()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def solution_dims(a: Labels, b: Labels | None, b_ndim: int, lams: list[float] | None) -> tuple[str | None, str | None]:
    """The dimensions of ``b``'s columns (None for a vector ``b``) and of a ``lam`` sequence (None
    without one) in a solution over ``a``'s columns, each distinct from those before it."""
    other = None
    if b_ndim > 1:
        other = distinct(b.cols if b is not None and b.cols is not None else RHS, {a.cols})
    lam = None if lams is None else distinct(LAM, {a.cols, other})
    return other, lam


def label_solution(x: Any, a: Labels, b: Labels | None, b_ndim: int = 2, lams: list[float] | None = None) -> Any:
    """``x`` of ``A x = b`` over A's columns, then the values of a ``lam`` sequence (``lams``: ``x`` holds
    ``L`` blocks of ``k`` columns) and b's columns (a ``b`` of ``b_ndim`` 1 has none), as a
    :class:`Solution` keeping ``x``'s report and intercept (over the same dimensions but A's columns)."""
    data = _data(x)
    n, k = data.shape[0], data.shape[1] // (len(lams) if lams else 1)
    other, lam = solution_dims(a, b, b_ndim, lams)
    coords = a.coord(a.cols)
    if other is not None and b is not None and b.cols in b.coords:
        coords = coords | {other: b.coords[b.cols].values}
    if lam is not None:
        coords = coords | {lam: np.asarray(lams, dtype=float)}
    dims = tuple(d for d in (lam, other) if d is not None)
    shape = tuple(s for d, s in ((lam, len(lams or ())), (other, k)) if d is not None)
    out = solution_type()(data.reshape((n, *shape)), dims=(a.cols, *dims), coords=coords)
    out.name = None  # not the Dask array's task name, which xarray takes for one
    for name in SOLUTION_ATTRS:
        if hasattr(x, name):
            setattr(out, name, getattr(x, name))
    intercept = getattr(x, "intercept", None)
    if intercept is not None and dims:  # over the labelled dimensions; a vector b's stays NumPy, as unlabelled
        out.intercept = _xr().DataArray(np.asarray(intercept).reshape(shape), dims=dims,
                                        coords={d: c for d, c in coords.items() if d in dims})
    out.stored = x
    return out


def label_gram(g: Any, lab: Labels, trans: bool) -> Any:
    """The Gram matrix over the columns (rows for ``trans``) twice: ``dim`` and ``dim_2``."""
    dim = lab.rows if trans else lab.cols
    c = lab.coords.get(dim)
    coords = {} if c is None else {dim: c.values, f"{dim}_2": c.values}
    return _xr().DataArray(_data(g), dims=(dim, f"{dim}_2"), coords=coords)
