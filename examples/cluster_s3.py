"""A cluster job with its data in S3: GEMM and SVD read from and write to ``s3://``.

Usage::

    python examples/cluster_s3.py                                   # self-contained, on loopback
    python examples/cluster_s3.py --scheduler tcp://host:8786 --bucket s3://my-bucket/blocklin \\
        --storage-option key=... --storage-option secret=...       # a real cluster and bucket

Without ``--scheduler`` it starts a loopback S3 API server (moto, on 127.0.0.1, dummy credentials)
and a process-based ``LocalCluster`` of two workers, so it runs anywhere with
``pip install 'blocklin[s3]' 'moto[server]'``. The workers read the inputs from the bucket, write
the outputs there, and keep their intermediates under ``BUCKET/tmp`` (a temp dir every worker
reaches; blocklin checks that before the job starts). An interrupted job is completed by rerunning
it with ``resume=True``. ``BLOCKLIN_EXAMPLE_SIZE=small`` runs a smaller version (the test suite does).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time

import numpy as np

import blocklin
from blocklin.config import format_size
from blocklin.storage.location import storage_options_from_items


@contextlib.contextmanager
def loopback_s3():
    """moto's S3 server on 127.0.0.1 with a bucket; yields ``(bucket_url, storage_options)``."""
    import logging

    import s3fs
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    options = {"key": "example", "secret": "example", "endpoint_url": f"http://{host}:{port}"}
    s3fs.S3FileSystem(**options).mkdir("example")
    try:
        yield "s3://example", options
    finally:
        server.stop()


def within_budget(what: str, op, want: int):
    """``op(memory=want)``, or at the smallest budget its planner accepts when ``want`` cannot hold its
    tiles: the planner refuses before anything is written and names a minimum checked to suffice
    (``BudgetError.minimum``), so the budget follows the plan, whatever the chunks and the backend."""
    try:
        return op(memory=want), want
    except blocklin.errors.BudgetError as exc:
        print(f"{what}: {format_size(want)} cannot hold the plan's tiles; the planner's minimum is "
              f"{format_size(exc.minimum)}")
        return op(memory=exc.minimum), exc.minimum


def run(client, bucket: str, options: dict) -> bool:
    small = os.environ.get("BLOCKLIN_EXAMPLE_SIZE") == "small"
    m, n, k = (1200, 300, 200) if small else (8000, 1000, 600)
    rng = np.random.default_rng(0)
    # Decaying spectrum plus noise: the kind of matrix a truncated SVD is for.
    a = (rng.standard_normal((m, 30)) * 0.7 ** np.arange(30)) @ rng.standard_normal((30, n))
    a += 0.01 * rng.standard_normal(a.shape)
    # Each worker's budget: a quarter of A (no task holds A whole), but no less than 16 MiB (tasks on
    # smaller strips spend their time on the object store's per-request latency), or what the plan
    # needs when that is more: reads from an object store decode whole chunks, so the chunks set a floor.
    want = max(a.nbytes // 4, 16 * 2**20)
    ok = True
    with blocklin.config.set(storage_options=options, temp_dir=f"{bucket}/tmp", scheduler=client):
        # 1. Data in: A from this process's memory; B drawn by the workers, chunk row by chunk row.
        A = blocklin.from_array(a, f"{bucket}/A.zarr", chunks=(m // 8, n // 2), overwrite=True)
        blocklin.random(f"{bucket}/B.zarr", (n, k), seed=1, chunks=(n // 2, k), overwrite=True)
        print(f"A {A.shape} chunks {A.chunks} at {A.path}, B ({n}, {k}) at {bucket}/B.zarr (written by the "
              f"workers); budget per worker {format_size(want)}")

        # 2. GEMM on the workers, output in the bucket; resume=True completes an interrupted run.
        C, used = within_budget("gemm", lambda memory: blocklin.matmul(
            A, f"{bucket}/B.zarr", f"{bucket}/C.zarr", memory=memory, overwrite=True, resume=True), want)
        b = blocklin.open(f"{bucket}/B.zarr").to_numpy()
        # Higham's bound for dot products of length n: |error| <= 2 gamma_n (|A| @ |B|).
        eps = np.finfo(np.float64).eps
        bound = 2 * n * eps / (1 - n * eps) * (np.abs(a) @ np.abs(b))
        ratio = float(np.max(np.abs(C.to_numpy() - a @ b) / bound))
        ok &= ratio <= 1.0
        print(f"check: C = A @ B within the rounding-error bound ({ratio:.2g} of it): {ratio <= 1.0}")
        plan = C.report["plan"]
        print(f"cost: {C.report['seconds']:.2f} s, {C.report['tasks']} tasks on {C.report['scheduler']}, planned "
              f"peak {format_size(plan['peak_memory'])} of {format_size(used)} per worker")

        # 3. Truncated SVD, factors in the bucket.
        res, used = within_budget("svd", lambda memory: blocklin.svd(
            A, 5, out=f"{bucket}/svd.zarr", memory=memory, overwrite=True, seed=0), want)
        U, s, Vt = res
        ref = np.linalg.svd(a, compute_uv=False)[:5]
        rel = float(np.max(np.abs(s - ref) / ref))
        ok &= rel <= 1e-6
        print(f"check: top singular values {np.round(s, 3)} match NumPy's to {rel:.1e}: {rel <= 1e-6}")
        print(f"cost: {res.report['seconds']:.2f} s, {res.report['passes']} passes over A ({res.report['method']}), "
              f"budget {format_size(used)} per worker")
        print(f"U {U.shape} at {U.path}; temp dir {bucket}/tmp left empty: "
              f"{not blocklin.storage.backend(blocklin.storage.as_location(f'{bucket}/tmp')).keys('')}")
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scheduler", help="address of a running Dask scheduler (tcp://host:8786)")
    ap.add_argument("--bucket", help="URL prefix the workers can reach (s3://bucket/prefix)")
    ap.add_argument("--storage-option", action="append", metavar="KEY=VALUE", default=[])
    args = ap.parse_args()
    from distributed import Client, LocalCluster

    if args.scheduler:
        if not args.bucket:
            ap.error("--bucket is required with --scheduler")
        with Client(args.scheduler) as client:
            ok = run(client, args.bucket.rstrip("/"), storage_options_from_items(args.storage_option))
    else:
        # The workers' scratch space goes in a folder removed at the end.
        import dask

        with tempfile.TemporaryDirectory() as scratch, dask.config.set({"temporary-directory": scratch}), \
                loopback_s3() as (bucket, options), LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                             dashboard_address=None, local_directory=scratch) as cluster, Client(cluster) as client:
            ok = run(client, bucket, options)
            # The workers leave before the scheduler closes: a worker whose heartbeat meets a closing
            # scheduler logs a (harmless) traceback.
            cluster.scale(0)
            deadline = time.monotonic() + 30
            while client.scheduler_info()["workers"] and time.monotonic() < deadline:
                time.sleep(0.1)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
