"""The orthonormal completion of a long factor: its columns for zero singular values.

A long factor is written as ``U = Y W_1 ... W_p L`` (:meth:`~blocklin.linalg.blocks.tallblock.TallBlock.apply_to`):
``Q = Y W_1 ... W_p`` is an orthonormal basis of ``range(Y)`` (a rank-deficient ``Y`` leaves zero
columns in it, :func:`blocklin.linalg.blocks.orth.cholqr_r`) and ``L`` the small factor's vectors. Where a
singular value is zero, ``Q L``'s column is zero (or rounding): ``range(Y)`` holds no direction for
it. LAPACK and ``scipy.sparse.linalg.svds`` return an orthonormal completion there (``U^T U = I``,
any orthonormal vectors orthogonal to the others); so does this module, without a pass over ``A``:

* ``G`` (``M x g``, ``g = z + p`` columns for ``z`` zero singular values, :func:`drawn`): standard
  normal rows generated from ``(seed, STREAM_COMPLETE, row)``, the same numbers whatever the strips,
  budget or scheduler. The ``p`` extra columns keep the completion well conditioned where ``z`` is
  all the room left: the nonzero singular values of a ``z x (z + p)`` Gaussian are bounded away from
  zero (Edelman 1988), those of a square one are not (a 9 x 9 draw has a condition number above
  ``10^4`` a few times in a hundred, and the write ``G E`` would carry that times ``eps`` into
  ``U^T U``);
* ``G`` projected twice against ``Q`` (classical Gram-Schmidt twice, "twice is enough": Giraud,
  Langou, Rozloznik, van den Eshof, Numer. Math. 101, 2005): ``C = Q^T G + Q^T (G - Q Q^T G)`` and
  ``(G - Q C)^T (G - Q C)`` from two passes over ``Y``; ``range(Q)`` holds ``range(A)`` where the
  method found every nonzero triplet, so the completion is orthogonal to ``range(A)`` too
  (``A^T u = 0``: a true singular vector of the zero singular value);
* ``X = (G - Q C) W R^-1``: ``W = V_z Lambda_z^-1/2`` from the top ``z`` eigenpairs of the projected
  Gram (the ``z`` dominant directions of ``G - Q C``), then one CholeskyQR step on ``(G - Q C) W``
  (one more pass for its Gram): CholeskyQR2 with the first Cholesky factor replaced by the
  eigenvectors' whitening, which needs no shift and picks the well-conditioned directions
  (Yamamoto, Nakatsukasa, Yanagisawa, Fukaya, ETNA 44, 2015, for the second step's bound);
* written with ``U`` in the same pass: ``U = Q (L D - C E) + G E``, ``E = W R^-1 S^T`` (``D`` zeroes
  the completed columns, ``S`` places them).

Three passes over the stored ``Y`` (none in memory) before the write, only where a zero singular value
occurs. The passes run on the CPU (:func:`fill_kernel`): the blocks are ``z`` columns wide.

Complex ``Y``: ``G`` is complex Gaussian, the projections ``Q^H G`` and Grams ``G^H G`` (complex128),
so that ``U^H U = I`` as LAPACK's complex factors.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import scipy.linalg

from blocklin.linalg.blocks.orth import cholesky_upper, ct, shift_for, work_dtype
from blocklin.linalg.blocks.random import STREAM_COMPLETE, GaussianRows, block_bytes
from blocklin.plan.passes import PassMemory
from blocklin.runtime.passes import plan_kernel_pass, reduce_sum, row_kernel, run_pass

#: Host bytes of a float64 element.
F64 = 8


@dataclasses.dataclass(frozen=True)
class Completion:
    """What the write pass adds: ``z`` columns ``(G - Q C) R^-1`` into the ``zero`` columns of ``U``."""

    seed: int
    zero: np.ndarray  # k booleans: the columns completed
    C: np.ndarray  # c x g: the projection of G on Q
    rinv: tuple  # the g x z whitening W, then z x z inverse triangular factors, applied in sequence

    def finals(self, last: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(T, E)`` of the write ``U = Q T + G E``: ``T = L D - C E`` and ``E = W R^-1 S^T``."""
        k = self.zero.size
        e = np.eye(self.C.shape[1])
        for r in self.rinv:
            e = e @ r
        E = np.zeros((e.shape[0], k), dtype=self.C.dtype)
        E[:, self.zero] = e
        return np.asarray(last, dtype=self.C.dtype) * ~self.zero - self.C @ E, E


def drawn(z: int) -> int:
    """Columns of ``G`` for ``z`` completed ones: ``z + max(10, z / 10)`` (see the module notes)."""
    return z + max(10, -(-z // 10)) if z else 0


def _gaussian(seed: int, z: int, dtype: Any = np.float64) -> GaussianRows:
    """``G``'s generator for ``z`` completed columns (:func:`drawn` of them)."""
    return GaussianRows(seed, STREAM_COMPLETE, drawn(z), complex=np.dtype(dtype).kind == "c")


def _basis(y: np.ndarray, ws: list) -> np.ndarray:
    """``Y_i W_1 ... W_p`` in float64 or complex128 (``Q``'s rows of the strip)."""
    t = np.asarray(y, dtype=work_dtype(y.dtype))
    for w in ws:
        t = t @ w
    return t


def _strip(q: np.ndarray, g: np.ndarray, params: Any, state: dict) -> np.ndarray | None:
    """One strip of the completion's passes on ``Q_i`` and ``G_i``: the projection's sums, the
    Gram after the triangular factors, or the rows of ``U`` to write (returned)."""
    stage = params["stage"]
    if stage == "write":
        return q @ params["T"] + g @ params["E"]
    if params.get("C") is not None:
        g = g - q @ params["C"]
    if stage == "project":
        state["P"] += ct(q) @ g
        state["H"] += ct(g) @ g
        return None
    for r in params["rinv"]:  # "gram": (G - Q C) R^-1 ..., then its Gram
        g = g @ r
    state["H"] += ct(g) @ g
    return None


def fill_init(device: Any, params: Any) -> dict:
    c, g = params["W"][-1].shape[1] if params["W"] else params["c"], drawn(params["z"])
    wd = np.dtype(params.get("work", "float64"))
    h = params["rinv"][-1].shape[1] if params.get("stage") == "gram" else g  # the Gram after W R^-1 ...
    return {"gen": _gaussian(params["seed"], params["z"], wd), "P": np.zeros((c, g), dtype=wd),
            "H": np.zeros((h, h), dtype=wd)}


def _fill_memory(params: Any, sources: tuple) -> PassMemory:
    ws = list(params["W"])
    c = ws[-1].shape[1] if ws else sources[0].width
    z, k = drawn(params["z"]), params.get("k", 0)
    small = sum(w.shape[0] * w.shape[1] for w in ws) + 2 * c * z + 3 * z * z + (c + z) * k
    el = np.dtype(params.get("work", "float64")).itemsize  # float64, or complex128 of complex data
    # per row: the float64 strip, each factor's product, G's rows and the projected copy, the written rows
    per_row = (sources[0].width + sum(w.shape[1] for w in ws) + 2 * z + k) * el + k * sources[0].dtype.itemsize
    cplx = np.dtype(params.get("work", "float64")).kind == "c"  # the generator's block: complex rows
    return PassMemory(fixed=small * el + block_bytes(z, cplx), per_row=per_row, chunk_temporaries=True,
                      write_row_bytes=k * sources[0].dtype.itemsize if params.get("write") else 0)


@row_kernel(memory=_fill_memory, init=fill_init, device="cpu")
def fill_kernel(device: Any, arrays: tuple, rows: slice, params: Any, state: dict) -> tuple[dict, dict | None]:
    """A strip of a pass of the completion (:func:`complete`): ``Q_i = Y_i W_1 ... W_p`` and
    ``G_i`` (rows ``rows`` of the seed's normal matrix), then :func:`_strip`'s stage."""
    q = _basis(arrays[0], params["W"])
    g = state["gen"].rows(rows.start, rows.stop)
    out = _strip(q, g, params, state)
    writes = None
    if params.get("write"):
        writes = {params["write"]: np.ascontiguousarray(out.astype(params["dtype"]))}
    if rows.stop in params["ends"]:
        return {"P": state["P"], "H": state["H"]}, writes
    return state, writes


def _whitening(h: np.ndarray, z: int, M: int) -> np.ndarray:
    """``W = V_z Lambda_z^-1/2`` (``g x z``) of the top ``z`` eigenpairs of the Gram ``h``: ``(G - Q C) W``
    has orthonormal columns up to rounding. An eigenvalue below the shift of shifted CholeskyQR
    (Fukaya et al. 2020; beyond any seed's odds: ``G - Q C`` of fewer than ``z`` directions) is raised
    to it, so that the next step's Cholesky factor exists."""
    w, v = np.linalg.eigh(h)
    w, v = w[::-1][:z], v[:, ::-1][:, :z]
    w = np.maximum(w, shift_for(h, M) + np.finfo(np.float64).tiny)
    return v / np.sqrt(w)[None, :]


def _inv(r: np.ndarray) -> np.ndarray:
    return scipy.linalg.solve_triangular(r, np.eye(r.shape[0]), lower=False)


def complete(sums: Any, *, zero: np.ndarray, seed: int, M: int) -> Completion:
    """The completion of the ``zero`` columns from ``sums(stage, C, rinv) -> (P, H)``, the sums of one
    pass of :func:`_strip` over every row (a pass over ``Y``, or one call in memory)."""
    c1, _ = sums("project", None, ())
    c2, h = sums("project", c1, ())
    C = c1 + c2
    h = h - ct(c2) @ c2  # (G1 - Q C2)^H (G1 - Q C2) with Q^H G1 = C2 and Q^H Q = I on Q's nonzero columns
    h = (h + ct(h)) / 2
    rinv = [_whitening(h, int(np.sum(zero)), M)]
    _, h2 = sums("gram", C, tuple(rinv))  # the CholeskyQR step on (G - Q C) W
    r2 = cholesky_upper(h2)
    if r2 is not None:
        rinv.append(_inv(r2))
    return Completion(seed=int(seed), zero=np.asarray(zero, dtype=bool), C=C, rinv=tuple(rinv))


#: An eigenvalue of ``(Q L_z)^H (Q L_z)`` above this says its direction is in ``range(Q)``: kept, not
#: completed (:func:`keep_spanned`). The eigenvalues are 1 or 0 to rounding; the half splits them.
SPANNED = 0.5


def keep_spanned(block: Any, chain: list, zero: np.ndarray) -> tuple[list, np.ndarray]:
    """The ``zero`` columns of ``U = Q L`` (``Q = Y chain[:-1]``, ``L = chain[-1]``) that ``range(Q)``
    holds, kept as the method found them; returns the chain with ``L``'s zero columns rotated and
    scaled, and the columns still to complete (:func:`complete_incore`, :func:`complete_stored`).

    A completion is orthogonal to ``range(Q)``, which the module's premise takes to hold no direction of
    a zero singular value. A ``Q`` of full rank breaks it: an ``M x c`` ``Y`` with ``c`` near ``M`` (a
    square ``A``, or a centered one: its means make a zero) spans every direction, the completion has no
    room, and ``G - Q C`` is rounding, which the whitening magnified into columns of norm 2 to 4 (found
    by a randomized search). Those directions are in ``Q L_z`` already: the small factor's vectors of its
    zero singular values, with ``B^H Q L_z = 0``. So the eigenpairs ``K V = V Lambda`` of ``K = L_z^H (Q^H
    Q) L_z`` (``Q^H Q`` in one pass over a stored ``Y``, only where zeros occur) split them: columns
    ``Q L_z v / sqrt(lambda)`` where ``lambda >`` :data:`SPANNED` (orthonormal, and orthogonal to the
    nonzero triplets' columns, as ``L``'s columns are), completed columns for the others (``Q L_z v`` of
    norm near zero: ``L_z`` on ``Q``'s zero columns). Any orthonormal basis of the zero singular
    values' space is a right one."""
    basis, last = list(chain[:-1]), np.asarray(chain[-1])
    lz = last[:, zero]
    gq = block.gram_after(basis or [np.eye(last.shape[0], dtype=last.dtype)])
    k = ct(lz) @ np.asarray(gq, dtype=lz.dtype) @ lz
    lam, v = np.linalg.eigh((k + ct(k)) / 2)
    spanned = lam > SPANNED
    if not spanned.any():
        return list(chain), zero
    rot = lz @ v
    rot[:, spanned] /= np.sqrt(lam[spanned])[None, :]
    new = last.copy()
    new[:, zero] = rot
    still = zero.copy()
    still[np.flatnonzero(zero)] = ~spanned
    return [*basis, new], still


def complete_incore(u_basis: np.ndarray, last: np.ndarray, zero: np.ndarray, seed: int) -> np.ndarray:
    """``U = Q L`` with its ``zero`` columns completed, ``Q`` (``M x c``) held in memory (float64 or complex128)."""
    M = u_basis.shape[0]
    wd = work_dtype(u_basis.dtype)
    g = _gaussian(seed, int(zero.sum()), wd).rows(0, M)

    def sums(stage: str, C: Any, rinv: tuple) -> tuple:
        h = rinv[-1].shape[1] if stage == "gram" else g.shape[1]
        state = {"P": np.zeros((u_basis.shape[1], g.shape[1]), dtype=wd), "H": np.zeros((h, h), dtype=wd)}
        _strip(u_basis, g, {"stage": stage, "C": C, "rinv": rinv}, state)
        return state["P"], state["H"]

    comp = complete(sums, zero=zero, seed=seed, M=M)
    T, E = comp.finals(last)
    return _strip(u_basis, g, {"stage": "write", "T": T, "E": E}, {})


def complete_stored(block: Any, ws: list, last: np.ndarray, zero: np.ndarray, seed: int, out_path: str, *,
                    transposed_out: bool = False, description: str = "write the long factor") -> None:
    """``U = (Y W_1 ... W_p) L`` written to ``out_path`` with its ``zero`` columns completed, ``Y`` the
    stored :class:`~blocklin.linalg.blocks.tallblock.TallBlock` ``block``: three passes over it and the
    write (the one pass it had without zeros)."""
    from blocklin.storage import create_array

    wd = work_dtype(block.dtype)
    ws = [np.asarray(w, dtype=wd) for w in ws]
    z, k = int(zero.sum()), int(zero.size)
    base = {"W": ws, "z": z, "seed": int(seed), "c": block.c, "work": wd.name}

    def run(params: dict, what: str, **kw: Any) -> list:
        states, _ = run_pass(block.job, fill_kernel, [block.source], params, memory=block.memory,
                             over="intermediate", description=f"orthonormal completion: {what}", **kw)
        return states

    def sums(stage: str, C: Any, rinv: tuple) -> tuple:
        states = run(base | {"stage": stage, "C": C, "rinv": list(rinv)}, "projection" if stage == "project" else "Gram")
        return reduce_sum(states, "P"), reduce_sum(states, "H")

    comp = complete(sums, zero=zero, seed=seed, M=block.M)
    T, E = comp.finals(last)
    params = base | {"stage": "write", "T": T, "E": E, "k": k, "write": "F", "dtype": block.dtype.str}
    plan = plan_kernel_pass(block.job, fill_kernel, [block.source], params, memory=block.memory)
    shape, chunks = ((k, block.M), (k, plan.strip)) if transposed_out else ((block.M, k), (plan.strip, k))
    create_array(out_path, shape=shape, dtype=block.dtype, chunks=chunks, codec="none")
    run(params, description, plan=plan, outputs=(("F", out_path),), transposed_outputs=("F",) if transposed_out else ())


def plan_completion(job: Any, src: Any, ws: list, k: int, *, memory: int, reserve: int = 0) -> Any:
    """Plan the completion's widest pass (every one of ``k`` columns completed, the write) over the
    stored block ``src`` (a :class:`~blocklin.runtime.passes.Source`; ``ws``: anything with the shapes of
    ``Q``'s factors): what a run's preflight checks before its first pass."""
    params = {"W": ws, "z": k, "k": k, "stage": "write", "write": "F", "work": work_dtype(src.dtype).name}
    return plan_kernel_pass(job, fill_kernel, [src], params, memory=memory, reserve=reserve)
