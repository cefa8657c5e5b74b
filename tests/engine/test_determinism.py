"""Bitwise determinism: every operation gives the same bits on sync, threads, processes and a LocalCluster.

One small problem per operation, out of core (budgets of a few hundred KiB, so every operation
streams and splits its work into several tasks), in float32 and float64. The reference is the
``sync`` scheduler (the in-order executor); the others must match it bit for bit, not to a
tolerance: the plans, and so every floating-point sum, may not depend on the scheduler
(``docs/engine.md``, "Determinism").
"""

from __future__ import annotations

import numpy as np
import pytest

import blocklin as bl

distributed = pytest.importorskip("distributed")

SCHEDULERS = ("threads", "processes", "cluster")
DTYPES = (np.float32, np.float64)


def _dense(x):
    if isinstance(x, bl.Matrix):
        return x.to_numpy()
    return np.asarray(x)


def _arrays(result):
    """Every array of a result (tuples, Matrix, PCA attributes), in a fixed order."""
    if hasattr(result, "components_"):
        return [result.components_, result.explained_variance_, result.singular_values_, result.mean_]
    if isinstance(result, tuple):
        return [_dense(x) for x in result]
    return [_dense(result)]


def _data(tmp_path, dtype):
    rng = np.random.default_rng(11)
    m, n = 600, 48
    tall = (rng.standard_normal((m, n)) * np.logspace(0, -2, n) + 3.0).astype(dtype)
    sq = rng.standard_normal((96, 96))
    spd = (sq @ sq.T / 96 + np.eye(96)).astype(dtype)
    return {
        "tall": bl.from_array(tall, tmp_path / f"tall-{np.dtype(dtype).name}.zarr", chunks=(64, 48)),
        "b": bl.from_array(rng.standard_normal((m, 2)).astype(dtype), tmp_path / f"b-{np.dtype(dtype).name}.zarr",
                           chunks=(64, 2)),
        "sq": bl.from_array(sq.astype(dtype), tmp_path / f"sq-{np.dtype(dtype).name}.zarr", chunks=(32, 32)),
        "spd": bl.from_array(spd, tmp_path / f"spd-{np.dtype(dtype).name}.zarr", chunks=(32, 32)),
        "other": bl.from_array(rng.standard_normal((48, 40)).astype(dtype),
                               tmp_path / f"o-{np.dtype(dtype).name}.zarr", chunks=(16, 16)),
    }


OPERATIONS = {
    "gemm": lambda d, out, s: bl.matmul(d["tall"], d["other"], out / "c.zarr", memory="256KiB", **s),
    "svd-rsvd": lambda d, out, s: bl.svd(d["tall"], 4, method="rsvd", seed=1, memory="160KiB", **s),
    "svd-sketch": lambda d, out, s: bl.svd(d["tall"], 4, method="sketch", seed=1, memory="200KiB", **s),
    "svd-lanczos": lambda d, out, s: bl.svd(d["tall"], 4, method="lanczos", seed=1, memory="256KiB", **s),
    # the Gram route's SYRK pass in two tasks (their 48 x 48 sums within an eighth of the budget)
    "svd-gram": lambda d, out, s: bl.svd(d["tall"], 4, method="gram", seed=1, memory="400KiB", **s),
    "gram": lambda d, out, s: bl.gram(d["tall"], out / "g.zarr", memory="400KiB", **s),
    "svd-centered": lambda d, out, s: bl.svd(d["tall"], 4, center=True, seed=1, memory="300KiB", **s),
    "eigsh": lambda d, out, s: bl.eigsh(d["spd"], 3, seed=1, memory="420KiB", order="descending", **s),
    "pca": lambda d, out, s: bl.pca(d["tall"], 4, seed=1, memory="300KiB", **s),
    # 320 KiB: the whole call plans the streaming QR that method="auto" may switch to (282 KiB here)
    "solve": lambda d, out, s: bl.solve(d["tall"], d["b"], lam=0.1, memory="320KiB", **s),
    # the Gram matrix over the budget: SYRK blocks, tiled Cholesky, out-of-core solves
    "solve-stored-gram": lambda d, out, s: bl.solve(d["sq"], d["spd"][:, :2], lam=1.0, memory="180KiB", **s),
    "inv": lambda d, out, s: bl.inv(d["spd"], out=out / "inv.zarr", memory="96KiB", **s),
    "cholesky": lambda d, out, s: bl.cholesky(d["spd"], out / "chol.zarr", memory="96KiB", **s),
    "lu": lambda d, out, s: bl.lu(d["sq"], out / "lu.zarr", memory="128KiB", **s),
}


@pytest.mark.slow  # 22 cases x 4 schedulers: about 2 minutes on 2 quiet cores
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", list(OPERATIONS))
def test_same_bits_on_every_scheduler(tmp_path, client, name, dtype):
    data = _data(tmp_path, dtype)
    op = OPERATIONS[name]
    ref_dir = tmp_path / "sync"
    ref_dir.mkdir()
    ref = [np.array(x) for x in _arrays(op(data, ref_dir, {"scheduler": "sync"}))]
    for sched in SCHEDULERS:
        out = tmp_path / sched
        out.mkdir()
        settings = {"scheduler": client if sched == "cluster" else sched}
        got = _arrays(op(data, out, settings))
        assert len(got) == len(ref)
        for i, (g, r) in enumerate(zip(got, ref)):
            assert g.dtype == r.dtype
            # bit for bit: the same floating-point operations in the same order
            assert np.array_equal(g, r), (f"{name} {np.dtype(dtype).name} on {sched}: output {i} differs by "
                                          f"{np.max(np.abs(g.astype(np.float64) - r)):.3e} from sync")
