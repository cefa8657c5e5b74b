"""The cost of one row pass: the Lanczos step ``Z = A^T (A Q)`` of ``svd(a, k)``'s default, timed alone.

``A`` is a tall float64 matrix in an uncompressed zarr file (100000 x 500, 0.4 GB, chunks of 2048
rows by default: the defaults benchmark's shape), read from the page cache after the first pass;
``Q`` is ``n x b`` orthonormal (``b = 30``: block ``k + oversample`` for ``k = 20``). Variants run in
one process, alternated pass by pass, so their ratio comes from the same load:

* ``auto``: the planner's choice when ``workers=`` is not set (``plan.passes.pass_workers``);
* ``workers=1``: one task with every core's BLAS threads (the earlier default);
* ``floor``: the same products without blocklin's pass: two threads, each reading whole chunks of its
  rows with ``preadv`` into its own buffer and making both products with one BLAS thread, in the
  kernel's layout (column-major ``Y`` and ``Z``) and through its BLAS calls, which release the GIL
  (a plain pass over the page cache; a pass's strips mapped from the page cache skip its copy).

Every variant's ``Z`` is checked against the floor's to a relative 1e-12 (float64, 100000 rows
summed in different orders). The first pass of each job (which also checks ``A`` for NaN/Inf) is
not timed. Usage::

    python benchmarks/row_pass.py                          # creates the matrix in a temp dir
    python benchmarks/row_pass.py --data /tmp/A.zarr --passes 8
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
import time

import numpy as np


def make(path: str, m: int, n: int, chunk_rows: int) -> None:
    import zarr

    arr = zarr.create_array(store=path, shape=(m, n), chunks=(chunk_rows, n), dtype="float64", compressors=None,
                            zarr_format=3, fill_value=0.0)
    for r0 in range(0, m, chunk_rows):
        r1 = min(m, r0 + chunk_rows)
        arr[r0:r1] = np.random.default_rng([1, r0]).standard_normal((r1 - r0, n))


def floor_pass(path: str, m: int, n: int, chunk_rows: int, q: np.ndarray) -> np.ndarray:
    from threadpoolctl import threadpool_limits

    from blocklin.device import host_blas

    chunks = list(range(-(-m // chunk_rows)))
    # column-major Y and Z, the layout of the pass's kernel, and its BLAS calls (without the GIL)
    parts = [np.zeros((n, q.shape[1]), order="F") for _ in range(2)]
    qf = np.asfortranarray(q)

    def lane(j: int) -> None:
        buf = np.empty((chunk_rows, n))
        y = np.empty((chunk_rows, q.shape[1]), order="F")
        for c in chunks[j::2]:
            fd = os.open(os.path.join(path, "c", str(c), "0"), os.O_RDONLY)
            try:
                got = os.preadv(fd, [memoryview(buf.reshape(-1).view(np.uint8))], 0)
            finally:
                os.close(fd)
            rows = min(chunk_rows, m - c * chunk_rows)
            assert got >= rows * n * 8
            host_blas.gemm(1.0, buf[:rows].T, qf, beta=0.0, c=y[:rows], trans_a=1)
            host_blas.gemm(1.0, buf[:rows].T, y[:rows], beta=1.0, c=parts[j])

    with threadpool_limits(1, user_api="blas"):
        threads = [threading.Thread(target=lane, args=(j,)) for j in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return parts[0] + parts[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--cols", type=int, default=500)
    p.add_argument("--block", type=int, default=30)
    p.add_argument("--chunk-rows", type=int, default=2048)
    p.add_argument("--memory", default="96MiB")
    p.add_argument("--passes", type=int, default=6, help="timed passes per variant")
    p.add_argument("--data", help="reuse (or create and keep) the matrix at this path")
    args = p.parse_args()

    from blocklin.linalg.blocks import tall_kernels as K
    from blocklin.linalg.lowrank import budget, sources
    from blocklin.runtime.job import Job

    folder = None if args.data else tempfile.mkdtemp(prefix="blocklin-bench-rowpass-")
    path = args.data or os.path.join(folder, "A.zarr")
    try:
        if not os.path.exists(path):
            make(path, args.rows, args.cols, args.chunk_rows)
        q = np.linalg.qr(np.random.default_rng(0).standard_normal((args.cols, args.block)))[0]
        kw = dict(method="lanczos", oversample=10, power_iters=None, max_passes=60, block_size=args.block,
                  max_basis=2 * args.block)
        jobs = {"auto": Job("svd", memory=args.memory), "workers=1": Job("svd", memory=args.memory, workers=1)}
        passes, ref = {}, None
        for name, job in jobs.items():
            job.__enter__()
            A = job.operand(path, "a")
            src = sources.Streamed(job, A, budget.fitting_plan(job, A, args.block - 10, kw))
            plan = src._plan(K.normal_kernel, src._shifted({"gram": False, "write_y": False}, Q=q))
            print(f"# {name}: {plan.explain()}; {plan.blas_threads} BLAS thread(s) per task")
            src.normal(q)  # checks A for NaN/Inf; later passes do not
            passes[name] = src
        times: dict[str, list[float]] = {name: [] for name in [*jobs, "floor"]}
        for _ in range(args.passes):
            for name in times:
                t0 = time.perf_counter()
                if name == "floor":
                    z = floor_pass(path, args.rows, args.cols, args.chunk_rows, q)
                else:
                    z = passes[name].normal(q)[0]
                times[name].append(time.perf_counter() - t0)
                ref = z if ref is None else ref
                err = np.abs(z - ref).max() / np.abs(ref).max()
                assert err < 1e-12, f"{name}: Z differs from the first variant's by {err:.1e}"
        for job in jobs.values():
            job.__exit__(None, None, None)
        med = {name: float(np.median(ts)) for name, ts in times.items()}
        for name, ts in times.items():
            print(f"{name:10s} median {med[name]:.3f} s per pass (min {min(ts):.3f}, max {max(ts):.3f})")
        print(f"# auto / workers=1: {med['auto'] / med['workers=1']:.2f}x; auto / floor: "
              f"{med['auto'] / med['floor']:.2f}x; load average {os.getloadavg()[0]:.1f}")
    finally:
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
