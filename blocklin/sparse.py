"""The :class:`SparseMatrix` handle: a stored CSR matrix (``blocklin-csr`` zarr group), read by row strips."""

from __future__ import annotations

import os
from typing import Any, Iterator

import numpy as np

from blocklin.errors import BudgetError, DTypeError, ParameterError, explain
from blocklin.storage import input_guard
from blocklin.storage.location import as_location
from blocklin.storage.sparse import SparseStore


def _csr(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, shape: tuple[int, int]) -> Any:
    import scipy.sparse

    # the arrays as stored: CSR in canonical form (sorted, unique column indices within each row)
    out = scipy.sparse.csr_matrix((data, indices, indptr), shape=shape, copy=False)
    out.has_sorted_indices = True
    return out


#: The NumPy products a sparse operand takes out of core (NumPy 2's ``np.linalg.matmul`` too).
_PRODUCTS = tuple(f for f in (np.matmul, np.dot, getattr(np.linalg, "matmul", None)) if f is not None)


def _ndim(x: Any) -> int:
    """Dimensions of an operand without converting it (``np.ndim`` of a handle would dispatch back here)."""
    return len(x.shape) if isinstance(x, SparseMatrix) else int(np.ndim(x))


def _dense(x: Any) -> Any:
    """``x`` with every :class:`SparseMatrix` in it (in a list or tuple too) made dense, as NumPy's own
    functions need it."""
    if isinstance(x, SparseMatrix):
        return x.toarray()
    if isinstance(x, (list, tuple)):
        return type(x)(_dense(v) for v in x)
    return x


class SparseMatrix:
    """A sparse matrix stored as CSR row blocks in a zarr v3 group (``docs/sparse.md``); nothing is
    loaded until asked.

    Parameters
    ----------
    path : path, URL or Location
        The group (``"A.zarr"``), written by ``blocklin convert`` or :func:`blocklin.from_sparse`.
    storage_options : dict, optional
        fsspec options for a URL.

    Attributes
    ----------
    path : str
        Folder or URL of the group.
    shape : (int, int)
    dtype : numpy.dtype
        Value dtype.
    nnz : int
        Stored entries (explicit zeros included).
    row_blocks : numpy.ndarray
        Row-block boundaries (``b + 1`` int64 from 0 to ``m``); block ``k`` is rows
        ``row_blocks[k]:row_blocks[k + 1]``.

    Examples
    --------
    >>> import scipy.sparse
    >>> import blocklin as bl
    >>> s = bl.from_sparse(scipy.sparse.eye(4, format="csr"), "I4.zarr")
    >>> s.shape, s.nnz, s.rows(1, 3).toarray()
    ((4, 4), 4, array([[0., 1., 0., 0.],
           [0., 0., 1., 0.]]))
    """

    def __init__(self, path: Any, *, storage_options: dict | None = None) -> None:
        self.location = as_location(path, storage_options)
        self.path = self.location.url
        #: the group's content stamp before the handle's first read (its attributes and row blocks, read
        #: here): every run that reads through the handle takes it, so a rewrite after the open is refused
        #: (:mod:`blocklin.storage.input_guard`)
        self.stamp = input_guard.opened(self.location, handle=True)
        self._store = SparseStore(self.location)

    # -- metadata --------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:
        return self._store.shape

    @property
    def dtype(self) -> np.dtype:
        return self._store.dtype

    @property
    def ndim(self) -> int:
        return 2

    @property
    def nnz(self) -> int:
        return self._store.nnz

    @property
    def density(self) -> float:
        """Stored entries over ``m * n`` (0 for an empty shape)."""
        m, n = self.shape
        return self.nnz / (m * n) if m * n else 0.0

    @property
    def index_dtype(self) -> np.dtype:
        return self._store.index_dtype

    @property
    def row_blocks(self) -> np.ndarray:
        return self._store.row_blocks.copy()

    @property
    def n_blocks(self) -> int:
        return len(self._store.row_blocks) - 1

    @property
    def chunks(self) -> tuple[int, ...]:
        """Rows of each row block (dask's chunks convention along the rows)."""
        return tuple(int(d) for d in np.diff(self._store.row_blocks))

    @property
    def nbytes(self) -> int:
        """Bytes of the CSR arrays in memory (values, column indices, row offsets)."""
        return self.nnz * (self.dtype.itemsize + self.index_dtype.itemsize) + (self.shape[0] + 1) * 8

    @property
    def attrs(self) -> dict:
        return dict(self._store.attrs)

    @property
    def provenance(self) -> dict:
        """What blocklin recorded when it wrote this matrix (operation, inputs, plan, version)."""
        return dict(self._store.attrs.get("blocklin", {}))

    # -- NumPy's dispatch protocols ---------------------------------------------------------------
    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        """The dense matrix (:meth:`toarray`, refused beyond the memory budget), always a new array, as
        :meth:`blocklin.Matrix.__array__`: ``np.asarray(S)`` had been a 0-d object array holding the handle
        (``np.asarray(S).sum()`` returned ``S``, ``np.asarray(S).shape`` was ``()``). ``copy=False`` (NumPy 2's
        "never copy") is refused with NumPy's ``ValueError``: the entries live in the group."""
        if copy is False:
            raise ParameterError(explain(
                "copy", "must not be False for a blocklin.SparseMatrix (its entries are read from the group into a "
                "new dense array; NumPy 2's copy=False promises a view)", "copy=False",
                "pass copy=None (np.asarray(S)) for the dense array, or read CSR strips with S.rows(r0, r1)"))
        arr = self.toarray()
        return arr.astype(dtype, copy=False) if dtype is not None else arr

    def __array_function__(self, func: Any, types: Any, args: tuple, kwargs: dict) -> Any:
        """``numpy.linalg.norm(S, ord)`` computed from the stored row blocks (:func:`blocklin.norm`; it had
        raised a TypeError); ``np.matmul`` and ``np.dot`` with a dense operand by :func:`blocklin.matmul`
        (the sparse product, never densifying ``S``); every other NumPy function as NumPy's own on the
        dense matrix (:meth:`toarray`, refused beyond the memory budget). NumPy had taken the handle for
        a 0-d object array: ``np.sum(S)`` returned ``S`` itself, ``np.linalg.solve(S, b)`` raised
        "0-dimensional array given" and ``S @ B`` a gufunc's dimension error."""
        from blocklin.linalg.interop import numpy_protocol
        from blocklin.matrix import WRITE_FIRST, refuse_writes

        refuse_writes(SparseMatrix, func.__name__, args[0] if args else None, kwargs.get("out"), func in WRITE_FIRST)
        if func is np.linalg.norm:
            return numpy_protocol.norm(*args, **kwargs)
        if func in _PRODUCTS and not kwargs and len(args) == 2 and min(_ndim(x) for x in args) > 0:
            return numpy_protocol.matmul(*args)
        own = getattr(func, "_implementation", func)  # like=S's array creators have none (Matrix.__array_function__)
        return own(*_dense(args), **{k: _dense(v) for k, v in kwargs.items()})

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        """``np.matmul`` (``@``, ``ndarray @ S``) by :func:`blocklin.matmul`; other ufuncs on the dense matrix (never
        into it: ``out=S`` and ``np.add.at(S, ...)`` are refused, their writes would be lost)."""
        from blocklin.matrix import refuse_writes

        refuse_writes(SparseMatrix, f"{ufunc.__name__}" + (f".{method}" if method != "__call__" else ""),
                      inputs[0] if inputs else None, kwargs.get("out"), method == "at")
        if ufunc is np.matmul and method == "__call__" and not kwargs:
            from blocklin.linalg.interop import numpy_protocol

            return numpy_protocol.matmul(*inputs)
        return getattr(ufunc, method)(*_dense(inputs), **{k: _dense(v) for k, v in kwargs.items()})

    # == and != compare the entries, as NumPy's operators on the dense matrix (as every other NumPy function):
    # the default object identity had answered S == 0 with False.
    def __eq__(self, other: Any) -> Any:  # type: ignore[override]
        return np.equal(self, other)

    def __ne__(self, other: Any) -> Any:  # type: ignore[override]
        return np.not_equal(self, other)

    __hash__ = object.__hash__  # a handle stays a dictionary key by identity, as before

    def __bool__(self) -> bool:
        """NumPy's truth value, as :meth:`blocklin.Matrix.__bool__`: that of the one entry of a 1 x 1 matrix,
        refused for more (``if S:`` had been ``True`` whatever ``S`` held, a 1 x 1 of a zero included)."""
        m, n = self.shape
        if m * n > 1:  # more than one entry: nothing is read to refuse it
            raise ParameterError(explain(
                "S", "must hold one entry to have a truth value (NumPy's rule: more are ambiguous)",
                f"a {m} x {n} sparse matrix", "use S.nnz, np.any(S) or np.all(S)"))
        return bool(self.toarray())

    def __matmul__(self, other: Any) -> Any:
        return np.matmul(self, other)

    def __rmatmul__(self, other: Any) -> Any:
        return np.matmul(other, self)

    # -- data --------------------------------------------------------------------------------------
    def rows(self, r0: int, r1: int) -> Any:
        """Rows ``r0:r1`` as a ``scipy.sparse.csr_matrix`` of shape ``(r1 - r0, n)``."""
        m = self.shape[0]
        if not (isinstance(r0, (int, np.integer)) and isinstance(r1, (int, np.integer)) and 0 <= r0 <= r1 <= m):
            raise ParameterError(explain("rows", f"must be integers with 0 <= r0 <= r1 <= {m}", f"({r0!r}, {r1!r})",
                                         f"pass a row range inside the matrix, e.g. rows(0, {min(m, 1000)})"))
        ptr, idx, val = self._store.read_rows(int(r0), int(r1))
        return _csr(ptr, idx, val, (int(r1) - int(r0), self.shape[1]))

    def row_block(self, i: int) -> Any:
        """Row block ``i`` (rows ``row_blocks[i]:row_blocks[i + 1]``) as a ``scipy.sparse.csr_matrix``."""
        b = self.n_blocks
        if not isinstance(i, (int, np.integer)) or not -b <= i < b:
            raise ParameterError(explain("i", f"must be a row-block number in 0..{b - 1}", repr(i),
                                         "iterate over range(matrix.n_blocks)"))
        i = int(i) % b
        bounds = self._store.row_blocks
        return self.rows(int(bounds[i]), int(bounds[i + 1]))

    def iter_row_blocks(self) -> Iterator[tuple[int, Any]]:
        """``(first row, CSR strip)`` of every row block in order (one block in memory at a time)."""
        bounds = self._store.row_blocks
        for k in range(self.n_blocks):
            yield int(bounds[k]), self.rows(int(bounds[k]), int(bounds[k + 1]))

    def to_scipy(self, *, memory: Any = None) -> Any:
        """The whole matrix as a ``scipy.sparse.csr_matrix``; refused when its arrays exceed the memory
        budget (``memory``, default the configured one), and when the group was rewritten since the
        handle opened it (:class:`~blocklin.errors.InputChangedError`: the handle's row blocks and entry
        count are the old version's; rows appended since pass, and are not read)."""
        from blocklin.config import format_size, resolve

        budget = resolve(memory=memory).memory
        if self.nbytes > budget:
            raise BudgetError(explain("memory", "to_scipy() loads the whole CSR matrix, which must fit the memory "
                                      f"budget ({format_size(budget)})", f"{self.shape[0]} x {self.shape[1]} with "
                                      f"{self.nnz} entries ({format_size(self.nbytes)}) in {self.path}",
                                      "read row blocks (row_block(i), rows(r0, r1)), or raise the budget "
                                      f"(memory='{format_size(self.nbytes * 5 // 4 + 1)}')"), minimum=self.nbytes)
        # a run of its own (NumPy's functions on S read it here): refused if the group changed since the open
        with input_guard.run_reading(self.location, self.stamp, "the matrix"):
            return self.rows(0, self.shape[0])

    def toarray(self) -> np.ndarray:
        """The whole matrix dense (the same check as :meth:`to_scipy`, on the dense bytes)."""
        from blocklin.matrix import _check_fits_memory

        _check_fits_memory(self.shape, self.dtype, self.path)
        return self.to_scipy().toarray()

    def to_numpy(self) -> np.ndarray:
        """The whole matrix dense, as :meth:`blocklin.Matrix.to_numpy` (:meth:`toarray`)."""
        return self.toarray()

    def aslinearoperator(self) -> SparseOperator:
        """A ``scipy.sparse.linalg.LinearOperator`` whose products stream the row blocks (one block in
        memory at a time); :func:`blocklin.svd` takes the matrix itself the same way (rsvd or block Lanczos)."""
        return SparseOperator(self)

    def __repr__(self) -> str:
        return (f"SparseMatrix(path={self.path!r}, shape={self.shape}, nnz={self.nnz}, density={self.density:.3g}, "
                f"dtype={self.dtype.name}, row_blocks={self.n_blocks})")


def _operator_base() -> type:
    from scipy.sparse.linalg import LinearOperator

    return LinearOperator


class SparseOperator(_operator_base()):
    """``A X`` and ``A^T Y`` of a :class:`SparseMatrix`, each one pass over its row blocks.

    The products hold one row block (its CSR arrays, sized by the conversion's budget), ``X`` or
    ``Y`` and the result (``m x k`` or ``n x k``) in memory, as every SciPy operator's do. Integer
    values are multiplied as float64. Called inside a blocklin operation, the products run as tasks
    on its scheduler (groups of row blocks; :mod:`blocklin.runtime.sparse_pass`), with the same bits
    as in the caller; where the operation holds the row blocks in memory (svd, pca and eigsh when they
    fit the budget: :func:`blocklin.runtime.sparse_pass.hold_blocks`), from those, read once.

    Attributes
    ----------
    matrix : SparseMatrix
    products : int
        Passes over the row blocks so far (one per ``matvec``/``matmat``/``rmatvec``/``rmatmat``).
    """

    def __init__(self, matrix: SparseMatrix, *, offdiagonal: bool = False) -> None:
        refuse_complex(matrix)
        self.matrix = matrix  # no ``path``: blocklin.svd takes this as an operator, not a stored dense matrix
        self.products = 0
        #: the products of ``S - diag(S)`` (a graph Laplacian's ``W``: the diagonal's entries read as zeros)
        self.offdiagonal = offdiagonal
        dt = matrix.dtype if matrix.dtype in (np.float32, np.float64) else np.dtype(np.float64)
        super().__init__(dtype=dt, shape=matrix.shape)

    def _product(self, x: np.ndarray, transposed: bool) -> np.ndarray:
        from blocklin.runtime.job import current_job
        from blocklin.runtime.sparse_pass import product_in_process, sparse_product

        self.products += 1
        x = np.asarray(x)
        job = current_job()  # inside an operation: its groups of row blocks run as the job's tasks
        if job is not None:
            return sparse_product(job, self.matrix, x, transposed, self.dtype, offdiagonal=self.offdiagonal)
        # a run of its own, checked against the stamp of the matrix's open: a rewrite during this product
        # or since the last (a SciPy solver's steps) is refused, not multiplied
        with input_guard.run_reading(self.matrix.location, self.matrix.stamp, "the product"):
            return product_in_process(self.matrix._store, x, transposed, self.dtype, offdiagonal=self.offdiagonal)

    def normal_matmat(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """``(S X, S^T S X)`` in one sweep over ``S``'s row blocks where the running job holds them
        (:func:`blocklin.runtime.sparse_pass.sparse_normal`: the bits of ``matmat`` then ``rmatmat``,
        counted as those two), else ``None``."""
        from blocklin.runtime.job import current_job
        from blocklin.runtime.sparse_pass import sparse_normal

        job = current_job()
        got = sparse_normal(job, self.matrix, np.asarray(x), self.dtype) \
            if job is not None and not self.offdiagonal else None
        if got is not None:
            self.products += 2
        return got

    def _matmat(self, x: np.ndarray) -> np.ndarray:
        return self._product(x, False)

    def _rmatmat(self, y: np.ndarray) -> np.ndarray:
        return self._product(y, True)

    def _matvec(self, x: np.ndarray) -> np.ndarray:
        return self._matmat(np.asarray(x).reshape(-1, 1))[:, 0]

    def _rmatvec(self, y: np.ndarray) -> np.ndarray:
        return self._rmatmat(np.asarray(y).reshape(-1, 1))[:, 0]

    def _adjoint(self) -> Any:
        from scipy.sparse.linalg import LinearOperator

        return LinearOperator(dtype=self.dtype, shape=(self.shape[1], self.shape[0]), matvec=self._rmatvec,
                              rmatvec=self._matvec, matmat=self._rmatmat, rmatmat=self._matmat)


def centered_operator(s: SparseMatrix, mu: np.ndarray, dtype: Any = None) -> Any:
    """``S - 1 mu^T`` as a SciPy ``LinearOperator`` over ``S``'s row-block operator (centered
    implicitly: never a dense or centered copy of ``S``).

    ``x -> S x - 1 (mu^T x)`` and the adjoint ``y -> S^T y - mu (1^T y)``: each product one pass over
    the row blocks (:class:`SparseOperator`) plus a rank-one correction in memory. ``dtype``: of the
    operator and of ``mu`` in the correction (default the row-block operator's: float32 for float32
    values); pass float64 to keep the means exact when the products are taken with float64 blocks.
    Used by :func:`blocklin.pca` of a sparse matrix and the sparse least squares of :func:`blocklin.solve`.
    The row-block operator is its ``sparse_operator`` attribute.
    """
    from scipy.sparse.linalg import LinearOperator

    op = s.aslinearoperator()
    dt = np.dtype(op.dtype if dtype is None else dtype)
    mu_t = np.asarray(mu).astype(dt)
    m, n = op.shape

    def matmat(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x).reshape(n, -1)
        return op.matmat(x) - (mu_t @ x)[None, :]

    def rmatmat(y: np.ndarray) -> np.ndarray:
        y = np.asarray(y).reshape(m, -1)
        return op.rmatmat(y) - np.outer(mu_t, y.sum(axis=0))

    centered = LinearOperator(dtype=dt, shape=(m, n), matvec=lambda x: matmat(x)[:, 0],
                              rmatvec=lambda y: rmatmat(y)[:, 0], matmat=matmat, rmatmat=rmatmat)
    centered.sparse_operator = op  # what takes the products: a method may hold its row blocks (sparse_pass)
    return centered


def refuse_nonfinite_entries(a: Any, name: str = "a") -> None:
    """Raise :class:`~blocklin.errors.NonFiniteError` naming the first NaN or Inf stored in the sparse matrix
    behind ``a`` (a :class:`SparseMatrix`, its :class:`SparseOperator`, or :func:`centered_operator`); nothing
    for another operator or a finite matrix. For the failure path of a decomposition whose first product was
    not finite (one more pass over the row blocks): those had been refused as a ``ConvergenceError`` (a
    ``RuntimeError``) where a dense input is refused as a ``NonFiniteError`` naming the position."""
    from blocklin.errors import NonFiniteError

    matrix = getattr(getattr(a, "sparse_operator", a), "matrix", a)
    if not isinstance(matrix, SparseMatrix) or np.dtype(matrix.dtype).kind not in "fc":
        return
    for r0, blk in matrix.iter_row_blocks():
        bad = np.flatnonzero(~np.isfinite(blk.data))
        if bad.size:
            at = int(bad[0])
            row = r0 + int(np.searchsorted(blk.indptr, at, side="right")) - 1
            raise NonFiniteError(explain(
                name, "must hold finite values (a decomposition has no answer on NaN or Inf; check_finite=False "
                "does not lift this)", f"{blk.data[at]} at ({row}, {int(blk.indices[at])}) of the stored sparse "
                f"matrix {matrix.path}", "replace or drop the non-finite entries (numpy.nan_to_num of the SciPy "
                "matrix's data, then blocklin.from_sparse; or blocklin convert --nan error to find them)"))


def refuse_complex(matrix: Any, name: str = "a") -> None:
    """Raise :class:`~blocklin.errors.DTypeError` for a complex stored sparse matrix: it is stored and read
    back exactly, but every sparse route (``svd``, ``eigsh``, ``pca``, ``solve``, ``matmul``, ``gram``)
    computes with real row blocks, where its values would have been cast to their real parts (``svd``
    returned ``Re(A)``'s singular values with ``converged=True``)."""
    dt = np.dtype(matrix.dtype)
    if dt.kind == "c":
        raise DTypeError(explain(
            name, "must be a real sparse matrix: blocklin's sparse routes compute with real row blocks (the "
            "imaginary parts would be dropped)", f"a stored sparse matrix of {dt.name} ({matrix.shape[0]} x "
            f"{matrix.shape[1]})", "write it densely into a complex zarr array, whose routes take complex data, row "
            "block by row block (SparseMatrix.rows(r0, r1).toarray()), or work with its real and imaginary parts "
            "(for a linear system, the real form [[Re, -Im], [Im, Re]])"))


def as_sparse_matrix(a: Any, storage_options: dict | None = None) -> Any:
    """``a`` as a :class:`SparseMatrix` when it names a stored sparse matrix (a path, URL or Location of
    a committed ``blocklin-csr`` group: one small read of its ``zarr.json``); a :class:`SparseMatrix`
    and anything else unchanged. A handle opened here is the calling operation's: its run says so when
    it stamps it (``own_open=result is not a``, :meth:`blocklin.storage.input_guard.RunInputs.stamp`)."""
    from blocklin.storage.location import Location
    from blocklin.storage.sparse import sparse_attributes

    if not isinstance(a, (str, os.PathLike, Location)):
        return a
    try:
        loc = as_location(a, storage_options)
    except Exception:  # noqa: BLE001 - not a storage name: the dense route says what is wrong with it
        return a
    if sparse_attributes(loc) is None:
        return a
    return SparseMatrix(loc)


def as_sparse_operator(a: Any) -> Any:
    """``a`` as a :class:`SparseOperator` when it is a :class:`SparseMatrix` or names a stored sparse
    matrix (a local ``blocklin-csr`` group); anything else unchanged."""
    if isinstance(a, SparseMatrix):
        return a.aslinearoperator()
    if isinstance(a, (str, os.PathLike)) and "://" not in str(a):
        from blocklin.storage.sparse import is_sparse

        if is_sparse(a):
            return SparseMatrix(a).aslinearoperator()
    return a


__all__ = ["SparseMatrix", "SparseOperator", "as_sparse_matrix", "as_sparse_operator", "centered_operator",
           "refuse_complex", "refuse_nonfinite_entries"]
