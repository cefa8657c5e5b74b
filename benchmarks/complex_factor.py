"""Complex against real GEMM, LU, Cholesky, QR, solve, inv and svd out of core: speed per real flop and backward errors against LAPACK's (a small measurement, not a benchmark suite).

Usage::

    python benchmarks/complex_factor.py [--n 2048] [--chunk 256] [--fraction 0.5] [--repeat 2] [--no-check] [--dir DIR]

For each of float64 and complex128 (and float32/complex64 with ``--single``) a random ``n x n``
matrix (LU) and a Hermitian positive definite one (Cholesky) are written to zarr with square chunks,
then factored by ``blocklin.lu`` and ``blocklin.cholesky`` (and the first inverted by ``blocklin.inv``) with a budget of ``--fraction`` of the
matrix's bytes (out of core: several panels and tiles), the best of ``--repeat`` runs each. A complex
multiply-add is four real ones, so the complex runs are credited ``4 x`` the real flop count
(``8 n^3 / 3`` real flops for LU, ``4 n^3 / 3`` for Cholesky, ``8 n^3`` for the inverse); the last column is the complex rate over
the real one, per real flop (1.0: complex costs exactly its four times the flops). The ``svd`` row: the
general matrix's ``k = 20`` triplets by ``rsvd`` with 2 power iterations (3 passes over ``A``, each
``4 n^2 (k + 10)`` real flops of products with ``A``; the in-memory steps are not counted). Also
``gemm`` (``A A``, ``2 n^3``), ``qr`` (``Q`` and ``R``, ``4 n^3 / 3`` as Householder's) and ``solve``
(the square system ``A x = b`` for 8 right-hand sides: the LU and the refinement, credited ``2 n^3 / 3``).

With ``--check`` (the default) each result's backward error is set beside LAPACK's on the same matrix
in memory (NumPy/SciPy: ``zgemm``, ``zgetrf``, ``zpotrf``, ``zgeqrf``, ``zgetri``, ``zgesv``, ``zgesdd``),
the issue's goal being at most 10x LAPACK's: ``||P A - L U|| / ||A||``, ``||A - L L^H|| / ||A||``,
``||A - Q R|| / ||A||`` and ``||Q^H Q - I||``, ``||I - A X|| / (||A|| ||X||)``, ``||b - A x|| / (||A|| ||x||)``,
``||C - C_ref|| / (||A||^2)`` of the product against a float128-free reference (the other's result:
the figure bounds both), and the ``k`` singular values' ``max |s - s_ref| / s_1`` against LAPACK's
(rsvd's own error: printed, not a ratio). Frobenius norms, float64/complex128 arithmetic.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

import blocklin as bl


def _matrices(n: int, dtype: np.dtype, chunk: int, where: Path) -> tuple[str, str]:
    rng = np.random.default_rng(0)
    g = rng.standard_normal((n, n))
    if dtype.kind == "c":
        g = g + 1j * rng.standard_normal((n, n))
    a = g.astype(dtype)
    h = (g @ g.conj().T / n + np.eye(n)).astype(dtype)
    pa, ph = str(where / f"a-{dtype.name}.zarr"), str(where / f"h-{dtype.name}.zarr")
    bl.from_array(a, pa, chunks=(chunk, chunk))
    bl.from_array(h, ph, chunks=(chunk, chunk))
    return pa, ph


def _results(m) -> tuple:
    return m if isinstance(m, tuple) else (m,)


def _best(run, repeat: int, keep=None) -> tuple[float, dict, object]:
    """The best time of ``repeat`` runs, the report, and ``keep(result)`` of the last run (before its
    stores are deleted)."""
    best, report, kept = float("inf"), {}, None
    for _ in range(repeat):
        t0 = time.perf_counter()
        m = run()
        dt = time.perf_counter() - t0
        first = _results(m)[0]
        if dt < best:
            best, report = dt, first.report
        if keep is not None:
            kept = keep(m)
        for x in _results(m):
            x.delete()
    return best, report, kept


def _fro(x) -> float:
    return float(np.linalg.norm(x))


def _swapped(a: np.ndarray, pivots) -> np.ndarray:
    """``P A``: LAPACK's row swaps (row ``i`` with ``pivots[i]``, in order) applied to ``A``."""
    pa = a.copy()
    for i, p in enumerate(np.asarray(pivots)):
        if p != i:
            pa[[i, p]] = pa[[p, i]]
    return pa


def _errors(op: str, a: np.ndarray, h: np.ndarray, b: np.ndarray, got) -> tuple[float, float]:
    """(blocklin's backward error, LAPACK's) of ``op`` (see the module notes)."""
    import scipy.linalg

    w = np.complex128 if a.dtype.kind == "c" else np.float64
    a, h, b = a.astype(w), h.astype(w), b.astype(w)
    if op == "gemm":
        ref = a @ a
        d = _fro(got.astype(w) - ref) / _fro(a) ** 2
        return d, d
    if op == "lu":
        f, piv = got
        lu, lp = scipy.linalg.lu_factor(a)

        def err(f, p):
            f = f.astype(w)
            return _fro(_swapped(a, p) - (np.tril(f, -1) + np.eye(len(f))) @ np.triu(f)) / _fro(a)
        return err(f, piv), err(lu, lp)
    if op == "cholesky":
        ll = np.linalg.cholesky(h)
        return (_fro(h - got.astype(w) @ got.astype(w).conj().T) / _fro(h), _fro(h - ll @ ll.conj().T) / _fro(h))
    if op == "qr":
        q, r = (x.astype(w) for x in got)
        q0, r0 = np.linalg.qr(a)
        eye = np.eye(a.shape[1])

        def err(q, r):
            return max(_fro(a - q @ r) / _fro(a), _fro(q.conj().T @ q - eye))
        return err(q, r), err(q0, r0)
    if op == "inv":
        x0 = scipy.linalg.inv(a)

        def err(x):
            return _fro(np.eye(len(a)) - a @ x.astype(w)) / (_fro(a) * _fro(x))
        return err(got), err(x0)
    if op == "solve":
        x0 = scipy.linalg.solve(a, b)

        def err(x):
            return _fro(b - a @ x.astype(w)) / (_fro(a) * _fro(x))
        return err(got), err(x0)
    s_ref = np.linalg.svd(a, compute_uv=False)
    d = float(np.max(np.abs(np.asarray(got, np.float64) - s_ref[:len(got)]))) / s_ref[0]
    return d, float("nan")


def _svd_u(res, into: dict):
    """The svd's ``U`` (the store timed and deleted), its singular values kept in ``into``."""
    into["s"] = np.asarray(res.s)
    return res.U


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--chunk", type=int, default=256)
    p.add_argument("--fraction", type=float, default=0.5, help="budget as a fraction of the matrix's bytes")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--single", action="store_true", help="also float32 against complex64")
    p.add_argument("--no-check", dest="check", action="store_false",
                   help="skip the backward errors against LAPACK (each loads the results into memory)")
    p.add_argument("--dir", default=None)
    args = p.parse_args(argv)
    n = args.n
    where = Path(args.dir or tempfile.mkdtemp(prefix="complex-factor-"))
    where.mkdir(parents=True, exist_ok=True)
    pairs = [(np.float64, np.complex128)] + ([(np.float32, np.complex64)] if args.single else [])
    print(f"n = {n}, chunks {args.chunk}, budget {args.fraction:g} of each matrix, best of {args.repeat}")
    print(f"{'op':9} {'dtype':10} {'budget':>8} {'tiles':>6} {'seconds':>8} {'real GFLOP/s':>13} {'complex/real':>13}"
          + (f" {'backward error':>15} {'LAPACK':>9} {'ratio':>6}" if args.check else ""))
    try:
        for pair in pairs:
            rates: dict[str, float] = {}
            for dtype in map(np.dtype, pair):
                pa, ph = _matrices(n, dtype, args.chunk, where)
                a_mem, h_mem = bl.open(pa).to_numpy(), bl.open(ph).to_numpy()
                b_mem = np.random.default_rng(1).standard_normal((n, 8)).astype(dtype)
                pb = str(where / f"b-{dtype.name}.zarr")
                bl.from_array(b_mem, pb)
                memory = int(args.fraction * n * n * dtype.itemsize)
                scale = 4 if dtype.kind == "c" else 1
                svd_s = {}
                for op, run, flops, keep in (
                        ("gemm", lambda: bl.matmul(pa, pa, memory=memory), 2 * n**3, lambda m: m.to_numpy()),
                        ("lu", lambda: bl.lu(pa, memory=memory), 2 * n**3 / 3,
                         lambda m: (m.to_numpy(), m.report["pivots"])),
                        ("cholesky", lambda: bl.cholesky(ph, memory=memory), n**3 / 3, lambda m: m.to_numpy()),
                        ("qr", lambda: bl.qr(pa, mode="reduced", memory=memory), 4 * n**3 / 3,
                         lambda m: tuple(x.to_numpy() for x in m)),
                        ("solve", lambda: bl.solve(pa, pb, memory=memory), 2 * n**3 / 3, lambda m: m.to_numpy()),
                        ("inv", lambda: bl.inv(pa, memory=memory), 2 * n**3, lambda m: m.to_numpy()),  # the LU route
                        ("svd", lambda: _svd_u(bl.svd(pa, 20, method="rsvd", power_iters=2, memory=memory, seed=0),
                                               svd_s), 3 * 4 * n**2 * 30, lambda m: svd_s["s"])):
                    seconds, report, got = _best(run, args.repeat, keep if args.check else None)
                    rate = scale * flops / seconds / 1e9
                    plan = report.get("plan", {})
                    tiles = plan.get("tiles") or -(-n // plan.get("tile", n))
                    ratio = f"{rate / rates[op]:.2f}" if dtype.kind == "c" else ""
                    rates.setdefault(op, rate)
                    line = (f"{op:9} {dtype.name:10} {memory / 2**20:6.1f}Mi {tiles:>6} {seconds:8.2f} {rate:13.1f} "
                            f"{ratio:>13}")
                    if args.check:
                        mine, lapack = _errors(op, a_mem, h_mem, b_mem, got)
                        rel = "" if op in ("gemm", "svd") else f"{mine / lapack:6.2f}"
                        line += f" {mine:15.2e} {lapack:9.2e} {rel:>6}"
                    print(line, flush=True)
    finally:
        if args.dir is None:
            shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    main()
