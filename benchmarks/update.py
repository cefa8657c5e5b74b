"""Growing data: ``blocklin.update`` after ``blocklin.append`` against recomputing, in one run.

A tall float32 matrix (rank-40 signal with decaying scales plus noise, column means of 1) and a
response ``b`` (a linear model of its columns plus noise) are stored; the Gram ``A^T A``, the
k-component PCA and a ridge regression with an intercept and lambda by GCV (both
``updatable=True``) computed; then 1% more rows are appended to ``A`` and ``b`` and each result is
brought up to date by ``blocklin.update`` and recomputed on the grown data with the same call
(``blocklin.gram``; ``blocklin.pca`` and ``blocklin.solve`` without ``updatable``, what a user
reruns). It prints the seconds of each, the update's share of the recompute's time, the agreement
(Gram: ``||G_update - G_recompute||_F`` over the Gram's rounding bound ``2 m eps ||A||_F^2``; ridge:
the chosen lambdas and ``||x_update - x_recompute|| / ||x_recompute||``; PCA:
the largest relative difference of the singular values and the sine of the largest principal angle
between the components, of the update and of the recompute, each against the exact ones from the
centered Gram in float64 (NumPy, two plain passes), and the update's worst reported residual; the
single-pass sketch, ``svd(method="sketch", updatable=True)``: its singular values against a recompute
with the same seed, relative to ``s_1``, which only the order of its sums separates), then ``--days`` further appends
of 0.1% each with an update after each (how each update was made: scores rotated, written from
every row, or recomputed), and one JSON line last.

Usage::

    python benchmarks/update.py                          # 2000000 x 500 float32 (4 GB), k = 20
    python benchmarks/update.py --rows 200000 --days 5   # a quicker run
    python benchmarks/update.py --quick                  # seconds: a check of the script itself

"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import blocklin as bl  # noqa: E402

#: Every key of the JSON line.
FIELDS = ("shape", "appended", "k", "memory", "seconds", "update_share", "gram_agreement", "ridge_agreement",
          "pca_agreement", "sketch_agreement", "days")
RANK = 40


def _rows(seed: int, p: int, n: int) -> np.ndarray:
    """``p`` rows of the test distribution (deterministic in ``seed``)."""
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(np.random.default_rng(12345).standard_normal((n, RANK)))[0]
    signal = (rng.standard_normal((p, RANK)) * np.logspace(1.5, 0, RANK)) @ basis.T
    return (signal + 0.1 * rng.standard_normal((p, n)) + 1.0).astype(np.float32)


def _response(x: np.ndarray) -> np.ndarray:
    """``b`` of rows ``x``: a fixed linear model of the columns, an offset and noise (seeded by the rows)."""
    w = np.random.default_rng(777).standard_normal((x.shape[1], 1)).astype(np.float32)
    noise = np.random.default_rng(int(abs(float(x[0, 0])) * 1e6) % (2**32)).standard_normal((x.shape[0], 1))
    return (x @ w + 2.0 + noise).astype(np.float32)


def _store(path: Path, m: int, n: int, block: int) -> None:
    import dask.array as da

    starts = list(range(0, m, block))
    chunks = (tuple(min(block, m - s) for s in starts), (n,))
    x = da.map_blocks(lambda blk, block_info=None: _rows(block_info[None]["chunk-location"][0], blk.shape[0], n),
                      da.zeros((m, n), chunks=chunks, dtype=np.float32), dtype=np.float32)
    bl.from_array(x, path, chunks=(block, n), scheduler="threads")
    y = da.map_blocks(_response, x, chunks=(chunks[0], (1,)), dtype=np.float32)
    bl.from_array(y, path.with_name("b.zarr"), chunks=(block, 1), scheduler="threads")


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def _angle(v1: np.ndarray, v2: np.ndarray) -> float:
    """Sine of the largest principal angle between the row spaces of ``v1`` and ``v2``: the 2-norm of
    the part of one orthonormal basis outside the other (``sqrt(1 - cos^2)`` would turn the rounding
    of float32 components into a sine of ``sqrt(eps)``)."""
    q1 = np.linalg.qr(v1.astype(np.float64).T)[0]
    q2 = np.linalg.qr(v2.astype(np.float64).T)[0]
    return float(np.linalg.norm(q1 - q2 @ (q2.T @ q1), 2))


def _exact_pca(a: Path, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The reference: singular values and components of the centered matrix from its centered Gram
    in float64, by NumPy in two plain passes (the means, then the deviations' Gram)."""
    x = bl.open(a)
    m, n = x.shape
    step = max(1, (256 << 20) // (8 * n))
    mean = sum(x[r:r + step].astype(np.float64).sum(axis=0) for r in range(0, m, step)) / m
    g = np.zeros((n, n))
    for r in range(0, m, step):
        d = x[r:r + step].astype(np.float64) - mean
        g += d.T @ d
    lam, v = np.linalg.eigh(g)
    return np.sqrt(np.maximum(lam[::-1][:k], 0)), v[:, ::-1][:, :k].T


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--cols", type=int, default=500)
    p.add_argument("-k", type=int, default=20)
    p.add_argument("--memory", default="2GiB")
    p.add_argument("--days", type=int, default=30, help="further appends of 0.1%% each, updated after each")
    p.add_argument("--dir", help="where the matrices go (default: a temp dir, removed)")
    p.add_argument("--quick", action="store_true", help="20000 x 100, k = 5, 3 days")
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.cols, args.k, args.days, args.memory = 20000, 100, 5, 3, "256MiB"
    m, n, k = args.rows, args.cols, args.k
    root = Path(args.dir or tempfile.mkdtemp(prefix="blocklin-update-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    kw = dict(memory=args.memory)
    try:
        a = root / "A.zarr"
        _, t_store = _timed(lambda: _store(a, m, n, max(1, min(m, (64 << 20) // (4 * n)))))
        print(f"stored {m} x {n} float32 ({m * n * 4 / 1e9:.2f} GB) in {t_store:.1f} s")
        _, t_gram0 = _timed(lambda: bl.gram(a, root / "G.zarr", **kw))
        _, t_pca0 = _timed(lambda: bl.pca(a, k, out=root / "P.zarr", updatable=True, **kw))
        b = root / "b.zarr"
        ridge = dict(lam="gcv", fit_intercept=True, **kw)
        _, t_ridge0 = _timed(lambda: bl.solve(a, b, out=root / "x.zarr", updatable=True, **ridge))
        sketch = dict(k=k, method="sketch", seed=0, **kw)
        _, t_sketch0 = _timed(lambda: bl.svd(a, out=root / "S.zarr", updatable=True, **sketch))
        print(f"gram {t_gram0:.2f} s, pca (updatable, k={k}) {t_pca0:.2f} s, ridge (GCV, intercept, updatable) "
              f"{t_ridge0:.2f} s, sketch (updatable) {t_sketch0:.2f} s")
        p1 = max(1, m // 100)
        new = _rows(10**6, p1, n)
        _, t_append = _timed(lambda: (bl.append(a, new, **kw), bl.append(b, _response(new), **kw)))
        g_upd, t_gram_upd = _timed(lambda: bl.update(root / "G.zarr", **kw))
        g_rec, t_gram_rec = _timed(lambda: bl.gram(a, root / "G2.zarr", **kw))
        x_upd, t_ridge_upd = _timed(lambda: bl.update(root / "x.zarr", **kw))
        x_rec, t_ridge_rec = _timed(lambda: bl.solve(a, b, **ridge))
        xr = x_rec.to_numpy().astype(np.float64)
        ridge_agree = {"lam_update": x_upd.report["lam"], "lam_recompute": x_rec.report["lam"],
                       "x_relative": float(np.linalg.norm(x_upd.to_numpy() - xr) / np.linalg.norm(xr)),
                       "intercept_update": float(np.ravel(x_upd.intercept)[0]),
                       "intercept_recompute": float(np.ravel(x_rec.intercept)[0])}
        p_upd, t_pca_upd = _timed(lambda: bl.update(root / "P.zarr", **kw))
        p_rec, t_pca_rec = _timed(lambda: bl.pca(a, k, **kw))
        s_upd, t_sketch_upd = _timed(lambda: bl.update(root / "S.zarr", **kw))
        s_rec, t_sketch_rec = _timed(lambda: bl.svd(a, **sketch))
        sketch_agree = {"s_relative": float(np.max(np.abs(s_upd.s.astype(np.float64) - s_rec.s) / s_rec.s[0])),
                        "rows_read": s_upd.report["updated"]["rows_read"], "passes": s_upd.report["passes"]}
        m1 = m + p1
        a_norm2 = sum(float(np.square(bl.open(a)[r:r + 65536].astype(np.float64)).sum()) for r in range(0, m1, 65536))
        gram_bound = 2 * m1 * np.finfo(np.float32).eps * a_norm2
        gram_ratio = float(np.linalg.norm(g_upd.to_numpy().astype(np.float64) - g_rec.to_numpy()) / gram_bound)
        s_ref, v_ref = _exact_pca(a, k)
        pca_agree = {"s_relative": float(np.max(np.abs(p_upd.s.astype(np.float64) - s_ref) / s_ref)),
                     "subspace_sine": _angle(np.asarray(p_upd.Vt), v_ref),
                     "recompute_s_relative": float(np.max(np.abs(p_rec.singular_values_ - s_ref) / s_ref)),
                     "recompute_subspace_sine": _angle(p_rec.components_, v_ref),
                     "worst_relative_residual": float(max(p_upd.report["relative_residuals"])),
                     "tol": p_upd.report.get("tol"), "how": p_upd.report["updated"]["how"],
                     "scores": p_upd.report["updated"].get("scores")}
        secs = {"store": t_store, "gram": t_gram0, "pca_updatable": t_pca0, "ridge_updatable": t_ridge0,
                "append": t_append, "gram_update": t_gram_upd, "gram_recompute": t_gram_rec,
                "ridge_update": t_ridge_upd, "ridge_recompute": t_ridge_rec, "pca_update": t_pca_upd,
                "pca_recompute": t_pca_rec, "sketch_updatable": t_sketch0, "sketch_update": t_sketch_upd,
                "sketch_recompute": t_sketch_rec}
        share = {"gram": t_gram_upd / t_gram_rec, "ridge": t_ridge_upd / t_ridge_rec, "pca": t_pca_upd / t_pca_rec,
                 "sketch": t_sketch_upd / t_sketch_rec}
        print(f"append {p1} rows to A and b: {t_append:.2f} s")
        print(f"gram: update {t_gram_upd:.2f} s, recompute {t_gram_rec:.2f} s: {share['gram']:.3f}x; "
              f"difference {gram_ratio:.2e} of the rounding bound")
        print(f"ridge: update {t_ridge_upd:.2f} s, recompute {t_ridge_rec:.2f} s: {share['ridge']:.3f}x; lambda "
              f"{ridge_agree['lam_update']:.4g} and {ridge_agree['lam_recompute']:.4g}, x differs by "
              f"{ridge_agree['x_relative']:.1e} relative")
        print(f"pca:  update {t_pca_upd:.2f} s, recompute {t_pca_rec:.2f} s: {share['pca']:.3f}x; against the "
              f"exact centered Gram's (NumPy, float64): update singular values {pca_agree['s_relative']:.1e} "
              f"relative, subspace sine {pca_agree['subspace_sine']:.1e}; recompute "
              f"{pca_agree['recompute_s_relative']:.1e}, {pca_agree['recompute_subspace_sine']:.1e}; update's worst "
              f"residual {pca_agree['worst_relative_residual']:.1e} (tol {pca_agree['tol']:.1e}); scores "
              f"{pca_agree['scores']}")
        print(f"sketch: update {t_sketch_upd:.2f} s, recompute {t_sketch_rec:.2f} s: {share['sketch']:.3f}x; singular "
              f"values differ from the recompute's (same seed) by {sketch_agree['s_relative']:.1e} of s_1")
        days = []
        for d in range(args.days):
            day = _rows(2 * 10**6 + d, max(1, m // 1000), n)
            bl.append(a, day, **kw)
            bl.append(b, _response(day), **kw)
            r, t = _timed(lambda: bl.update(root / "P.zarr", **kw))
            how = r.report["updated"]["how"]
            days.append({"seconds": t, "scores": r.report["updated"].get("scores"),
                         "recomputed": how.startswith("recomputed"),
                         "worst_relative_residual": float(max(r.report["relative_residuals"]))})
        if days:
            s_ref, v_ref = _exact_pca(a, k)
            final = bl.update(root / "P.zarr", **kw)  # current: the factors as stored
            drift = {"s_relative": float(np.max(np.abs(final.s.astype(np.float64) - s_ref) / s_ref)),
                     "subspace_sine": _angle(np.asarray(final.Vt), v_ref)}
            print(f"{len(days)} days of 0.1%: updates {np.mean([x['seconds'] for x in days]):.2f} s each, "
                  f"{sum(x['recomputed'] for x in days)} recomputed, "
                  f"{sum(x['scores'] == 'from every row' for x in days)} with the scores from every row; at the end, "
                  f"against the exact centered Gram's: singular values {drift['s_relative']:.1e}, subspace sine "
                  f"{drift['subspace_sine']:.1e}")
            days_summary = {"count": len(days), "mean_seconds": float(np.mean([x["seconds"] for x in days])),
                            "recomputed": sum(x["recomputed"] for x in days),
                            "scores_from_every_row": sum(x["scores"] == "from every row" for x in days),
                            "worst_relative_residual": max(x["worst_relative_residual"] for x in days),
                            "final_against_recompute": drift}
        else:
            days_summary = None
        print(json.dumps({"shape": [m, n], "appended": p1, "k": k, "memory": args.memory, "seconds": secs,
                          "update_share": share, "gram_agreement": gram_ratio, "ridge_agreement": ridge_agree,
                          "pca_agreement": pca_agree, "sketch_agreement": sketch_agree,
                          "days": days_summary}))
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
