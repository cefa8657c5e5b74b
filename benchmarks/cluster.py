"""Cluster benchmark: GEMM and randomized SVD on a 2-worker ``LocalCluster``, data in S3 or on disk.

Usage::

    python benchmarks/cluster.py [--m 3000] [--k 1500] [--n 1000] [--rank 20] [--memory 256MiB]

A loopback S3 API server (moto, on 127.0.0.1) holds the same zarr inputs as a local folder. Each
operation runs on a process-based ``LocalCluster(n_workers=2, threads_per_worker=1)``, with blocklin
and with dask.array on the same store: ``A @ B`` written to zarr, and ``svd_compressed`` (Halko,
Martinsson and Tropp 2011, the same algorithm as blocklin's ``method="rsvd"``) with its ``U`` written
to zarr. A small warm-up job on each store comes first (imports and connections on the workers).
Printed per operation: seconds, and for S3 the requests the server answered (by method) and the
bytes it received and sent; the chunk counts of A and B are printed for comparison.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import shutil
import tempfile
import threading
import time


class CountingS3:
    """moto's S3 server on 127.0.0.1, counting requests and bytes through a WSGI middleware."""

    def __init__(self) -> None:
        from moto.moto_server.threaded_moto_server import ThreadedMotoServer
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
        from werkzeug.serving import make_server

        self.requests: collections.Counter = collections.Counter()
        self.bytes_in = 0
        self.bytes_out = 0
        self._lock = threading.Lock()
        app = DomainDispatcherApplication(create_backend_app)
        self._server = make_server("127.0.0.1", 0, self._wrap(app), True, request_handler=MotoRequestHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        del ThreadedMotoServer  # the same server moto's ThreadedMotoServer starts, with the counter around it
        host, port = self._server.server_address[:2]
        self.options = {"key": "bench", "secret": "bench", "endpoint_url": f"http://{host}:{port}"}

    def _wrap(self, app):
        def counted(environ, start_response):
            with self._lock:
                self.requests[environ["REQUEST_METHOD"]] += 1
                self.bytes_in += int(environ.get("CONTENT_LENGTH") or 0)
            for part in app(environ, start_response):
                with self._lock:
                    self.bytes_out += len(part)
                yield part
        return counted

    def snapshot(self) -> tuple:
        with self._lock:
            return dict(self.requests), self.bytes_in, self.bytes_out

    def delta(self, before: tuple) -> dict:
        now = self.snapshot()
        req = {k: now[0].get(k, 0) - before[0].get(k, 0) for k in now[0]}
        return {"requests": sum(req.values()), "by_method": {k: v for k, v in req.items() if v},
                "bytes_received": now[1] - before[1], "bytes_sent": now[2] - before[2]}

    def stop(self) -> None:
        self._server.shutdown()
        self._thread.join()


def _operations(root: str, so: dict | None, tmp: str, args, client) -> dict:
    """The four measured operations on the store at ``root``."""
    import dask.array as da

    import blocklin

    ch = args.chunk

    def bl_gemm():
        c = blocklin.matmul(f"{root}/A.zarr", f"{root}/B.zarr", f"{root}/C-bl.zarr", memory=args.memory,
                            storage_options=so, temp_dir=tmp, overwrite=True, scheduler=client)
        return {"tasks": c.report["tasks"], "bytes_read": c.report["bytes_read"],
                "bytes_written": c.report["bytes_written"]}

    def dask_gemm():
        A = da.from_zarr(f"{root}/A.zarr", storage_options=so)
        B = da.from_zarr(f"{root}/B.zarr", storage_options=so)
        (A @ B).to_zarr(f"{root}/C-dask.zarr", storage_options=so, overwrite=True)

    def bl_rsvd():
        r = blocklin.svd(f"{root}/A.zarr", args.rank, method="rsvd", power_iters=1, seed=0,
                         out=f"{root}/svd-bl.zarr", memory=args.memory, storage_options=so,
                         temp_dir=tmp, overwrite=True, scheduler=client)
        return {"passes": r.report["passes"], "bytes_read": r.report["bytes_read"]}

    def dask_rsvd():
        A = da.from_zarr(f"{root}/A.zarr", storage_options=so)
        u, s, _v = da.linalg.svd_compressed(A, args.rank, n_power_iter=1, seed=0)
        u.rechunk((ch, args.rank)).to_zarr(f"{root}/U-dask.zarr", storage_options=so, overwrite=True)
        s.compute()

    return {"bl_gemm": bl_gemm, "dask_gemm": dask_gemm, "bl_rsvd": bl_rsvd, "dask_rsvd": dask_rsvd}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=3000)
    ap.add_argument("--k", type=int, default=1500)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--rank", type=int, default=20)
    ap.add_argument("--chunk", type=int, default=500)
    ap.add_argument("--memory", default="256MiB")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import logging

    import dask.array as da
    import numpy as np
    import s3fs
    from distributed import Client, LocalCluster

    import blocklin

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    s3 = CountingS3()
    opts = s3.options
    s3fs.S3FileSystem(**opts).mkdir("bench")
    local = tempfile.mkdtemp(prefix="blocklin-cluster-bench-")
    ch = args.chunk
    rows = []
    try:
        rng = np.random.default_rng(0)
        a = rng.standard_normal((args.m, args.k))
        b = rng.standard_normal((args.k, args.n))
        roots = {"s3": "s3://bench", "local": local}
        for root in roots.values():
            blocklin.from_array(a, f"{root}/A.zarr", chunks=(ch, ch), storage_options=opts)
            blocklin.from_array(b, f"{root}/B.zarr", chunks=(ch, ch), storage_options=opts)
        chunks_a = math.ceil(args.m / ch) * math.ceil(args.k / ch)
        chunks_b = math.ceil(args.k / ch) * math.ceil(args.n / ch)
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                          dashboard_address=None) as cluster, Client(cluster) as client:
            for where, root in roots.items():
                so = opts if where == "s3" else None
                tmp = f"{root}/tmp"
                if where == "local":
                    os.makedirs(tmp, exist_ok=True)

                def measure(label, fn, where=where):
                    before = s3.snapshot()
                    t0 = time.perf_counter()
                    extra = fn() or {}
                    secs = time.perf_counter() - t0
                    row = {"store": where, "op": label, "seconds": round(secs, 2), **extra}
                    if where == "s3":
                        row.update(s3.delta(before))
                    rows.append(row)

                ops = _operations(root, so, tmp, args, client)
                # Warm-up (not measured): imports, filesystem instances and connections on each worker.
                w = blocklin.matmul(f"{root}/B.zarr", f"{root}/B.zarr", trans_b=True, storage_options=so,
                                    temp_dir=tmp, memory=args.memory, scheduler=client)
                w.delete()
                da.from_zarr(f"{root}/B.zarr", storage_options=so).sum().compute()
                measure("gemm blocklin", ops["bl_gemm"])
                measure("gemm dask", ops["dask_gemm"])
                measure("rsvd blocklin", ops["bl_rsvd"])
                measure("rsvd dask", ops["dask_rsvd"])
                c1 = blocklin.open(f"{root}/C-bl.zarr", storage_options=so).to_numpy()
                c2 = da.from_zarr(f"{root}/C-dask.zarr", storage_options=so).compute()
                assert np.allclose(c1, c2, rtol=0, atol=1e-9 * args.k), "GEMM results differ"
    finally:
        shutil.rmtree(local, ignore_errors=True)
        s3.stop()
    info = {"shape_a": [args.m, args.k], "shape_b": [args.k, args.n], "chunk": ch, "rank": args.rank,
            "chunks_a": chunks_a, "chunks_b": chunks_b, "memory": args.memory, "rows": rows}
    if args.json:
        print(json.dumps(info, indent=1))
        return
    print(f"A {args.m} x {args.k}, B {args.k} x {args.n}, chunks {ch} x {ch} (A: {chunks_a} chunks, B: "
          f"{chunks_b}), rank {args.rank}, memory={args.memory}, 2 workers x 1 thread")
    print(f"{'store':<6} {'operation':<14} {'seconds':>8} {'requests':>9} {'GET':>6} {'PUT':>6} {'MB in':>8} "
          f"{'MB out':>8}")
    for r in rows:
        bm = r.get("by_method", {})
        print(f"{r['store']:<6} {r['op']:<14} {r['seconds']:>8.2f} {r.get('requests', '-'):>9} "
              f"{bm.get('GET', '-'):>6} {bm.get('PUT', '-'):>6} "
              f"{r.get('bytes_received', 0) / 1e6 if 'bytes_received' in r else float('nan'):>8.1f} "
              f"{r.get('bytes_sent', 0) / 1e6 if 'bytes_sent' in r else float('nan'):>8.1f}")


if __name__ == "__main__":
    main()
