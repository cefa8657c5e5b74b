"""Complex against real LU, Cholesky and inv out of core: speed per real flop (a small measurement, not a benchmark suite).

Usage::

    python benchmarks/complex_factor.py [--n 2048] [--chunk 256] [--fraction 0.5] [--repeat 2] [--dir DIR]

For each of float64 and complex128 (and float32/complex64 with ``--single``) a random ``n x n``
matrix (LU) and a Hermitian positive definite one (Cholesky) are written to zarr with square chunks,
then factored by ``blocklin.lu`` and ``blocklin.cholesky`` (and the first inverted by ``blocklin.inv``) with a budget of ``--fraction`` of the
matrix's bytes (out of core: several panels and tiles), the best of ``--repeat`` runs each. A complex
multiply-add is four real ones, so the complex runs are credited ``4 x`` the real flop count
(``8 n^3 / 3`` real flops for LU, ``4 n^3 / 3`` for Cholesky, ``8 n^3`` for the inverse); the last column is the complex rate over
the real one, per real flop (1.0: complex costs exactly its four times the flops). The ``svd`` row: the
general matrix's ``k = 20`` triplets by ``rsvd`` with 2 power iterations (3 passes over ``A``, each
``4 n^2 (k + 10)`` real flops of products with ``A``; the in-memory steps are not counted).
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


def _best(run, repeat: int) -> tuple[float, dict]:
    best, report = float("inf"), {}
    for _ in range(repeat):
        t0 = time.perf_counter()
        m = run()
        dt = time.perf_counter() - t0
        if dt < best:
            best, report = dt, m.report
        m.delete()
    return best, report


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--chunk", type=int, default=256)
    p.add_argument("--fraction", type=float, default=0.5, help="budget as a fraction of the matrix's bytes")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--single", action="store_true", help="also float32 against complex64")
    p.add_argument("--dir", default=None)
    args = p.parse_args(argv)
    n = args.n
    where = Path(args.dir or tempfile.mkdtemp(prefix="complex-factor-"))
    where.mkdir(parents=True, exist_ok=True)
    pairs = [(np.float64, np.complex128)] + ([(np.float32, np.complex64)] if args.single else [])
    print(f"n = {n}, chunks {args.chunk}, budget {args.fraction:g} of each matrix, best of {args.repeat}")
    print(f"{'op':9} {'dtype':10} {'budget':>8} {'tiles':>6} {'seconds':>8} {'real GFLOP/s':>13} {'complex/real':>13}")
    try:
        for pair in pairs:
            rates: dict[str, float] = {}
            for dtype in map(np.dtype, pair):
                pa, ph = _matrices(n, dtype, args.chunk, where)
                memory = int(args.fraction * n * n * dtype.itemsize)
                scale = 4 if dtype.kind == "c" else 1
                for op, run, flops in (
                        ("lu", lambda: bl.lu(pa, memory=memory), 2 * n**3 / 3),
                        ("cholesky", lambda: bl.cholesky(ph, memory=memory), n**3 / 3),
                        ("inv", lambda: bl.inv(pa, memory=memory), 2 * n**3),  # out of core: the LU route
                        ("svd", lambda: bl.svd(pa, 20, method="rsvd", power_iters=2, memory=memory, seed=0).U,
                         3 * 4 * n**2 * 30)):
                    seconds, report = _best(run, args.repeat)
                    rate = scale * flops / seconds / 1e9
                    plan = report.get("plan", {})
                    tiles = plan.get("tiles") or -(-n // plan.get("tile", n))
                    ratio = f"{rate / rates[op]:.2f}" if dtype.kind == "c" else ""
                    rates.setdefault(op, rate)
                    print(f"{op:9} {dtype.name:10} {memory / 2**20:6.1f}Mi {tiles:>6} {seconds:8.2f} {rate:13.1f} "
                          f"{ratio:>13}")
    finally:
        if args.dir is None:
            shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    main()
