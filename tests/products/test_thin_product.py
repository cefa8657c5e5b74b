"""Thin products (``op(B)`` of at most ``THIN_MAX_COLUMNS`` columns) as one row pass, against NumPy.

Tolerances are componentwise: a dot product of length ``k`` computed in any order satisfies
``|fl(a . b) - a . b| <= gamma_k |a| . |b|`` (Higham, *Accuracy and Stability of Numerical
Algorithms*, 2nd ed., eq. 3.5), ``gamma_k = k u / (1 - k u)``; ``alpha`` and ``beta c`` add two
roundings more, so ``|F - F_ref| <= gamma_{k+2} (|alpha| |A| |B| + |beta| |C|)``, on any BLAS and
any split of the rows into calls.
"""

from __future__ import annotations

import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import NonFiniteError
from blocklin.linalg.products.thin import THIN_MAX_COLUMNS
from blocklin.plan.thin import ThinPlan


def _gamma(dtype, k: int) -> float:
    u = np.finfo(np.dtype(dtype)).eps / 2
    return k * u / (1 - k * u)


def _randn(rng, shape, dtype):
    x = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def _check(got, a, b, c, alpha, beta, dtype):
    a64, b64 = a.astype(np.complex128), b.astype(np.complex128)
    ref = alpha * (a64 @ b64) + (beta * c.astype(np.complex128) if c is not None else 0)
    bound = _gamma(dtype, a.shape[1] + 2) * (abs(alpha) * (np.abs(a64) @ np.abs(b64))
                                               + (abs(beta) * np.abs(c) if c is not None else 0))
    # complex products: each real multiply-add pair rounds as two real dot products (a factor 2 in gamma)
    bound = bound * (2 if np.dtype(dtype).kind == "c" else 1)
    assert got.dtype == np.dtype(dtype)
    assert np.all(np.abs(got - ref) <= bound), float(np.max(np.abs(got - ref) / np.maximum(bound, 1e-300)))


@pytest.mark.parametrize("dtype", ["float64", "float32", "complex128"])
@pytest.mark.parametrize("n", [1, 4, 17, THIN_MAX_COLUMNS])
def test_thin_route_matches_numpy(tmp_path, rng, dtype, n):
    a = _randn(rng, (3001, 300), dtype)
    b = _randn(rng, (300, n), dtype)
    res = bl.matmul(a, b, tmp_path / "f.zarr", memory="4MiB")
    assert res.report["route"] == "rows" and res.report["plan"]["route"] == "rows"
    assert res.report["plan"]["pass_plan"]["strip"] < a.shape[0]  # streamed, several strips
    _check(res.to_numpy(), a, b, None, 1.0, 0.0, dtype)


@pytest.mark.parametrize("trans_b", [False, True])
def test_thin_route_alpha_beta_c_and_trans_b(tmp_path, rng, trans_b):
    a = rng.standard_normal((2500, 257))
    b = rng.standard_normal((257, 9))
    c = rng.standard_normal((2500, 9))
    res = bl.matmul(a, b.T.copy() if trans_b else b, tmp_path / "f.zarr", c=c, alpha=-1.5, beta=0.25,
                    trans_b=trans_b, memory="1MiB")
    assert res.report["route"] == "rows"
    _check(res.to_numpy(), a, b, c, -1.5, 0.25, "float64")


def test_trans_a_keeps_the_tiles(tmp_path, rng):
    """``A^T B`` sums over ``A``'s rows (the tiles' k-panels stream them): no thin route."""
    a = rng.standard_normal((2500, 40))
    b = rng.standard_normal((2500, 3))
    res = bl.matmul(a, b, tmp_path / "f.zarr", trans_a=True, memory="1MiB")
    assert "route" not in res.report
    _check(res.to_numpy(), a.T, b, None, 1.0, 0.0, "float64")


def test_thin_route_same_bits_on_every_scheduler(tmp_path, rng):
    a = bl.from_array(rng.standard_normal((4096, 512)), tmp_path / "a.zarr", chunks=(256, 512))
    b = rng.standard_normal((512, 8))
    got = [bl.matmul(a, b, memory="2MiB", scheduler=s).to_numpy() for s in ("sync", "threads", "processes")]
    assert np.array_equal(got[0], got[1]) and np.array_equal(got[0], got[2])
    _check(got[0], a.to_numpy(), b, None, 1.0, 0.0, "float64")


def test_wide_products_and_asked_chunks_keep_the_tiles(tmp_path, rng):
    a = rng.standard_normal((600, 100))
    b = rng.standard_normal((100, THIN_MAX_COLUMNS + 1))
    assert "route" not in bl.matmul(a, b, memory="1MiB").report  # GEMM tiles
    assert bl.matmul_plan(a, b, memory="1MiB").grid[1] >= 1
    res = bl.matmul(a, b[:, :4], memory="1MiB", out_chunks=(100, 4))
    assert "route" not in res.report
    _check(res.to_numpy(), a, b[:, :4], None, 1.0, 0.0, "float64")
    # mixed precision is computed by the tiles (they cast), the thin route reads the operands' dtype
    assert "route" not in bl.matmul(a, b[:, :4], memory="1MiB", precision="float32").report


def test_plan_explain_and_cli(tmp_path, rng, capsys):
    from blocklin.cli.main import main

    a = bl.from_array(rng.standard_normal((5000, 300)), tmp_path / "a.zarr", chunks=(500, 300))
    b = bl.from_array(rng.standard_normal((300, 3)), tmp_path / "b.zarr", chunks=(300, 3))
    plan = bl.matmul_plan(a, b, memory="4MiB")
    assert isinstance(plan, ThinPlan) and plan.route == "rows"
    assert plan.flops == 2 * 5000 * 300 * 3 and plan.peak_memory <= plan.memory
    assert "thin product" in plan.explain() and "one row pass" in plan.explain()
    out = str(tmp_path / "f.zarr")
    assert main(["gemm", str(a.path), str(b.path), "-o", out, "--explain", "--memory", "4MiB"]) == 0
    assert "thin product" in capsys.readouterr().out
    assert main(["gemm", str(a.path), str(b.path), "-o", str(tmp_path / "f.zarr"), "--memory", "4MiB"]) == 0
    _check(bl.open(tmp_path / "f.zarr").to_numpy(), a.to_numpy(), b.to_numpy(), None, 1.0, 0.0, "float64")


@pytest.mark.parametrize("where", ["a", "b", "c"])
def test_thin_route_refuses_non_finite_input_naming_it(tmp_path, rng, where):
    x = {"a": rng.standard_normal((3000, 300)), "b": rng.standard_normal((300, 5)), "c": rng.standard_normal((3000, 5))}
    x[where][2999 if where != "b" else 7, 3] = np.nan
    with pytest.raises(NonFiniteError, match=rf"^{where}: must be finite"):
        bl.matmul(x["a"], x["b"], tmp_path / "f.zarr", c=x["c"], beta=1.0, memory="2MiB")
    assert not (tmp_path / "f.zarr").exists()
    res = bl.matmul(x["a"], x["b"], tmp_path / "f.zarr", c=x["c"], beta=1.0, memory="2MiB", check_finite=False)
    assert res.report["route"] == "rows" and np.isnan(res.to_numpy()).any()


def test_thin_route_resume_reproduces_a_fresh_run_or_refuses(tmp_path, rng):
    from blocklin.linalg.products import thin

    a_np = rng.standard_normal((4000, 300))
    a = bl.from_array(a_np, tmp_path / "a.zarr", chunks=(500, 300))
    b = rng.standard_normal((300, 6))
    out = tmp_path / "f.zarr"
    real = thin.thin_kernel
    calls = {"n": 0}

    def flaky(*args, **kwargs):  # killed after some strips were written
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("simulated kill")
        return real(*args, **kwargs)

    flaky.__dict__.update(real.__dict__)  # the kernel's declarations (memory, init, device)
    thin.thin_kernel = flaky
    try:
        with pytest.raises(KeyboardInterrupt):
            bl.matmul(a, b, out, memory="1MiB", scheduler="sync", resume=True)
    finally:
        thin.thin_kernel = real
    assert calls["n"] == 3 and not out.exists()
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".f.zarr.partial-")]
    # the input changed since: the resumed run is today's product, never old rows mixed in
    a_np[10] += 1.0
    bl.from_array(a_np, tmp_path / "a.zarr", chunks=(500, 300), overwrite=True)
    res = bl.matmul(tmp_path / "a.zarr", b, out, memory="1MiB", scheduler="sync", resume=True)
    assert res.report["route"] == "rows"
    assert np.array_equal(res.to_numpy(), bl.matmul(tmp_path / "a.zarr", b, memory="1MiB", scheduler="sync").to_numpy())
    _check(res.to_numpy(), a_np, b, None, 1.0, 0.0, "float64")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".f.zarr.partial-")]


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_thin_route_on_an_object_store(s3, tmp_path, rng, codec):
    """``A`` and the output on the loopback S3 server: the same route (range requests for uncompressed
    chunks, decoded chunks for zstd), within the bound, and the bits of the same plan over local files."""
    base, opts = s3
    x = rng.standard_normal((6000, 256))
    b = rng.standard_normal((256, 3))
    remote = bl.from_array(x, f"{base}/a.zarr", chunks=(1000, 256), codec=codec, storage_options=opts)
    local = bl.from_array(x, tmp_path / "a.zarr", chunks=(1000, 256), codec=codec)
    got = bl.matmul(remote, b, f"{base}/f.zarr", memory="16MiB", storage_options=opts)
    assert got.report["route"] == "rows"
    _check(got.to_numpy(), x, b, None, 1.0, 0.0, "float64")
    here = bl.matmul(local, b, tmp_path / "f.zarr", memory="16MiB")
    if here.report["plan"]["pass_plan"]["strip"] == got.report["plan"]["pass_plan"]["strip"]:
        assert np.array_equal(here.to_numpy(), got.to_numpy())
