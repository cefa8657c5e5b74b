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
it with ``resume=True``.
"""

from __future__ import annotations

import argparse
import contextlib

import numpy as np

import blocklin
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


def run(client, bucket: str, options: dict) -> None:
    rng = np.random.default_rng(0)
    # Decaying spectrum plus noise: the kind of matrix a truncated SVD is for.
    a = (rng.standard_normal((4000, 30)) * 0.7 ** np.arange(30)) @ rng.standard_normal((30, 600))
    a += 0.01 * rng.standard_normal(a.shape)
    b = rng.standard_normal((600, 300))
    with blocklin.config.set(storage_options=options, temp_dir=f"{bucket}/tmp", scheduler=client):
        A = blocklin.from_array(a, f"{bucket}/A.zarr", chunks=(500, 300), overwrite=True)
        blocklin.random(f"{bucket}/B.zarr", b.shape, seed=1, chunks=(300, 300), overwrite=True)  # by the workers
        C = blocklin.matmul(A, f"{bucket}/B.zarr", f"{bucket}/C.zarr", memory="64MiB", overwrite=True, resume=True)
        B = blocklin.open(f"{bucket}/B.zarr").to_numpy()
        err = np.abs(C.to_numpy() - a @ B).max()
        print(f"GEMM {C.shape} -> {C.path}: {C.report['seconds']:.2f} s, {C.report['tasks']} tasks, "
              f"max error vs NumPy {err:.1e}")
        U, s, Vt = blocklin.svd(A, 5, out=f"{bucket}/svd.zarr", memory="64MiB", overwrite=True, seed=0)
        ref = np.linalg.svd(a, compute_uv=False)[:5]
        print(f"SVD top singular values {np.round(s, 3)} (NumPy {np.round(ref, 3)}), U at {U.path}")


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
            run(client, args.bucket.rstrip("/"), storage_options_from_items(args.storage_option))
        return
    with loopback_s3() as (bucket, options), \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                         dashboard_address=None) as cluster, Client(cluster) as client:
        run(client, bucket, options)


if __name__ == "__main__":
    main()
