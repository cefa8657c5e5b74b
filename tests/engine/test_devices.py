"""One test body per device: CPU always, GPU under the ``gpu`` marker (skipped without CUDA)."""

from __future__ import annotations

import numpy as np
import pytest

import blocklin as bl
from blocklin.device import TileStream, get_device
from blocklin.errors import DeviceError
from blocklin.device.select import gpu_available

DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,tol", [("float32", 2e-5), ("float64", 1e-13)])
def test_gemm_on_device(tmp_path, device, dtype, tol):
    rng = np.random.default_rng(11)
    a = rng.standard_normal((150, 130)).astype(dtype)
    b = rng.standard_normal((150, 90)).astype(dtype)
    c0 = rng.standard_normal((130, 90)).astype(dtype)
    res = bl.matmul(a, b, tmp_path / "c.zarr", c=c0, alpha=2.0, beta=0.5, trans_a=True, device=device,
                    memory="256KiB", device_memory="128KiB")
    assert res.dtype == np.dtype(dtype)  # no silent upcast on any device
    ref = 2.0 * a.T.astype(np.float64) @ b.astype(np.float64) + 0.5 * c0
    assert np.abs(res.to_numpy() - ref).max() / np.abs(ref).max() < tol
    assert res.report["device"] == device


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("depth", [0, 1, 3])
def test_tile_stream_order_and_reuse(device, depth):
    dev = get_device(device)
    seen = []

    def load(i, bufs):
        (buf,) = bufs
        view = buf.reshape(-1)[: (i % 3 + 1) * 4].reshape(i % 3 + 1, 4)
        view[...] = i
        return (view,)

    stream = TileStream(dev, 7, load, [(3, 4)], "float64", depth=depth)
    for i, (x,) in stream:
        # on a GPU, read through the device: x.get() would copy on the legacy stream, unordered
        # with the upload stream
        host = x if dev.host_resident else dev.download(x, slice(0, x.shape[0]))
        seen.append((i, float(host.mean()), host.shape))
    assert [s[0] for s in seen] == list(range(7))
    assert all(mean == i and shape == (i % 3 + 1, 4) for i, mean, shape in seen)
    assert stream.buffers == []  # slots handed back to the device for reuse


def test_tile_stream_propagates_loader_errors():
    def load(i, bufs):
        if i == 2:
            raise OSError("disk on fire")
        return bufs

    with pytest.raises(OSError, match="disk on fire"):
        for _ in TileStream(get_device("cpu"), 5, load, [(2, 2)], "float64", depth=1):
            pass


@pytest.mark.skipif(gpu_available(), reason="a GPU is present")
def test_gpu_requested_without_device_is_clear():
    with pytest.raises(DeviceError, match="device: 'gpu' needs CuPy and a CUDA device.*device='cpu'"):
        bl.matmul(np.ones((2, 2)), np.ones((2, 2)), device="gpu")


def test_gpu_crossover_tiles():
    """Square tiles T are compute-bound when T / itemsize >= peak / link (H200 over PCIe: ~10k for float64)."""
    from blocklin.plan.gemm import plan_gemm
    from blocklin.plan.gpu import GPUS, crossover_tile, intensity, transfer_bound

    h200 = GPUS["H200"]
    assert crossover_tile("float64") == -(-h200["float64"] * 8 // h200["link"])
    assert 9000 < crossover_tile("float64") < 11000
    assert crossover_tile("float32") == -(-crossover_tile("float64") // 2)
    assert crossover_tile("float32", precision="tf32") > 7 * crossover_tile("float32")
    assert transfer_bound(4096, 4096, "float64") and not transfer_bound(12288, 12288, "float64")
    assert intensity(100, 300, 8) == 2 * 100 * 300 / (400 * 8)
    small = plan_gemm(8192, 8192, 8192, "float64", a_chunks=(1024, 1024), b_chunks=(1024, 1024), memory=2**34,
                      device="gpu", device_memory=2**28)
    assert "transfer-bound" in small.explain()
    big = plan_gemm(32768, 32768, 32768, "float64", a_chunks=(4096, 4096), b_chunks=(4096, 4096), memory=2**36,
                    device="gpu", device_memory=2**34)
    assert min(big.tm, big.tn) >= crossover_tile("float64") and "transfer-bound" not in big.explain()


def test_gpu_prefetch_depth_from_the_budget():
    from blocklin.plan.gemm import plan_gemm

    kw = dict(a_chunks=(512, 512), b_chunks=(512, 512), device="gpu")
    roomy = plan_gemm(4096, 4096, 4096, "float64", memory=2**32, device_memory=2**31, **kw)
    assert roomy.prefetch == 3 and roomy.peak_memory <= 2**32 and roomy.device_peak <= 2**31
    cpu = plan_gemm(4096, 4096, 4096, "float64", memory=2**32, a_chunks=(512, 512), b_chunks=(512, 512))
    assert cpu.prefetch == 1  # CPU reads one panel ahead (measured enough for BLAS)
    fixed = plan_gemm(4096, 4096, 4096, "float64", memory=2**32, device_memory=2**31, prefetch=1, **kw)
    assert fixed.prefetch == 1
    assert all(p.device_peak <= 2**31 for p in (roomy, fixed))


def test_large_potrf_runs_on_one_blas_thread():
    """OpenBLAS's threaded potrf segfaults from about n = 16000 in the wheels' builds: above
    THREADED_POTRF_MAX the CPU factorizations run on one BLAS thread, below it on the runtime's."""
    from threadpoolctl import threadpool_info

    from blocklin.device.cpu import THREADED_POTRF_MAX, potrf_threads

    def blas_threads() -> list[int]:
        return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]

    before = blas_threads()
    with potrf_threads(THREADED_POTRF_MAX):
        assert blas_threads() == before
    with potrf_threads(THREADED_POTRF_MAX + 1):
        assert blas_threads() and all(t == 1 for t in blas_threads())
    assert blas_threads() == before


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("acc_order", ["C", "F"])
@pytest.mark.parametrize("a_order", ["C", "F", "T"])
@pytest.mark.parametrize("b_order", ["C", "F", "T"])
def test_cpu_gemm_acc_into_either_layout(dtype, acc_order, a_order, b_order):
    """``acc = alpha a @ b + beta acc`` in place for a C- or Fortran-ordered ``acc`` and operands of any
    layout (transposed views included), against NumPy; the tolerance is a few units of rounding of a
    40-term sum in the dtype (|terms| < 1)."""
    from blocklin.device.cpu import _gemm_acc

    rng = np.random.default_rng(3)

    def operand(shape, order):
        if order == "T":  # a transposed view of a C-ordered array
            return rng.uniform(-1, 1, shape[::-1]).astype(dtype).T
        return np.asarray(rng.uniform(-1, 1, shape).astype(dtype), order=order)

    a, b = operand((37, 40), a_order), operand((40, 23), b_order)
    a0, b0 = a.copy(), b.copy()
    for alpha, beta in ((1.0, 1.0), (-0.5, 1.0), (1.0, 0.0)):
        acc = np.asarray(rng.uniform(-1, 1, (37, 23)).astype(dtype), order=acc_order)
        ref = alpha * (a.astype(np.float64) @ b.astype(np.float64)) + beta * acc.astype(np.float64)
        view = acc
        _gemm_acc(acc, a, b, alpha, beta)
        assert acc is view and acc.flags[f"{acc_order}_CONTIGUOUS"]
        np.testing.assert_allclose(acc, ref, rtol=0, atol=50 * np.finfo(dtype).eps)
    np.testing.assert_array_equal(a, a0)  # operands untouched
    np.testing.assert_array_equal(b, b0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", ["C", "F", "strided C", "strided F", "one column"])
@pytest.mark.parametrize("t_order", ["C", "F"])
def test_trsm_inplace_every_layout(dtype, layout, t_order):
    """``b = t^-1 b`` in place for the C-ordered blocks of the factorizations and the Fortran-ordered
    (and strided) accumulators of the inverse's rows task, against NumPy in float64."""
    from blocklin.device.cpu import trsm_inplace

    rng = np.random.default_rng(0)
    for lower in (True, False):
        for unit in (True, False):
            t = np.array(rng.standard_normal((7, 7)) + 7 * np.eye(7), dtype=dtype, order=t_order)
            tri = np.tril(t) if lower else np.triu(t)
            if unit:
                np.fill_diagonal(tri, 1)
            if layout == "one column":
                b = rng.standard_normal((7, 1)).astype(dtype)
            elif layout.startswith("strided"):
                b = np.array(rng.standard_normal((9, 5)), dtype=dtype, order=layout[-1])[:7]
            else:
                b = np.array(rng.standard_normal((7, 5)), dtype=dtype, order=layout)
            want = np.linalg.solve(tri.astype(np.float64), b.astype(np.float64))
            assert trsm_inplace(t, b, lower=lower, unit=unit) is b
            # cond(tri) < 3 (diagonal 7 +- a few units off it): a few eps of relative error
            np.testing.assert_allclose(b, want, rtol=0, atol=50 * np.finfo(dtype).eps * np.abs(want).max())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128])
def test_sumsq_cols_acc_sums_absolute_squares(device, dtype):
    """``acc += sum |x|^2`` down the columns, in float64: of complex data the squares of the real and
    imaginary parts (the complex squares, or the real parts alone, are wrong: the device once cast complex
    strips to float64, which drops the imaginary parts). Each sum is within ``m`` roundings of float64 of
    the exact one (plus the float32 data's own squares, exact in float64)."""
    dev = get_device(device)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((97, 5))
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal((97, 5))
    x = x.astype(dtype)
    want = (np.abs(x.astype(np.complex128)) ** 2).sum(axis=0)
    acc = dev.zeros((5,), np.float64)
    for rows in (slice(0, 40), slice(40, 97)):  # accumulated over two strips
        part = np.ascontiguousarray(x[rows])
        dev.sumsq_cols_acc(acc, part if dev.host_resident else dev.to_device(part))
    got = np.asarray(acc if dev.host_resident else dev.to_host(acc))
    np.testing.assert_allclose(got, want, rtol=2 * 97 * np.finfo(np.float64).eps)
