"""The final Rayleigh-Ritz step of a block Lanczos SVD whose Krylov bases were spilled to disk
(:mod:`blocklin.linalg.lowrank.basis`): :func:`blocklin.linalg.lowrank.methods.rayleigh_ritz`'s numbers
with nothing ``n``-long held whole.

The Ritz vectors ``Q`` (``N x k``) stay in the spilled basis; the products ``Y_j = B Q_j`` and
``Z_j = B^T Y_j`` are made a column block of at most the Lanczos block at a time and spilled to two more
scratch files; ``G = Y^T Y`` is summed over their strips; ``Y = Q_Y R`` by CholeskyQR2
(:func:`~blocklin.linalg.blocks.orth.cholqr_r` on a :class:`StripBlock`: each refinement's Gram and,
where ``chol(G)`` breaks down, the TSQR, strip by strip), ``R = U_R S W^T`` in memory, and
``U = Q_Y U_R``, ``V = Q W`` and the residuals ``||B^T u - s v|| = ||Z W / s - V s||`` are formed strip
by strip, ``U`` and ``V`` written to the result's group. The residual directions the in-memory step adds
(:func:`~blocklin.linalg.lowrank.triplets.enrich_width`) are left out: they would be another
``N x k`` block orthonormalized against ``Q`` in memory (the report says so).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from blocklin.errors import ParameterError, explain
from blocklin.linalg.blocks.orth import cholqr_r, svd_of_r
from blocklin.linalg.blocks.tsqr import positive_diagonal
from blocklin.linalg.lowrank.basis import Basis, Columns
from blocklin.linalg.lowrank.lanczos import small_blas
from blocklin.linalg.lowrank.triplets import numerically_zero
from blocklin.storage.zarr_store import create_array, write_block


@dataclasses.dataclass(frozen=True)
class StoredFactor:
    """The short factor of a spilled run, already written to the result's group as ``name`` (``Vt``,
    ``k x N``; or ``U``, ``N x k``, for a wide ``A``): what :func:`blocklin.svd` returns as a
    :class:`~blocklin.Matrix` instead of an array."""

    name: str
    shape: tuple[int, int]


class StripBlock:
    """A tall block ``Y`` kept in a spilled basis, with the interface :func:`~blocklin.linalg.blocks.orth.cholqr_r`
    uses: ``gram_after(chain)`` and ``tsqr()`` strip by strip."""

    def __init__(self, basis: Basis) -> None:
        self.basis = basis
        self.M, self.c, self.dtype = basis.n, basis.m, basis.dtype

    def chained(self, s: int, ws: list) -> np.ndarray:
        """Strip ``s`` of ``Y chain[0] chain[1] ...``."""
        t = self.basis.strip(s)
        for w in ws:
            t = t @ w
        return t

    def gram_after(self, ws: list) -> np.ndarray:
        g = np.zeros((self.c, self.c))
        for s, _ in enumerate(self.basis.strips):
            t = self.chained(s, ws)
            g += t.T @ t
        return g

    def tsqr(self) -> np.ndarray:
        r = None
        for s, _ in enumerate(self.basis.strips):
            y = self.basis.strip(s)
            r = np.linalg.qr(y if r is None else np.vstack([r, y]), mode="r")
        return positive_diagonal(r)


def spilled_rayleigh_ritz(src: Any, Q: Columns, k: int, width: int, *, bases: Any, dest: str | None,
                          short: Any, transposed_out: bool, label: str = "lanczos") -> Any:
    """The Rayleigh-Ritz step over the Ritz vectors ``Q`` (see module notes) on an operator source
    (:class:`~blocklin.linalg.lowrank.operator_svd.OperatorSource`, real data): a
    :class:`~blocklin.linalg.lowrank.methods.Factorization` whose ``V`` is a :class:`StoredFactor`.

    ``bases(n, cols, names, strips)`` makes the spilled scratch bases; ``dest`` the long factor's array
    (``None``: not written), ``short`` the short factor's (written ``k x N`` unless ``transposed_out``)."""
    from blocklin.linalg.lowrank.methods import Factorization

    N, M = src.N, src.M
    (Yb,) = bases(M, k, ("Y",), None)
    (Zb,) = bases(N, k, ("Z",), Q.basis.strips)  # Q's strips: Z W and Q W are formed side by side
    for j0 in range(0, k, width):
        j1 = min(k, j0 + width)
        z, _, y = src.normal(Q.basis.columns(j0, j1), keep_y=True,
                             description=f"{label}: final projection, Ritz vectors {j0 + 1}-{j1} of {k}")
        Yb.append(np.asarray(y.y, dtype=np.float64))
        Zb.append(z)
        del y, z
    block = StripBlock(Yb)
    R, chain, orth_info, block = cholqr_r(block, Yb.gram(), rank_revealing=True)
    with small_blas(R.shape[0], R.shape[1]):
        Ur, S, Vrt = svd_of_r(R)
    ref = max(float(S[0]) if S.size else 0.0, src.noise_scale)
    zero = numerically_zero(S[:k], ref, src.dtype, M)
    if zero.any():
        raise ParameterError(explain(
            "k", "must not exceed the numerical rank of the matrix when its Krylov bases are spilled (the columns "
            "of U for zero singular values are an orthonormal completion built in memory)",
            f"k={k} with {int(zero.sum())} singular value(s) at the rounding level",
            "lower k to the rank, or raise memory so that the bases stay in memory"))
    sig = S[:k]
    Ur, Vr = Ur[:, :k], Vrt.T[:, :k]
    dt = np.dtype(src.dtype)
    # V = Q W, and ||B^T u - s v|| = ||Z W / s - V s|| (B v - s u = 0 by construction), strip by strip
    varr = create_array(short, shape=(N, k) if transposed_out else (k, N), dtype=dt,
                        chunks=(Q.rows_per_strip(), k) if transposed_out else (k, Q.rows_per_strip()))
    sq = np.zeros(k)
    for s, (r0, r1) in enumerate(Q.basis.strips):
        v = Q.basis.strip(s, k) @ Vr
        r = Zb.strip(s, k) @ Vr
        r /= sig
        r -= v * sig
        sq += np.sum(r * r, axis=0)
        rows = slice(r0, r1)
        if transposed_out:
            write_block(varr, rows, slice(0, k), v.astype(dt, copy=False))
        else:
            write_block(varr, slice(0, k), rows, np.ascontiguousarray(v.T).astype(dt, copy=False))
    if dest is not None:  # U = Y chain U_R, strip by strip
        rows_per = max(1, Yb.strips[0][1] - Yb.strips[0][0])
        uarr = create_array(dest, shape=(k, M) if transposed_out else (M, k), dtype=dt,
                            chunks=(k, rows_per) if transposed_out else (rows_per, k))
        for s, (r0, r1) in enumerate(Yb.strips):
            u = block.chained(s, [*chain, Ur])
            if transposed_out:
                write_block(uarr, slice(0, k), slice(r0, r1), np.ascontiguousarray(u.T).astype(dt, copy=False))
            else:
                write_block(uarr, slice(r0, r1), slice(0, k), u.astype(dt, copy=False))
    for b in (Yb, Zb):
        b.close()
    name = "U" if transposed_out else "Vt"
    return Factorization(s=sig, V=StoredFactor(name, (N, k) if transposed_out else (k, N)), residuals=np.sqrt(sq),
                         orth=orth_info, rayleigh_ritz_width=k)


__all__ = ["StoredFactor", "StripBlock", "spilled_rayleigh_ritz"]
