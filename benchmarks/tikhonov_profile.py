"""Where the time of a stored-Gram Tikhonov solve goes: seconds per block operation.

Usage::

    python benchmarks/tikhonov_profile.py --n 8000 --memory 128MiB [--chunk 1024] [--dir DIR]

A random ``n x n`` float64 ``A`` and ``b`` (written once to ``--dir``, kept there for reruns) are solved
by ``blocklin.solve(A, b, lam=1)`` with a budget below the Gram matrix (the route of
:mod:`blocklin.linalg.solve.stored_gram`); each :class:`~blocklin.runtime.blockops.BlockOps` operation (SYRK,
Cholesky, triangular solves) and each product over ``A`` is timed. To compare two versions of the code
in one run, point ``PYTHONPATH`` at each checkout in turn with the same ``--dir``.
"""

from __future__ import annotations

import argparse
import functools
import time
from pathlib import Path

import numpy as np


def make(folder: Path, n: int, chunk: int) -> tuple[Path, Path]:
    import zarr

    a_path, b_path = folder / f"A{n}.zarr", folder / f"b{n}.zarr"
    if not a_path.exists():
        z = zarr.create_array(str(a_path), shape=(n, n), dtype="float64", chunks=(chunk, chunk), compressors=None)
        rng = np.random.default_rng(5)
        for i in range(0, n, chunk):
            z[i:i + chunk, :] = rng.standard_normal((min(chunk, n - i), n))
        zb = zarr.create_array(str(b_path), shape=(n, 1), dtype="float64", chunks=(chunk, 1), compressors=None)
        zb[...] = rng.standard_normal((n, 1))
    return a_path, b_path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=8000)
    ap.add_argument("--memory", default="128MiB")
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--dir", default="bench-tikhonov")
    args = ap.parse_args()
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    a_path, b_path = make(folder, args.n, args.chunk)

    import blocklin
    from blocklin.linalg.solve import stored_gram as gram_solve
    from blocklin.runtime import blockops

    times: dict[str, float] = {}

    def timed(cls, name):
        f = getattr(cls, name)

        @functools.wraps(f)
        def g(*a, **k):
            t0 = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                key = f"{name}: {k.get('description', '')}"
                times[key] = times.get(key, 0.0) + time.perf_counter() - t0

        setattr(cls, name, g)

    for name in ("syrk", "cholesky", "trsm", "axpby", "sumsq"):
        timed(blockops.BlockOps, name)
    timed(gram_solve._GramSolve, "gemm")
    out = folder / f"x-{time.time_ns()}.zarr"
    t0 = time.perf_counter()
    x = blocklin.solve(str(a_path), str(b_path), lam=1.0, memory=args.memory, out=str(out))
    total = time.perf_counter() - t0
    print(f"{blocklin.__file__}: n {args.n}, memory {args.memory}: {total:.1f} s, Gram tiles "
          f"{x.report.get('gram_tile')}")
    for key, sec in sorted(times.items(), key=lambda kv: -kv[1]):
        print(f"{sec:8.1f}  {key}")
    import shutil

    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
