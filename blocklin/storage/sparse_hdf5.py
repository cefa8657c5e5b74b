"""HDF5 groups holding a CSR or CSC matrix, converted to ``blocklin-csr`` (:mod:`blocklin.storage.sparse`).

A group with 1-D datasets ``data``, ``indices`` and ``indptr`` is a compressed sparse matrix; which
one (rows or columns compressed) and its shape come from the group's conventions:

===========  =========================================================  ============================
convention   says CSR or CSC                                            shape
===========  =========================================================  ============================
anndata      attribute ``encoding-type`` = ``csr_matrix``/``csc_matrix``  attribute ``shape``
h5sparse     attribute ``h5sparse_format`` = ``csr``/``csc`` (also old    attribute ``h5sparse_shape``
             anndata files)
10x Genomics always CSC (features x barcodes; the group holds ``barcodes``)  dataset ``shape``
plain        attribute ``format`` = ``csr``/``csc``, or ``sparse_format=``  attribute or dataset ``shape``
===========  =========================================================  ============================

A group that says neither is refused (``sparse_format=`` / ``--sparse-format`` names it).

CSR is already in row order: :meth:`Hdf5SparseSource.write_rows` reads ``indptr`` in windows and
the entries of one row block at a time straight from the datasets, canonicalizing a block (columns
sorted, duplicates summed, as :func:`~blocklin.storage.sparse_convert._sorted_block` does for the
external sort) only when it is not canonical already. CSC's columns are the rows of the transpose,
so its entries go through the external sort of :mod:`blocklin.storage.sparse_convert` (the batches
of :class:`~blocklin.storage.sparse_convert.NpzSource`, read from the datasets in pieces).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blocklin.config import size_hint
from blocklin.errors import BudgetError, ConfigError, DTypeError, FormatError, NonFiniteError, explain
from blocklin.progress import make_progress
from blocklin.storage.sparse_convert import (
    NPZ_BATCH, SORT_BYTES_PER_ENTRY, NpzSource, SortPlan, _sorted_block, check_values_fit, run_dtype,
)

SPARSE_FORMATS = ("csr", "csc")
#: HDF5 raw-chunk cache per dataset (three are read at once): what a compressed chunk costs once.
_CACHE_BYTES = 1 << 20
_ARRAYS = ("indptr", "indices", "data")


def _h5py() -> Any:
    from blocklin.storage.formats.hdf5 import _h5py as load

    return load()


def _text(value: Any) -> str | None:
    """An attribute as lower-case text (HDF5 strings come back as bytes or 0-d arrays)."""
    if value is None:
        return None
    if isinstance(value, np.ndarray):
        value = value.item() if value.size == 1 else None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value.strip().lower() if isinstance(value, str) else None


def is_sparse_group(obj: Any) -> bool:
    """Whether an h5py object is a group holding the ``data``, ``indices`` and ``indptr`` datasets."""
    h5py = _h5py()
    return isinstance(obj, h5py.Group) and all(isinstance(obj.get(k), h5py.Dataset) for k in _ARRAYS)


def hdf5_member_kind(path: str, member: str | None) -> str | None:
    """``"sparse"`` when ``path:member`` is a group holding a compressed sparse matrix, None when it is
    a dataset (or no member is named: the dense reader's rules apply).

    Raises
    ------
    FormatError
        ``member`` names a group that holds no sparse matrix (its datasets are listed).
    """
    h5py = _h5py()
    if not member:
        _refuse_unnamed_sparse(path, h5py)
        return None
    try:
        f = h5py.File(path, "r")
    except OSError:
        return None  # the dense reader names what is wrong with the file
    try:
        obj = f.get(member)
        if not isinstance(obj, h5py.Group):
            return None
        if is_sparse_group(obj):
            return "sparse"
        names: list[str] = []
        obj.visititems(lambda name, o: names.append(f"{obj.name.rstrip('/')}/{name}")
                       if isinstance(o, h5py.Dataset) else None)
        raise FormatError(explain("hdf5 input", "a group must hold a sparse matrix (1-D datasets data, indices "
                                  "and indptr); a dense matrix is named by its dataset",
                                  f"{path}:{obj.name} holds {names[:10]}",
                                  f"name a 2-D dataset ({path}:{names[0] if names else '/GROUP/DATASET'}) or "
                                  "a CSR/CSC group"))
    finally:
        f.close()


def _refuse_unnamed_sparse(path: str, h5py: Any) -> None:
    """A file named without a member that holds no 2-D dataset but sparse groups: refused naming them
    (the dense reader would say only that it found no dataset)."""
    try:
        f = h5py.File(path, "r")
    except OSError:
        return
    try:
        dense: list[str] = []
        groups: list[str] = ["/"] if is_sparse_group(f) else []
        f.visititems(lambda name, o: dense.append(name) if isinstance(o, h5py.Dataset) and o.ndim == 2 else
                     groups.append("/" + name) if is_sparse_group(o) else None)
    finally:
        f.close()
    if groups and not dense:
        raise FormatError(explain("hdf5 input", "must name the group of a sparse matrix (FILE.h5:/GROUP)",
                                  f"{path!r}, which holds the sparse groups {groups[:10]}",
                                  f"write {path}:{groups[0]}"))


def _shape_of(group: Any, attr: str) -> tuple[int, int] | None:
    h5py = _h5py()
    raw = group.attrs.get(attr)
    if raw is None and isinstance(group.get("shape"), h5py.Dataset):
        raw = group["shape"][()]
    if raw is None:
        return None
    try:
        shape = tuple(int(s) for s in np.asarray(raw).ravel())
    except (TypeError, ValueError):
        shape = ()
    if len(shape) != 2 or min(shape) < 0:
        raise FormatError(explain("hdf5 input", "a sparse group's shape must be two non-negative integers",
                                  f"{attr}={raw!r} in {group.file.filename}:{group.name}",
                                  "fix the shape attribute (rows, columns)"))
    return shape


def group_layout(group: Any, sparse_format: str | None = None) -> tuple[str, tuple[int, int], str]:
    """``(format, shape, convention)`` of a sparse group by the conventions of the module notes.

    Raises
    ------
    ConfigError
        Neither the group nor ``sparse_format`` says CSR or CSC, or they disagree.
    FormatError
        No shape, or a shape that is not two non-negative integers.
    """
    h5py = _h5py()
    where = f"{group.file.filename}:{group.name}"
    attrs = group.attrs
    enc = _text(attrs.get("encoding-type"))
    found = convention = None
    shape_attr = "shape"
    if enc in ("csr_matrix", "csc_matrix"):
        found, convention = enc[:3], "anndata"
    elif _text(attrs.get("h5sparse_format")) is not None:
        found, convention, shape_attr = _text(attrs.get("h5sparse_format")), "h5sparse", "h5sparse_shape"
    elif _text(attrs.get("format")) is not None:
        found, convention = _text(attrs.get("format")), "attribute"
    elif isinstance(group.get("barcodes"), h5py.Dataset) and isinstance(group.get("shape"), h5py.Dataset):
        found, convention = "csc", "10x"  # features x barcodes, one column per barcode
    if found is not None and found not in SPARSE_FORMATS:
        raise FormatError(explain("hdf5 input", "a sparse group must be csr or csc", f"{found!r} ({convention}) "
                                  f"in {where}", "convert it to CSR or CSC first (scipy.sparse .tocsr())"))
    if sparse_format is not None:
        given = str(sparse_format).lower()
        if given not in SPARSE_FORMATS:
            raise ConfigError(explain("sparse_format", f"must be one of {SPARSE_FORMATS}", repr(sparse_format),
                                      "pass --sparse-format csr or --sparse-format csc"))
        if found is not None and found != given:
            raise ConfigError(explain("sparse_format", "must agree with what the group says",
                                      f"sparse_format={given!r}, but {where} is {found} ({convention})",
                                      "drop --sparse-format (the group's own format is used)"))
        found, convention = given, convention or "given"
    if found is None:
        raise ConfigError(explain("sparse_format", "an HDF5 group with data, indices and indptr must say whether "
                                  "it is CSR or CSC (attribute encoding-type, h5sparse_format or format)",
                                  f"{where} has none of them", "pass --sparse-format csr or --sparse-format csc "
                                  "(sparse_format='csr' or 'csc')"))
    shape = _shape_of(group, shape_attr) or (_shape_of(group, "shape") if shape_attr != "shape" else None)
    if shape is None:
        raise FormatError(explain("hdf5 input", "a sparse group must record its shape (attribute "
                                  f"{shape_attr} or a dataset shape)", f"none in {where}",
                                  "add the attribute: group.attrs['shape'] = (rows, columns)"))
    return found, shape, convention


def _values_refusal(group: str, dt: np.dtype) -> str:
    """Why a sparse group's values are refused: complex ones (h5py's complex, or a compound of real and
    imaginary parts) are not converted, since blocklin's sparse routes compute with real row blocks (the
    refusal had said "must hold real numbers ... convert the values to a numeric dtype" of complex128,
    which is numeric); anything else holds no numbers."""
    from blocklin.storage.formats.hdf5 import complex_parts

    what = f"hdf5 dataset {group}/data"
    if dt.kind == "c" or complex_parts(dt) is not None:
        got = (f"complex values ({dt.name})" if dt.kind == "c" else
               f"complex values as a compound of fields {complex_parts(dt)[0]!r} and {complex_parts(dt)[1]!r}")
        return explain(what, "must hold real numbers: a sparse matrix is converted with real values only "
                       "(blocklin's sparse routes compute with real row blocks)", got,
                       "write the real and imaginary parts as two real groups and convert each, or, where it fits "
                       "in memory, read it with SciPy and write a dense complex copy with blocklin.from_array "
                       "(blocklin's complex routes are dense)")
    return explain(what, "must hold numbers (bool, integer or float)", f"dtype {dt}",
                   "store the values as a numeric dataset")


class _H5Stream:
    """One 1-D dataset read forward in pieces (``read``) or by range (``slice``)."""

    def __init__(self, ds: Any, what: str) -> None:
        if ds.ndim != 1:
            raise FormatError(explain(what, "must be a 1-D dataset", f"shape {ds.shape}",
                                      "write the sparse matrix's arrays as 1-D datasets"))
        self.ds, self.what = ds, what
        self.size, self.dtype = int(ds.shape[0]), np.dtype(ds.dtype)
        self.pos = self.bytes_read = 0

    def slice(self, a: int, b: int) -> np.ndarray:
        out = np.empty(max(0, b - a), self.dtype)
        if out.size:
            self.ds.read_direct(out, np.s_[a:b])
        self.bytes_read += out.nbytes
        return out

    def read(self, count: int) -> np.ndarray:
        count = min(count, self.size - self.pos)
        out = self.slice(self.pos, self.pos + count)
        self.pos += count
        return out

    def close(self) -> None:
        pass


class Hdf5SparseSource(NpzSource):
    """An HDF5 group holding a CSR or CSC matrix (see the module notes), as a source of
    :func:`~blocklin.storage.sparse_convert.write_sparse`: CSR streams its row blocks
    (:meth:`write_rows`, ``row_ordered``), CSC gives batches of entries to the external sort.

    Parameters
    ----------
    path : str
        The HDF5 file.
    member : str
        The group (``/X``, ``/matrix``).
    sparse_format : {"csr", "csc"}, optional
        For a group whose attributes do not say which.
    """

    kind = "hdf5"
    label = "hdf5 input"

    def __init__(self, path: str, member: str | None, *, sparse_format: str | None = None) -> None:
        h5py = _h5py()
        self.path = path
        self._streams = []
        try:
            self.zf = h5py.File(path, "r", rdcc_nbytes=_CACHE_BYTES)
        except OSError as exc:
            raise FormatError(explain("hdf5 input", "must be a readable HDF5 file", f"{path!r} ({exc})",
                                      "check the file")) from None
        try:
            group = self.zf.get(member or "/")
            if not is_sparse_group(group):
                raise FormatError(explain("hdf5 input", "must name a group with datasets data, indices and indptr",
                                          f"{path}:{member}", f"write {path}:/GROUP for the group of the matrix"))
            self.format, self.shape, self.convention = group_layout(group, sparse_format)
            self.group = group.name
            for nm in _ARRAYS:
                self._streams.append(_H5Stream(group[nm], f"hdf5 dataset {group.name.rstrip('/')}/{nm}"))
            ptr, idx, data = self._streams
            for s in (ptr, idx):
                if s.dtype.kind not in "iu":
                    raise DTypeError(explain(s.what, "must hold integers", f"dtype {s.dtype}",
                                             "store indices and indptr as integers"))
            if data.dtype.kind not in "biuf":
                raise DTypeError(_values_refusal(group.name.rstrip("/"), data.dtype))
            major = self.shape[0] if self.format == "csr" else self.shape[1]
            if idx.size != data.size or ptr.size != major + 1:
                raise FormatError(explain("hdf5 input", f"a {self.format} group's arrays must agree with its shape "
                                          f"(indptr {'rows' if self.format == 'csr' else 'columns'} + 1, indices "
                                          "and data nnz)", f"indptr {ptr.size}, indices {idx.size}, data "
                                          f"{data.size} for shape {self.shape} in {path}:{group.name}",
                                          "the group is damaged, or its shape (or format) is wrong"))
        except BaseException:
            self.close()
            raise
        self.dtype = data.dtype.newbyteorder("=")
        self.entries = data.size
        self.batch_entries = NPZ_BATCH
        self.parse_bytes = len(_ARRAYS) * _CACHE_BYTES
        self.row_ordered = self.format == "csr"

    def close(self) -> None:
        f = getattr(self, "zf", None)
        if f is not None:
            f.close()

    def _fail_ptr(self, detail: str) -> None:
        raise FormatError(explain(self.label, "indptr must start at 0, be non-decreasing and end at nnz", detail,
                                  "the group is damaged; write the matrix again"))

    def write_rows(self, writer: Any, plan: SortPlan, *, nan: str = "allow", progress: Any = None,
                   desc: str = "") -> dict:
        """Stream a CSR group into ``writer`` by row blocks of at most ``plan.block_entries`` entries
        and ``plan.rows_per_block`` rows (what the external sort's blocks hold): no runs, no sort
        unless a block's columns are unsorted or repeated."""
        m, n = self.shape
        ptr_s, idx_s, val_s = self._streams
        nnz = val_s.size
        ends = ptr_s.slice(0, 1), ptr_s.slice(m, m + 1)
        if int(ends[0][0]) != 0 or int(ends[1][0]) != nnz:
            self._fail_ptr(f"indptr[0] = {int(ends[0][0])}, indptr[{m}] = {int(ends[1][0])}, nnz {nnz}")
        rows_cap = max(1, plan.rows_per_block)
        prog = make_progress(progress)
        prog.start(m, desc)
        blocks = sorted_blocks = 0
        try:
            r0 = 0
            while r0 < m:
                ptr = ptr_s.slice(r0, min(m, r0 + rows_cap) + 1).astype(np.int64)
                counts = np.diff(ptr)
                if counts.size and (counts.min() < 0 or ptr[-1] > nnz):
                    bad = int(np.flatnonzero((counts < 0) | (ptr[1:] > nnz))[0])
                    self._fail_ptr(f"indptr[{r0 + bad}] = {ptr[bad]}, indptr[{r0 + bad + 1}] = {ptr[bad + 1]}, "
                                   f"nnz {nnz}")
                k = int(np.searchsorted(ptr - ptr[0], plan.block_entries, side="right")) - 1
                if k == 0:
                    count = int(counts[0])
                    need = (plan.memory + (count - plan.block_entries) * SORT_BYTES_PER_ENTRY) * 5 // 4
                    raise BudgetError(explain("memory", "the entries of one row must fit one row block",
                                              f"row {r0 + 1} holds {count} entries (the budget holds "
                                              f"{plan.block_entries})", f"raise the budget to at least "
                                              f"{size_hint(need)} (--memory {size_hint(need)})"), minimum=need)
                r1, p0, p1 = r0 + k, int(ptr[0]), int(ptr[k])
                cols = idx_s.slice(p0, p1).astype(np.int64)
                self._check_range("column", cols, n, p0)
                vals = val_s.slice(p0, p1)
                check_values_fit(vals, writer.dtype, lambda i, p0=p0: f"entry {p0 + i} of the {self.label}")
                if nan == "error" and vals.dtype.kind == "f" and np.isnan(vals).any():
                    raise NonFiniteError(explain("input", "must not hold NaN when nan='error'",
                                                 f"NaN at entry {p0 + int(np.flatnonzero(np.isnan(vals))[0])}",
                                                 "fix the value, or pass nan='allow' (CLI: --nan allow)"))
                local = ptr[:k + 1] - p0
                starts = np.zeros(len(cols), bool)
                starts[local[:-1][counts[:k] > 0]] = True
                # canonical already (columns strictly increasing within each row): written as read
                if len(cols) < 2 or bool(np.all((np.diff(cols) > 0) | starts[1:])):
                    writer.write_rows(r0, r1, local, cols.astype(writer.index_dtype),
                                      vals.astype(writer.dtype, copy=False))
                else:
                    rec = np.empty(len(cols), run_dtype(writer.dtype))
                    rec["r"] = np.repeat(np.arange(r0, r1, dtype=np.int64), counts[:k])
                    rec["c"], rec["v"] = cols, vals
                    del cols, vals, starts
                    indptr, c, s = _sorted_block(rec, r0, r1, n, writer.index_dtype)
                    del rec
                    writer.write_rows(r0, r1, indptr, c, s.astype(writer.dtype, copy=False))
                    sorted_blocks += 1
                blocks += 1
                prog.advance(r1 - r0)
                r0 = r1
        finally:
            prog.close()
        return {"entries_read": nnz, "runs": 0, "sorted_blocks": sorted_blocks}


__all__ = ["Hdf5SparseSource", "SPARSE_FORMATS", "group_layout", "hdf5_member_kind", "is_sparse_group"]
