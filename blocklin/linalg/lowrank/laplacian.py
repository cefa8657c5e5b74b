"""The Laplacian of a stored sparse graph as an operator, never formed: ``L = D - W`` or
``I - D^{-1/2} W D^{-1/2}``, each product one pass over the adjacency's row blocks.

``W`` is the adjacency ``A`` without its diagonal and ``D`` the diagonal of the degrees ``d = W 1``
(the row sums of ``A`` less its diagonal, from one pass), exactly as
``scipy.sparse.csgraph.laplacian(A, normed=...)`` forms them: self-loops are ignored, and a node with
no edge (``d_i = 0``) keeps ``L_ii = 0`` in the normalized form (SciPy's isolated-node rule).

References
----------
F. R. K. Chung, *Spectral Graph Theory*, AMS, 1997 (the normalized Laplacian); U. von Luxburg, "A
tutorial on spectral clustering", Statistics and Computing 17(4), 2007.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blocklin.errors import ParameterError, explain
from blocklin.runtime.sparse_pass import diagonal_positions

#: ``laplacian=`` of :func:`blocklin.eigsh`: ``D - W`` or ``I - D^{-1/2} W D^{-1/2}``.
KINDS = ("combinatorial", "normalized")


def degrees(op: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(d, diag)``: the degrees ``W 1`` (the row sums of the sparse ``A`` behind ``op``, a
    :class:`~blocklin.sparse.SparseOperator`, over its entries off the diagonal) and the diagonal of ``A``,
    in one pass over its row blocks (float64). Summed without the diagonal, not as ``A 1 - diag(A)``:
    beside a self-loop of ``1e17`` that difference lost the degree (a node with edges taken as isolated)."""
    m = op.shape[0]
    d = np.empty(m, np.float64)
    diag = np.zeros(m, np.float64)
    op.products += 1
    for r0, blk in op.matrix.iter_row_blocks():
        rows = blk.shape[0]
        blk = blk.astype(np.float64)
        diag[r0:r0 + rows] = blk.diagonal(k=r0)[:rows] if r0 < blk.shape[1] else 0.0
        blk.data[diagonal_positions(blk.indptr, blk.indices, r0)] = 0.0  # in the float64 copy: nothing stored changes
        d[r0:r0 + rows] = np.asarray(blk.sum(axis=1)).ravel()
    return d, diag


def laplacian_operator(op: Any, kind: str) -> tuple[Any, dict]:
    """The Laplacian (``kind`` of :data:`KINDS`) of the square sparse adjacency behind ``op``, as a
    ``LinearOperator`` whose products are ``op``'s (one pass each), and what the degree pass found.

    A negative degree is refused for ``"normalized"`` (``d^{-1/2}`` would be NaN)."""
    from scipy.sparse.linalg import LinearOperator

    m, n = op.shape
    if m != n:
        raise ParameterError(explain("laplacian", "needs a square adjacency matrix", f"a sparse {m} x {n} matrix",
                                     "pass the n x n adjacency of the graph"))
    d, diag = degrees(op)
    # W X as products of A with its diagonal read as zeros (the same passes): A X - diag(A) X cancelled
    # beside a large self-loop (eigenvalues 20-70% off at 1e17, with a ConvergenceWarning naming max_passes)
    w_op = type(op)(op.matrix, offdiagonal=True)
    isolated = d == 0
    if kind == "normalized":
        low = int(np.argmin(d)) if n else 0
        if n and d[low] < 0:
            raise ParameterError(explain("laplacian", "'normalized' needs nonnegative degrees (row sums of the "
                                         "adjacency without its diagonal), for D^{-1/2}", f"degree {d[low]:.6g} at "
                                         f"row {low}", "use laplacian='combinatorial', or nonnegative edge weights"))
        scale = 1.0 / np.sqrt(np.where(isolated, 1.0, d))
        keep = (~isolated).astype(np.float64)

        def product(x: np.ndarray, through: Any) -> np.ndarray:
            return keep[:, None] * x - scale[:, None] * through(scale[:, None] * x)
    else:
        def product(x: np.ndarray, through: Any) -> np.ndarray:
            return d[:, None] * x - through(x)

    def matmat(x: np.ndarray) -> np.ndarray:
        return product(np.asarray(x, dtype=np.float64).reshape(n, -1), w_op.matmat)

    def rmatmat(x: np.ndarray) -> np.ndarray:  # L^T = D - W^T: symmetric exactly when A is
        return product(np.asarray(x, dtype=np.float64).reshape(n, -1), w_op.rmatmat)

    lap = LinearOperator(dtype=np.float64, shape=(n, n), matvec=lambda x: matmat(x)[:, 0],
                         rmatvec=lambda x: rmatmat(x)[:, 0], matmat=matmat, rmatmat=rmatmat)
    found = {"laplacian": kind, "isolated_nodes": int(isolated.sum()), "max_degree": float(d.max()) if n else 0.0,
             "self_loops_ignored": int(np.count_nonzero(diag))}
    return lap, found


__all__ = ["KINDS", "degrees", "laplacian_operator"]
