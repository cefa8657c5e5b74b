"""A SciPy ``LinearOperator`` over an out-of-core matrix.

``matvec``/``matmat`` (``A X``) and ``rmatvec``/``rmatmat`` (``A^T Y``) each stream ``A`` once, in
row strips through the device, as engine row passes; so :func:`scipy.sparse.linalg.svds`,
:func:`~scipy.sparse.linalg.eigsh`, :func:`~scipy.sparse.linalg.lsqr` and friends work on data that
does not fit in memory (each of their iterations costs one pass). The vectors themselves
(``n`` and ``m`` long) are in memory, as SciPy requires.

Complex ``A``: ``rmatvec``/``rmatmat`` are ``A^H Y`` (SciPy's adjoint), formed as the conjugate of
``A^T conj(Y)``; a complex ``x`` with a real ``A`` takes its real and imaginary parts in one pass.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Unpack

import numpy as np
from scipy.sparse.linalg import LinearOperator

from blocklin.config import Settings, check_settings, resolve
from blocklin.errors import DTypeError, ShapeError, explain
from blocklin.linalg.blocks.tall_kernels import apply_kernel, rmat_kernel
from blocklin.operands import as_operand, cast_integers, stored_location
from blocklin.runtime.job import Job
from blocklin.runtime.passes import collect_rows, reduce_sum, run_pass, source
from blocklin.storage import input_guard
from blocklin.storage.location import Location
from blocklin.validate import float_operand


class BlocklinOperator(LinearOperator):
    """``LinearOperator`` whose products stream a stored matrix (see module docstring).

    Attributes
    ----------
    path : str
        The stored matrix.
    passes : int
        Passes over ``A`` made so far (one per ``matvec``/``rmatvec``/``matmat``/``rmatmat``).
    bytes_read : int
        Bytes read from ``A`` so far.
    """

    def __init__(self, operand: Any, stack: contextlib.ExitStack, settings: dict, *,
                 stored: Location | None = None, stamp: dict | None = None) -> None:
        self._op = operand
        #: the stored matrix and its stamp taken before the operator opened it: every product's run takes
        #: it, so a rewrite during a product or between two (a SciPy solver's steps) is refused
        self._stored, self._stamp = stored, stamp
        self._stack = stack
        self._settings = settings
        self.path = operand.path
        self.passes = 0
        self.bytes_read = 0
        self._finalizer = weakref.finalize(self, stack.close)
        super().__init__(dtype=operand.dtype, shape=operand.shape)

    def close(self) -> None:
        """Remove staged copies of in-memory inputs (also done when the operator is collected)."""
        self._finalizer()

    def _pass(self, x: np.ndarray, transpose: bool) -> np.ndarray:
        op = self._op
        m, n = op.shape
        dt = op.dtype
        x = np.asarray(x)
        squeeze = x.ndim == 1
        x2 = x.reshape(-1, 1) if squeeze else x
        want = m if transpose else n
        if x2.shape[0] != want:
            raise ShapeError(explain("x", f"must have {want} rows", f"shape {x.shape}", f"pass a length-{want} vector"))
        out_dt = np.result_type(dt, x2.dtype)
        if x2.dtype.kind == "c" and np.dtype(dt).kind != "c":  # real A, complex x: both parts, one pass
            parts = self._pass(np.hstack([x2.real, x2.imag]), transpose)
            y = parts[:, :x2.shape[1]] + 1j * parts[:, x2.shape[1]:]
            y = y.astype(out_dt, copy=False)
            return y.ravel() if squeeze else y
        cplx = np.dtype(dt).kind == "c"
        x2 = np.ascontiguousarray(x2, dtype=dt)
        if cplx and transpose:  # A^H Y = conj(A^T conj(Y))
            x2 = np.ascontiguousarray(x2.conj())
        c = x2.shape[1]
        with Job("operator", **self._settings) as job:
            job.stamp_input(self._stored, self._stamp)
            if transpose:
                states, _ = run_pass(job, rmat_kernel, [source(op)], {"Y": x2, "n": n, "check": False},
                                     description="rmatmat")
                y = reduce_sum(states, "Z")
                y = np.conj(y) if cplx else y
            else:
                states, _ = run_pass(job, apply_kernel, [source(op)], {"W": x2, "collect": True},
                                     description="matmat")
                y = collect_rows(states, m, c)
            self.passes += job.passes("a")
            self.bytes_read += job.stats["bytes_read"]
        y = y.astype(out_dt, copy=False)
        return y.ravel() if squeeze else y

    def _matvec(self, x: np.ndarray) -> np.ndarray:
        return self._pass(x, False)

    def _rmatvec(self, x: np.ndarray) -> np.ndarray:
        return self._pass(x, True)

    def _matmat(self, X: np.ndarray) -> np.ndarray:
        return self._pass(X, False)

    def _rmatmat(self, X: np.ndarray) -> np.ndarray:
        return self._pass(X, True)

    def _adjoint(self) -> LinearOperator:
        return _Adjoint(self)


class _Adjoint(LinearOperator):
    def __init__(self, parent: BlocklinOperator) -> None:
        self.parent = parent
        super().__init__(dtype=parent.dtype, shape=(parent.shape[1], parent.shape[0]))

    def _matvec(self, x: np.ndarray) -> np.ndarray:
        return self.parent._pass(x, True)

    def _rmatvec(self, x: np.ndarray) -> np.ndarray:
        return self.parent._pass(x, False)

    def _matmat(self, X: np.ndarray) -> np.ndarray:
        return self.parent._pass(X, True)

    def _rmatmat(self, X: np.ndarray) -> np.ndarray:
        return self.parent._pass(X, False)

    def _adjoint(self) -> LinearOperator:
        return self.parent


def aslinearoperator(a: Any, **settings: Unpack[Settings]) -> BlocklinOperator:
    """A :class:`scipy.sparse.linalg.LinearOperator` whose products stream ``a`` from storage.

    Parameters
    ----------
    a : path, zarr array, Matrix, NumPy or Dask array
        The matrix (float32, float64, complex64 or complex128: ``rmatvec`` is then ``A^H x``). In-memory
        inputs are staged once to the temp dir.
    **settings
        As for every operation: :class:`~blocklin.config.Settings` (one row pass over ``a`` per product).

    Returns
    -------
    BlocklinOperator
        With ``.passes`` and ``.bytes_read`` counting the work done so far.

    Examples
    --------
    >>> import numpy as np
    >>> import blocklin as bl
    >>> from scipy.sparse.linalg import svds
    >>> x = np.random.default_rng(0).standard_normal((500, 40)) * np.logspace(0, -3, 40)
    >>> op = bl.aslinearoperator(x, memory="64MiB")
    >>> u, s, vt = svds(op, k=2)
    >>> op.shape, np.allclose(np.sort(s)[::-1], np.linalg.svd(x, compute_uv=False)[:2])
    ((500, 40), True)
    """
    check_settings(settings)
    cfg = resolve(**{k: v for k, v in settings.items() if k != "progress"})
    stack = contextlib.ExitStack()
    # stamped before the operand is opened; a staged copy (in-memory data, integers cast) is the operator's own
    stored = stored_location(a, cfg)
    stamp = input_guard.opened(stored, covers=True) if stored is not None else None
    try:
        op = cast_integers(as_operand(a, "a", cfg, stack), cfg, stack)  # as numpy.linalg casts integers
    except BaseException:
        stack.close()
        raise
    try:
        float_operand(op, "aslinearoperator", complex_ok=True)
    except DTypeError:
        stack.close()
        raise
    if op.staged:
        stored = stamp = None
    return BlocklinOperator(op, stack, settings, stored=stored, stamp=stamp)
