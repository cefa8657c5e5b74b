"""A power-law graph out of core: generate it, convert it, and find its top eigenpairs and singular triplets.

    python examples/power_law_graph.py [nodes] [budget]

The graph is a Chung-Lu random graph (Chung and Lu 2002): node ``i`` has the weight
``(i + 1)^(-1 / (gamma - 1))`` with ``gamma = 2.5`` (a Zipf sequence, so the degrees follow a
power law ``P(d) ~ d^-2.5``), and each of ``E`` edges picks its two ends independently with
probability proportional to the weights (repeated edges add up, as multi-edges). It is written as
a coordinate Matrix Market file (``pattern symmetric``: the lower triangle, one line an edge) in
chunks, so the generator's memory is the weights and one chunk whatever ``E`` is.
``blocklin.convert`` then stores the adjacency ``S`` as CSR row blocks within the budget
(duplicates summed, the upper triangle mirrored), and the example runs

* ``blocklin.eigsh(S, k)``: the largest eigenvalues of the adjacency (block Lanczos, one streamed
  product a step);
* ``blocklin.eigsh(S, k, laplacian="combinatorial")``: the largest eigenvalues of the graph
  Laplacian ``L = D - S`` (the degrees in one pass; ``L`` is never formed);
* ``blocklin.svd(S, k)``: the largest singular triplets,

and checks every pair's and triplet's residual with a separate pass over the row blocks.
The defaults are 50,000 nodes, 250,000 edges and a 64 MiB budget (1 to 2 minutes on a 2-core machine);
``BLOCKLIN_EXAMPLE_SIZE=small`` uses 5,000 nodes (the test suite does). Everything is written
under a temporary folder that is removed at the end.

:func:`write_power_law_mtx` is the generator ``benchmarks/sparse_matrices.py`` and the tests import.
"""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np

#: Degree exponent of the generated graphs (``P(d) ~ d^-GAMMA``; 2 < gamma < 3 as in many real networks).
GAMMA = 2.5


def power_law_weights(n: int, gamma: float = GAMMA) -> np.ndarray:
    """Chung-Lu weights ``(i + 1)^(-1 / (gamma - 1))`` of ``n`` nodes, normalized to sum to 1 (float64)."""
    w = np.arange(1, n + 1, dtype=np.float64) ** (-1.0 / (gamma - 1.0))
    return w / w.sum()


def power_law_edges(n: int, edges: int, *, gamma: float = GAMMA, seed: int = 0, chunk: int = 1 << 20):
    """Yield ``(rows, cols)`` (0-based int64) of ``edges`` Chung-Lu edges, ``chunk`` at a time.

    Both ends of an edge are drawn independently from the weights (inverse CDF by ``searchsorted``);
    the node numbers are shuffled by a seeded permutation so the hubs spread over the row blocks.
    The same ``(n, edges, gamma, seed, chunk)`` gives the same edges on every machine.
    """
    cdf = np.cumsum(power_law_weights(n, gamma))
    cdf[-1] = 1.0
    rng = np.random.default_rng(seed)
    label = rng.permutation(n)
    for start in range(0, edges, chunk):
        c = min(chunk, edges - start)
        a = np.searchsorted(cdf, rng.random(c), side="right")
        b = np.searchsorted(cdf, rng.random(c), side="right")
        yield label[a], label[b]


def write_power_law_mtx(path: str, n: int, edges: int, *, gamma: float = GAMMA, seed: int = 0,
                        symmetric: bool = True, chunk: int = 1 << 20) -> int:
    """Write the adjacency of a Chung-Lu power-law graph as a coordinate Matrix Market file.

    Parameters
    ----------
    path : str
        The ``.mtx`` file to write.
    n : int
        Nodes (the matrix is ``n x n``).
    edges : int
        Edges drawn (lines in the file). A symmetric file holds each edge once, in the lower triangle,
        so the matrix has about ``2 edges`` stored entries (fewer where edges repeat or are loops).
    gamma : float
        Degree exponent.
    seed : int
        Seed of the edges and of the node numbering.
    symmetric : bool
        ``pattern symmetric`` (an undirected graph, ``S = S^T``) or ``pattern general`` (a directed
        one: edge ``(a, b)`` goes from ``a`` to ``b``).
    chunk : int
        Edges generated and written at a time (the memory is ``n`` weights plus one chunk).

    Returns
    -------
    int
        Bytes written.
    """
    kind = "symmetric" if symmetric else "general"
    with open(path, "w") as f:
        f.write(f"%%MatrixMarket matrix coordinate pattern {kind}\n% Chung-Lu power-law graph, gamma={gamma}, "
                f"seed={seed}\n{n} {n} {edges}\n")
        for a, b in power_law_edges(n, edges, gamma=gamma, seed=seed, chunk=chunk):
            if symmetric:  # the lower triangle: row >= column
                a, b = np.maximum(a, b), np.minimum(a, b)
            f.write("\n".join(map("{} {}".format, (a + 1).tolist(), (b + 1).tolist())))
            f.write("\n")
    return os.path.getsize(path)


def pair_residuals(s, w: np.ndarray, V: np.ndarray, *, laplacian: bool = False) -> np.ndarray:
    """``||M v_i - w_i v_i|| / |w_i|`` of every pair, in one pass over the stored row blocks of ``s``;
    ``M`` is ``S``, or with ``laplacian`` the graph Laplacian ``D - S`` (``D`` the row sums, from the same blocks)."""
    sq = np.zeros(len(w))
    for r0, blk in s.iter_row_blocks():
        r1 = r0 + blk.shape[0]
        mv = blk @ V
        if laplacian:
            mv = np.asarray(blk.sum(axis=1)) * V[r0:r1] - mv
        sq += ((mv - V[r0:r1] * w) ** 2).sum(axis=0)
    return np.sqrt(sq) / np.maximum(np.abs(w), np.finfo(np.float64).tiny)


def triplet_residuals(s, U, sv: np.ndarray, Vt: np.ndarray) -> np.ndarray:
    """``max(||S v_i - s_i u_i||, ||S^T u_i - s_i v_i||) / s_i`` of every triplet, in one pass over the
    stored row blocks (``U`` a stored ``Matrix`` or an array, read by the same strips)."""
    V = np.asarray(Vt, dtype=np.float64).T
    left = np.zeros(len(sv))
    right = np.zeros(V.shape)
    for r0, blk in s.iter_row_blocks():
        r1 = r0 + blk.shape[0]
        u = np.asarray(U[r0:r1], dtype=np.float64)
        left += (((blk @ V) - u * sv) ** 2).sum(axis=0)
        right += blk.T @ u
    right = ((right - V * sv) ** 2).sum(axis=0)
    return np.sqrt(np.maximum(left, right)) / np.maximum(sv, np.finfo(np.float64).tiny)


def main() -> int:
    import blocklin as bl

    small = os.environ.get("BLOCKLIN_EXAMPLE_SIZE") == "small"
    n = int(sys.argv[1]) if len(sys.argv) > 1 else (5_000 if small else 50_000)
    budget = sys.argv[2] if len(sys.argv) > 2 else "64MiB"
    edges, k = 5 * n, 10
    with tempfile.TemporaryDirectory() as d, bl.config.set(temp_dir=d):
        # 1. Generate the graph as a coordinate Matrix Market file, chunk by chunk.
        size = write_power_law_mtx(f"{d}/graph.mtx", n, edges, seed=0)
        print(f"graph: {n} nodes, {edges} edges, power law gamma={GAMMA}; graph.mtx {size / 2**20:.1f} MiB")

        # 2. Convert: an external sort by row block within the budget (blocklin convert graph.mtx S.zarr).
        rep = bl.convert(f"{d}/graph.mtx", f"{d}/S.zarr", memory=budget)
        s = bl.open(f"{d}/S.zarr")
        deg = np.diff(s.rows(0, n).indptr) if small else None
        print(f"S: {s.shape[0]} x {s.shape[1]}, {s.nnz} entries ({s.nbytes / 2**20:.1f} MiB as CSR), "
              f"{s.n_blocks} row blocks; converted in {rep['seconds']:.1f} s, peak memory "
              f"{rep['peak_memory'] / 2**20:.0f} MiB")
        if deg is not None:
            print(f"degrees: max {deg.max()}, median {int(np.median(deg))}")

        # 3. The largest eigenvalues of the adjacency (symmetry checked on the first step).
        #    tol is absolute over the largest eigenvalue: 1e-8 keeps every pair's relative residual small
        #    (the spectrum of a power-law graph decays slowly, so this takes some dozens of passes).
        eig = bl.eigsh(s, k, order="descending", tol=1e-8, max_passes=400, seed=0)
        w, V = eig
        res_a = pair_residuals(s, np.asarray(w, np.float64), np.asarray(V, np.float64))
        print(f"adjacency eigenvalues: {np.round(w[:5], 3)} ... ({eig.report['passes']} passes)")

        # 4. The graph Laplacian L = D - S (laplacian="combinatorial": the degrees in one pass, L never
        #    formed) and its largest eigenvalues; its smallest (0 for each connected component) would
        #    need a shift-and-invert solve, which the sparse route does not do.
        eig_l = bl.eigsh(s, k, laplacian="combinatorial", order="descending", tol=1e-8, max_passes=400, seed=0)
        wl, Vl = eig_l
        res_l = pair_residuals(s, np.asarray(wl, np.float64), np.asarray(Vl, np.float64), laplacian=True)
        print(f"Laplacian eigenvalues: {np.round(wl[:5], 3)} ... ({eig_l.report['passes']} passes)")

        # 5. The largest singular triplets (block Lanczos through the row-block operator).
        #    (tol=1e-8: residuals, not only singular values, to that level; the default targets the values)
        svd = bl.svd(s, k, tol=1e-8, seed=0)
        U, sv, Vt = svd
        res_s = triplet_residuals(s, U, np.asarray(sv, np.float64), Vt)
        print(f"singular values: {np.round(sv[:5], 3)} ... ({U.shape[0]} x {U.shape[1]} U, "
              f"{svd.report['operator_products']} products)")
        # Perron-Frobenius: the largest eigenvalue of a nonnegative matrix is its largest |eigenvalue|,
        # so (S symmetric) its largest singular value.
        gap = abs(float(sv[0]) - float(w[0])) / float(sv[0])
        worst = max(res_a.max(), res_l.max(), res_s.max())
        print(f"largest eigenvalue vs largest singular value: difference {gap:.1e} (relative)")
        ok = worst <= 1e-6 and gap <= 1e-6
        print(f"check: every residual <= 1e-6 (adjacency {res_a.max():.1e}, Laplacian {res_l.max():.1e}, "
              f"svd {res_s.max():.1e}): {ok}")
        del s, svd, U, V, Vl, eig, eig_l
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
