"""The peaks a GEMM records with its output: each column's max magnitude (each row's of a wide output),
taken from the bits each tile wrote, on every scheduler, so that an SVD of the product need not scan it;
and no record wherever it could be wrong (a resumed run whose earlier tiles' peaks are lost, an output
holding Inf)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import blocklin as bl
from blocklin.runtime import tiles
from blocklin.storage.recorded_peaks import recorded
from blocklin.storage.records import PEAKS_RECORD

SHAPES = {"tall": (150, 40, 70), "wide": (70, 40, 150), "square": (110, 40, 110)}  # m, k, n
#: Products larger than the SVD's budget below (streamed, not held: a rescaled first pass is a pass more).
STREAMED = {"tall": (3000, 40, 100), "wide": (100, 40, 3000)}
#: A budget and output chunks that cut every case into several tiles both ways (edge tiles included).
TILED = {"memory": "20KiB", "out_chunks": (16, 16), "workers": 2}
#: The same for operands stored in 32 x 32 chunks.
STORED = {**TILED, "memory": "48KiB"}


def _numpy_peaks(x: np.ndarray) -> np.ndarray:
    """Each column's (tall, square) or each row's (wide) largest magnitude, by NumPy; complex values by
    ``max(|Re|, |Im|)``, the measure every record and first-pass scan takes (``blocklin.peaks``)."""
    mag = np.maximum(np.abs(x.real), np.abs(x.imag)) if x.dtype.kind == "c" else np.abs(x)
    return mag.max(axis=1 if x.shape[0] < x.shape[1] else 0).astype(np.float64)


def _operands(shape: str, dtype: str, seed: int = 0, shapes: dict = SHAPES) -> tuple[np.ndarray, np.ndarray]:
    m, k, n = shapes[shape]
    rng = np.random.default_rng(seed)

    def draw(r: int, c: int) -> np.ndarray:
        x = rng.standard_normal((r, c))
        if np.dtype(dtype).kind == "c":
            x = x + 1j * rng.standard_normal((r, c))
        return (x * rng.uniform(0.01, 100.0, size=(1, c))).astype(dtype)  # columns of different scales

    return draw(m, k), draw(k, n)


def _assert_record(c, want_shape: tuple[int, int]) -> None:
    x = c.to_numpy()
    assert x.shape == want_shape
    got = recorded(c.path, x.shape)
    assert got is not None, "no peaks recorded with the product"
    assert got.transposed == (x.shape[0] < x.shape[1])
    assert np.array_equal(got.columns, _numpy_peaks(x))  # exactly: maxima of the stored bits
    assert got.amax == float(_numpy_peaks(x).max())
    assert c.report["output_peaks_recorded"] is True


def _tiled(c) -> None:
    """The product ran as several tiles across both dimensions (the peaks merged across tiles)."""
    gm, gn = c.report["plan"]["grid"]
    assert gm > 1 and gn > 1, c.report["plan"]["grid"]


@pytest.mark.parametrize("scheduler", ["sync", "threads", "processes"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "complex128"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_record_equals_numpy_peaks_of_the_output(tmp_path, shape, dtype, scheduler):
    a, b = _operands(shape, dtype)
    c = bl.matmul(a, b, tmp_path / "c.zarr", **TILED, scheduler=scheduler)
    _tiled(c)
    _assert_record(c, (a.shape[0], b.shape[1]))


@pytest.mark.parametrize("shape,dtype", [("tall", "float64"), ("wide", "complex64"), ("square", "complex128")])
def test_record_on_a_local_cluster(tmp_path, client, shape, dtype):
    """Tiles written by the cluster's worker processes return their peaks, merged by the client."""
    a, b = _operands(shape, dtype, seed=1)
    c = bl.matmul(a, b, tmp_path / "c.zarr", **TILED, scheduler=client)
    assert c.report["scheduler"] == "distributed"
    _tiled(c)
    _assert_record(c, (a.shape[0], b.shape[1]))


def test_record_of_alpha_beta_c_and_of_a_cast_product(tmp_path):
    """``alpha A B + beta C`` (C read and added in each tile) and a product computed in float32 and stored
    in float64: the record holds the peaks of what was stored."""
    a, b = _operands("tall", "float64", seed=2)
    c0 = np.random.default_rng(3).standard_normal((a.shape[0], b.shape[1])) * 1e3
    c0p = bl.from_array(c0, tmp_path / "c0.zarr", chunks=(32, 32)).path
    acc = bl.matmul(a, b, tmp_path / "acc.zarr", c=c0p, alpha=-0.5, beta=2.0,
                    **{**TILED, "memory": "32KiB"}, scheduler="threads")  # C's strips too
    _tiled(acc)
    _assert_record(acc, c0.shape)
    np.testing.assert_allclose(acc.to_numpy(), -0.5 * a @ b + 2.0 * c0, rtol=1e-12, atol=1e-9)
    cast = bl.matmul(a, b, tmp_path / "cast.zarr", precision="float32", **TILED, scheduler="sync")
    assert cast.dtype == np.float64
    _assert_record(cast, c0.shape)


@pytest.mark.parametrize("alpha", [1.0, 1e200])
@pytest.mark.parametrize("shape", ["tall", "wide"])
def test_svd_of_the_product_takes_the_record(tmp_path, monkeypatch, shape, alpha):
    """The SVD's first pass takes the recorded peaks (no scan); without the record it scans, to the same
    bits. A product beyond ``2^256`` (``alpha=1e200``) is scaled from the record before its first pass,
    which without it runs twice (the second time scaled)."""
    a, b = _operands(shape, "float64", seed=4, shapes=STREAMED)
    c = bl.matmul(a, b, tmp_path / "c.zarr", alpha=alpha, memory="256KiB", scheduler="sync")
    assert c.report["plan"]["n_tasks"] > 1
    took = bl.svd(c.path, k=3, seed=0, memory="1MiB", scheduler="sync")
    assert took.report.get("peaks_recorded") == ["a"]
    os.remove(tmp_path / "c.zarr" / PEAKS_RECORD)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "fresh-cache"))  # no peaks an earlier pass saw
    scanned = bl.svd(c.path, k=3, seed=0, memory="1MiB", scheduler="sync")
    assert "peaks_recorded" not in scanned.report and "peaks_seen" not in scanned.report
    assert np.array_equal(took.s, scanned.s) and np.array_equal(took.U, scanned.U)
    extra = 1 if alpha > 1 else 0
    assert took.report["passes"] + extra == scanned.report["passes"]
    if extra:
        assert took.report["scaling"]["extra_passes"] == 0 and scanned.report["scaling"]["extra_passes"] == 1


def _interrupted(monkeypatch, a_path, b_path, out, after: int) -> None:
    """Run the product until ``after`` tiles are written, then die (as a kill would)."""
    real, done = tiles.run_tile, []

    def dying(*args, **kwargs):
        if len(done) == after:
            raise KeyboardInterrupt("simulated kill")
        done.append(args[1:3])
        return real(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(tiles, "run_tile", dying)
        with pytest.raises(KeyboardInterrupt):
            bl.matmul(a_path, b_path, out, **STORED, scheduler="sync", resume=True)


@pytest.mark.parametrize("shape", ["tall", "wide"])
def test_resumed_product_records_recovered_peaks_or_none(tmp_path, monkeypatch, shape):
    """A resumed run takes its skipped tiles' peaks kept in their resume markers: the record is exact. Where
    they are lost (a partial output of a run that kept none), it records nothing rather than the peaks of
    the tiles it wrote alone."""
    a, b = _operands(shape, "float64", seed=5)
    a_path = bl.from_array(a, tmp_path / "a.zarr", chunks=(32, 32)).path
    b_path = bl.from_array(b, tmp_path / "b.zarr", chunks=(32, 32)).path
    ref = bl.matmul(a_path, b_path, tmp_path / "ref.zarr", **STORED, scheduler="sync").to_numpy()

    _interrupted(monkeypatch, a_path, b_path, tmp_path / "c.zarr", after=2)
    c = bl.matmul(a_path, b_path, tmp_path / "c.zarr", **STORED, scheduler="sync", resume=True)
    assert c.report["skipped"] == 2
    assert np.array_equal(c.to_numpy(), ref)
    _assert_record(c, ref.shape)

    _interrupted(monkeypatch, a_path, b_path, tmp_path / "d.zarr", after=2)
    (partial,) = [p for p in tmp_path.iterdir() if p.name.startswith(".d.zarr.partial-")]
    markers = list((partial / ".blocklin-done").iterdir())
    assert len(markers) == 2 and all(p.stat().st_size > 0 for p in markers)  # each holds its tile's peaks
    for p in markers:  # as the empty markers of a partial output of a run that kept no peaks
        p.write_bytes(b"")
    d = bl.matmul(a_path, b_path, tmp_path / "d.zarr", **STORED, scheduler="sync", resume=True)
    assert d.report["skipped"] == 2 and np.array_equal(d.to_numpy(), ref)
    assert d.report["output_peaks_recorded"] is False
    assert recorded(d.path, ref.shape) is None and recorded(d.path, ref.shape, column_peaks=False) is None
    assert not (tmp_path / "d.zarr" / PEAKS_RECORD).exists()


def test_output_holding_inf_replaces_a_record_with_none(tmp_path):
    """A product that overflows is refused (its operands finite) and replaces nothing: the output it would
    have overwritten keeps its values and record. Written unchecked (``check_finite=False``) it holds Inf:
    no record (the first pass's check names the element), and the overwritten output's record does not
    survive."""
    from blocklin.errors import ParameterError

    a, b = _operands("tall", "float64", seed=6)
    first = bl.matmul(a, b, tmp_path / "c.zarr", **TILED, scheduler="sync")
    _assert_record(first, (a.shape[0], b.shape[1]))
    kept = first.to_numpy()
    big = a.copy()
    big[7, :] = 1e308
    with pytest.raises(ParameterError, match="must give a product within float64's range"):
        bl.matmul(big, b, tmp_path / "c.zarr", **TILED, scheduler="sync", overwrite=True)
    assert np.array_equal(bl.open(tmp_path / "c.zarr").to_numpy(), kept)
    assert recorded(first.path, kept.shape) is not None
    over = bl.matmul(big, b, tmp_path / "c.zarr", **TILED, scheduler="sync", overwrite=True, check_finite=False)
    assert not np.isfinite(over.to_numpy()).all()
    assert over.report["output_peaks_recorded"] is False
    assert recorded(over.path, (a.shape[0], b.shape[1]), column_peaks=False) is None


@pytest.mark.parametrize("shape,dtype", [("tall", "float64"), ("wide", "complex128")])
def test_record_of_tiles_computed_on_a_gpu(standin, tmp_path, shape, dtype):
    """On a GPU (the CuPy stand-in) each strip's peaks are taken from its download, the bits written."""
    from support import cupy_standin

    a, b = _operands(shape, dtype, seed=7)
    c = bl.matmul(a, b, tmp_path / "c.zarr", device="gpu", memory="96KiB", device_memory="64KiB", out_chunks=(16, 16))
    assert c.report["device"] != "cpu" and c.report["plan"]["n_tasks"] > 1
    _assert_record(c, (a.shape[0], b.shape[1]))
    assert cupy_standin.take_races() == []


@pytest.mark.parametrize("scheduler", ["sync", "threads", "processes"])
@pytest.mark.parametrize("case", ["tall", "tall-with-c", "wide", "complex"])
def test_thin_product_records_its_peaks(tmp_path, case, scheduler):
    """The thin-product route (``op(B)`` held, ``A`` streamed by rows) takes the peaks of each block it
    writes, as the tiles do: each column's of a tall output, each row's of a wide one (``20 x 40``),
    ``alpha`` and ``beta C`` applied; it had written no record, so an SVD of its output scanned it."""
    rng = np.random.default_rng(7)
    m, k, n = (20, 500, 40) if case == "wide" else (6000, 60, 4)
    dtype = "complex128" if case == "complex" else "float64"
    a = (rng.standard_normal((m, k)) * rng.uniform(0.01, 100.0, size=(1, k))).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    kw = {}
    if case == "tall-with-c":
        kw = {"c": rng.standard_normal((m, n)) * 1e3, "alpha": -0.5, "beta": 2.0}
    c = bl.matmul(a, b, tmp_path / "c.zarr", memory="4MiB", workers=2, scheduler=scheduler, **kw)
    assert c.report["route"] == "rows"
    _assert_record(c, (m, n))
    want = -0.5 * a @ b + 2.0 * kw["c"] if kw else a @ b
    np.testing.assert_allclose(c.to_numpy(), want, rtol=1e-12, atol=1e-9 * np.abs(want).max())
    if case == "tall":
        took = bl.svd(c.path, k=2, seed=0, memory="256KiB", scheduler="sync")
        assert took.report.get("peaks_recorded") == ["a"]


@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float64", "complex128"])
def test_gram_records_its_peaks(tmp_path, dtype, trans):
    """``gram`` (its pass route, the result held in memory) records the peaks of the bands it writes, as
    a product does; ``matmul(x, x, trans_a=True)``, handed to it, too. The tiled route (a result over the
    budget) records none rather than an incomplete tally."""
    a, _ = _operands("tall", dtype, seed=3)
    g = bl.gram(a, tmp_path / "g.zarr", trans=trans, scheduler="threads")
    assert g.report["route"] == "pass"
    _assert_record(g, (a.shape[0],) * 2 if trans else (a.shape[1],) * 2)
    via = bl.matmul(a, a, tmp_path / "m.zarr", trans_a=True)
    _assert_record(via, (a.shape[1],) * 2)
    wide = np.random.default_rng(4).standard_normal((60, 200)).astype(dtype)  # a 200 x 200 Gram over 128 KiB
    tiled = bl.gram(wide, tmp_path / "t.zarr", memory="128KiB", scheduler="sync")
    assert tiled.report["route"] == "tiles" and tiled.report["output_peaks_recorded"] is False
    assert recorded(tiled.path, tiled.shape) is None
