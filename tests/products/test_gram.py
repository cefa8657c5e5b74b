"""blocklin.gram and the Gram route of matmul against NumPy: values, symmetry, reads, resume, memory."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import blocklin as bl
from blocklin.cli.main import main
from support.memcheck import margin, needs_hwm, run_child
from support.tolerances import assert_gram


@pytest.fixture(scope="module")
def x64():
    return np.random.default_rng(3).standard_normal((700, 90))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize("memory", ["32MiB", "64KiB"])
def test_gram_matches_numpy(tmp_path, x64, dtype, trans, memory):
    x = x64.astype(dtype)
    g = bl.gram(x, tmp_path / "g.zarr", trans=trans, memory=memory)
    ref = x.astype(np.float64) @ x.T.astype(np.float64) if trans else x.T.astype(np.float64) @ x.astype(np.float64)
    got = g.to_numpy()
    assert got.dtype == dtype and got.shape == ref.shape
    assert_gram(got, ref, x, trans=trans)
    assert np.array_equal(got, got.T)  # written full and exactly symmetric on both routes
    assert g.report["route"] == ("pass" if memory == "32MiB" else "tiles")


def test_gram_pass_reads_a_once(tmp_path, x64):
    a = bl.from_array(x64, tmp_path / "a.zarr", chunks=(64, 90))
    g = bl.gram(a.path, tmp_path / "g.zarr", memory="32MiB")
    assert g.report["passes"] == 1 and g.report["bytes_read"] == x64.nbytes
    assert g.report["flops"] == 90 * 90 * 700  # SYRK: half of GEMM's 2 n^2 m
    gt = bl.gram(a.path, tmp_path / "gt.zarr", trans=True, memory="32MiB")
    assert gt.report["passes"] == 1 and gt.report["bytes_read"] == x64.nbytes
    assert_gram(gt.to_numpy(), x64 @ x64.T, x64, trans=True)


def test_gram_tiles_state_their_reads(tmp_path, x64):
    plan = bl.gram(x64, memory="256KiB", explain=True)
    assert plan.route == "tiles" and plan.tile < 90 and plan.reads >= 1
    assert "tiles" in plan.explain() and plan.peak_memory <= 256 * 2**10
    # the SYRK blocks read A as often as the plan says (bytes counted by the reads themselves; slices
    # that cut a stored chunk fetch it whole, hence the margin)
    g = bl.gram(x64, memory="256KiB", scheduler="sync")
    assert g.report["route"] == "tiles" and g.report["passes"] == pytest.approx(plan.reads, rel=0.1)
    tall = bl.gram(np.vstack([x64] * 4).T.copy(), memory="256KiB", explain=True)  # 2800 x 2800 result
    assert tall.route == "tiles" and tall.reads > 1 and tall.peak_memory <= 256 * 2**10


def test_matmul_recognises_gram(tmp_path, x64):
    a = bl.from_array(x64, tmp_path / "a.zarr")
    c = bl.matmul(a.path, a.path, tmp_path / "c.zarr", trans_a=True, alpha=0.5, memory="32MiB")
    assert c.report["route"] == "pass" and "Gram" in c.report["route_reason"]
    assert_gram(c.to_numpy(), 0.5 * x64.T @ x64, x64, alpha=0.5)  # SYRK against NumPy's GEMM
    d = bl.matmul(x64, x64, tmp_path / "d.zarr", trans_b=True, memory="32MiB")  # the same array object
    assert d.report["route"] == "pass" and d.shape == (700, 700)
    e = bl.matmul(x64, x64.copy(), tmp_path / "e.zarr", trans_a=True, memory="32MiB")  # two operands: GEMM
    assert "route" not in e.report
    assert_gram(e.to_numpy(), c.to_numpy() * 2, x64)  # GEMM against the Gram route (x2 is exact)


def test_gram_errors(tmp_path, x64):
    with pytest.raises(bl.errors.DTypeError):
        bl.gram(x64.astype(np.int32))
    bad = x64.copy()
    bad[5, 3] = np.nan
    with pytest.raises(bl.errors.NonFiniteError):
        bl.gram(bad, memory="32MiB")
    bl.gram(x64, tmp_path / "g.zarr", memory="32MiB")
    with pytest.raises(bl.errors.OutputExistsError):
        bl.gram(x64, tmp_path / "g.zarr", memory="32MiB")


def test_gram_1d_is_a_column(tmp_path):
    v = np.arange(1.0, 6.0)
    g = bl.gram(v, tmp_path / "g.zarr", memory="8MiB")
    assert g.shape == (1, 1) and g.to_numpy()[0, 0] == v @ v


@pytest.mark.parametrize("shape", [(17, 0), (0, 5), (0, 0)])
@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.complex128])
def test_gram_of_an_empty_matrix_is_zero(tmp_path, shape, trans, dtype, capsys):
    # a matrix with no rows or no columns: the s x s zeros (0 x 0 where s is the empty side), as NumPy's
    # x.conj().T @ x; its plan had divided by a zero row size (ZeroDivisionError) or summed no task states
    x = np.zeros(shape, dtype)
    ref = x @ x.conj().T if trans else x.conj().T @ x
    g = bl.gram(x, tmp_path / "g.zarr", trans=trans, memory="8MiB")
    got = g.to_numpy()
    assert got.dtype == dtype and got.shape == ref.shape and np.array_equal(got, ref)
    a = bl.from_array(x, tmp_path / "a.zarr")
    args = ["gram", a.path, "-o", str(tmp_path / "h.zarr"), "--json"] + (["--trans"] if trans else [])
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["shape"] == list(ref.shape)
    assert np.array_equal(bl.open(tmp_path / "h.zarr").to_numpy(), ref)


def test_gram_cli(tmp_path, x64, capsys):
    a = bl.from_array(x64, tmp_path / "a.zarr")
    assert main(["gram", a.path, "-o", str(tmp_path / "g.zarr"), "--trans", "--memory", "32MiB", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["product"] == "A A^T" and out["passes"] == 1 and out["shape"] == [700, 700]
    assert_gram(bl.open(tmp_path / "g.zarr").to_numpy(), x64 @ x64.T, x64, trans=True)
    assert main(["gram", a.path, "-o", str(tmp_path / "h.zarr"), "--memory", "256KiB", "--explain"]) == 0
    assert "region SYRK" in capsys.readouterr().out


KILLED = """
import os, signal, sys
import blocklin.runtime.blockops as bo
real, seen = bo.syrk_tile_task, [0]
def dying(*args):
    seen[0] += 1
    if seen[0] > 4:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(*args)
bo.syrk_tile_task = dying
import blocklin as bl
bl.gram(sys.argv[1], sys.argv[2], memory="256KiB", scheduler="sync")
"""


def test_gram_resume_after_sigkill_is_identical(tmp_path, x64):
    a = bl.from_array(x64.T.copy(), tmp_path / "a.zarr")  # 90 x 700: A^T A is 700 x 700, tiles at 256 KiB
    ref = bl.gram(a.path, tmp_path / "ref.zarr", memory="256KiB", scheduler="sync").to_numpy()
    out = tmp_path / "g.zarr"
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(KILLED), a.path, str(out)], capture_output=True)
    assert proc.returncode == -9 and not out.exists()
    g = bl.gram(a.path, out, memory="256KiB", scheduler="sync", resume=True)
    assert g.report["skipped"] == 4 and np.array_equal(g.to_numpy(), ref)
    assert not any(p.name.startswith(".g.zarr.partial") for p in tmp_path.iterdir())


GRAM_CHILD = """
    import blocklin as bl
    a_path, out, memory, trans = sys.argv[1:5]
    bl.open(a_path)[0:1, 0:1]
    import dask.threaded  # noqa: F401
    base = hwm()
    reset_hwm()
    g = bl.gram(a_path, out, memory=memory, trans=trans == "1")
    print(json.dumps({"baseline": base, "peak": hwm(), "plan_peak": g.report["plan"]["peak_memory"],
                      "route": g.report["route"]}))
"""


@needs_hwm
@pytest.mark.parametrize("shape,trans,mib,route", [((40000, 300), "0", 24, "pass"), ((300, 40000), "1", 24, "pass"),
                                                   ((3000, 1200), "0", 8, "tiles")])
def test_gram_peak_within_budget(tmp_path, shape, trans, mib, route):
    # A is 2x to 4x the budget; on the tiled route the 1200 x 1200 float64 result alone exceeds it
    a = bl.random(tmp_path / "a.zarr", shape, seed=1, chunks=(1024, 300) if trans == "0" else (300, 1024))
    budget = mib * 2**20
    assert a.nbytes >= 2 * budget
    r = run_child(GRAM_CHILD, a.path, str(tmp_path / "g.zarr"), f"{mib}MiB", trans)
    used = r["peak"] - r["baseline"]
    assert r["route"] == route and r["plan_peak"] <= budget
    assert used <= budget + margin(budget), f"used {used / 2**20:.1f} MiB over baseline, budget {mib} MiB"


@pytest.mark.gpu
@pytest.mark.parametrize("trans,memory", [(False, "8MiB"), (True, "8MiB"), (False, "64KiB")])
def test_gram_on_gpu_matches_cpu(tmp_path, x64, trans, memory):
    # the pass route's SYRK runs through the device (accumulator on the GPU until the task ends); the
    # tiled route's region SYRK too; the float64 reduction in row order gives the CPU's bits or close
    cpu = bl.gram(x64, trans=trans, memory=memory, device="cpu").to_numpy()
    gpu = bl.gram(x64, trans=trans, memory=memory, device="gpu", device_memory="64MiB")
    assert gpu.report["device"] == "gpu"
    got = gpu.to_numpy()
    assert np.array_equal(got, got.T)
    assert_gram(got, cpu, x64, trans=trans)


def test_gemm_cli_on_one_operand_runs_and_explains_the_gram_route(tmp_path, x64, capsys):
    a = bl.from_array(x64, tmp_path / "a.zarr")
    assert main(["gemm", a.path, a.path, "-o", str(tmp_path / "c.zarr"), "--trans-a", "--memory", "32MiB",
                 "--explain"]) == 0
    assert "gram A^T A" in capsys.readouterr().out
    assert main(["gemm", a.path, a.path, "-o", str(tmp_path / "c.zarr"), "--trans-a", "--memory", "32MiB",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["flops"] == 90 * 90 * 700 and out["bytes_read"] == x64.nbytes
    assert_gram(bl.open(tmp_path / "c.zarr").to_numpy(), x64.T @ x64, x64)


@pytest.mark.parametrize("memory", ["32MiB", "64KiB"])
def test_gram_identical_bits_on_every_scheduler(x64, memory):
    runs = [bl.gram(x64, memory=memory, scheduler=s, workers=2).to_numpy() for s in ("sync", "threads", "processes")]
    assert all(np.array_equal(runs[0], r) for r in runs[1:])


def test_gram_pass_splits_into_two_tasks_where_their_sums_are_small(x64):
    """Two one-core tasks (each SYRK into its own float64 sum) where the two sums take at most an eighth of
    the budget, one task with every core where they would take more; the same values either way, and
    without workers= the same bits on every scheduler (the split depends on the shape and budget only)."""
    from blocklin.plan.gram import GRAM_SPLIT_SHARE, gram_tasks

    x = x64.astype(np.float32)
    n = x.shape[1]
    two = 2 * n * n * 8  # the two float64 sums
    roomy, tight = int(two / GRAM_SPLIT_SHARE) + 4096, int(two / GRAM_SPLIT_SHARE) - 4096
    assert gram_tasks(n, np.float32, roomy, gpu=False) == 2 and gram_tasks(n, np.float32, tight, gpu=False) == 1
    assert gram_tasks(n, np.float32, roomy, gpu=True) == 1  # a GPU pass keeps one task
    ref = x.astype(np.float64).T @ x.astype(np.float64)
    for memory, tasks in ((roomy, 2), (tight, 1)):
        runs = [bl.gram(x, memory=memory, scheduler=s) for s in ("sync", "threads", "processes")]
        assert all(r.report["route"] == "pass" and r.report["plan"]["workers"] == tasks for r in runs)
        got = [r.to_numpy() for r in runs]
        assert all(np.array_equal(got[0], g) for g in got[1:])
        assert_gram(got[0], ref, x)


@pytest.mark.parametrize("memory", ["32MiB", "256KiB"])  # the pass and the tiled route
def test_matmul_gram_route_with_alpha_zero_is_zero(x64, memory):
    """``matmul(x, x, trans_b=True, alpha=0.0)`` is NumPy's ``0 * (x @ x.T)``, zeros, on both Gram routes: the
    tiled route had refused it as squares that underflowed whole (its all-zero diagonal beside a nonzero
    ``x``: found by a randomized search, 2026-12-06)."""
    c = bl.matmul(x64, x64, trans_b=True, alpha=0.0, memory=memory)
    assert c.report["route"] == ("pass" if memory == "32MiB" else "tiles")
    assert np.array_equal(c.to_numpy(), np.zeros((700, 700)))


@pytest.mark.parametrize("power", [-520, 664])  # data whose Gram lies below 2^-1022 or beyond 2^1024
def test_matmul_gram_pass_route_with_alpha_zero_of_scaled_data_is_zero(x64, power):
    """``alpha=0`` is zeros on the pass route whatever the data's range: ``x`` near ``2^-520`` or ``2^664``
    (a Gram of entries near ``2^-1040`` or ``2^1328``, which the pass route scales by itself) had been refused
    as a Gram out of range, the unscaling of ``0 * G'`` checked as if it were ``G`` (found by a randomized
    search, 2026-12-07)."""
    x = np.ldexp(x64[:200, :40], power)
    c = bl.matmul(x, x, trans_a=True, alpha=0.0, memory="32MiB")
    assert c.report["route"] == "pass"
    assert np.array_equal(c.to_numpy(), np.zeros((40, 40)))


def test_matmul_gram_route_range_refusal_names_matmuls_alpha(x64):
    """A Gram handed over by matmul that leaves float32's range is refused with a fix in matmul's terms
    (``alpha=``, which it has; its refusal had told a matmul call to pass gram's ``scale=``), and that fix
    gives the scaled product."""
    x = x64.astype(np.float32)
    with pytest.raises(bl.errors.ParameterError, match=r"^a: must have a Gram matrix within the range of float32") \
            as err:
        bl.matmul(x, x, trans_a=True, alpha=2.0 ** 140, memory="32MiB")
    msg = str(err.value)
    assert "matmul(..., alpha=2.0**" in msg and "scale=" not in msg
    k = int(msg.split("alpha=2.0**")[1].split(")")[0])
    c = bl.matmul(x, x, trans_a=True, alpha=2.0 ** k, memory="32MiB")
    assert c.report["route"] == "pass"
    assert_gram(np.ldexp(c.to_numpy().astype(np.float64), -k), x.T.astype(np.float64) @ x, x, dtype=np.float32)


def test_gram_refusal_of_subnormal_float32_data_names_a_scaling_that_applies():
    """float32 entries near ``2^-140`` (subnormal) need a scaling beyond float32's range: the fix had said
    ``a * 2.0**j``, which a float32 array takes as float32 (Inf entries) (found by a randomized search,
    2026-12-06); it names ``numpy.ldexp(a, j)`` now, exact, after which the Gram is within the bound."""
    x = np.ldexp(np.random.default_rng(4).standard_normal((80, 10)), -140).astype(np.float32)
    with pytest.raises(bl.errors.ParameterError, match=r"^a: must have a Gram matrix within the range of float32") \
            as err:
        bl.gram(x, memory="32MiB")
    j = int(str(err.value).split("numpy.ldexp(a, ")[1].split(")")[0])
    y = np.ldexp(x, j)
    assert y.dtype == np.float32 and np.isfinite(y).all()
    g = bl.gram(y, memory="32MiB").to_numpy()
    yd = y.astype(np.float64)
    assert_gram(g, yd.T @ yd, yd, dtype=np.float32)


def test_matmul_gram_tiles_refusal_names_alpha_where_it_leaves_the_range(x64):
    """Entries near 1 times ``alpha = 2^130`` leave float32's range on the tiled route: its refusal had told
    only to scale ``a`` so that its entries sit near 1, which they do (found by a randomized search,
    2026-12-06); it names ``alpha=`` too now."""
    x = x64.astype(np.float32)
    with pytest.raises(bl.errors.ParameterError, match=r"the tiled route.*Fix: .*pass alpha= nearer 1"):
        bl.matmul(x, x, trans_b=True, alpha=2.0 ** 130, memory="256KiB")


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("route", ["gram", "matmul"])
def test_gram_near_the_smallest_normal_number_is_returned(x64, route):
    """Data near ``2^-495`` (a Gram near ``2^-982``, one column ``2^-40`` smaller, whose entries are
    subnormal) is a Gram float64 holds: it had been refused on both pass routes (``bl.gram`` and
    ``matmul``'s ``X^T X``) below ``2^-970``, a margin of 52 bits over the smallest normal number that the
    scaled sums do not need. Bound: :func:`assert_gram`'s ``2 k eps ||A||_F^2`` on the data scaled by
    ``2^495`` (exact), plus the rounding of each of the ``s^2`` entries to a subnormal, at most half the
    smallest subnormal ``2^-1075`` each, which is ``s 2^-1075`` in Frobenius norm, ``s 2^-85`` scaled."""
    x = x64[:200, :40].copy()
    x[:, 0] *= 2.0 ** -40
    y = np.ldexp(x, -495)
    g = (bl.gram(y, memory="32MiB") if route == "gram" else
         bl.matmul(y, y, trans_a=True, memory="32MiB"))
    assert g.report["route"] == "pass"
    got = g.to_numpy()
    assert 0 < np.abs(got[0, 1:]).max() < np.finfo(np.float64).tiny  # subnormal entries, returned
    assert_gram(np.ldexp(got, 990), x.T @ x, x, extra=40 * 2.0 ** -85)


@pytest.mark.parametrize("route", ["gram", "matmul"])
def test_gram_whose_largest_entry_is_subnormal_is_refused(x64, route):
    """Below the smallest normal number the largest entry itself keeps only some of its bits: refused,
    naming the bound and a scaling (data near ``2^-520``, a Gram near ``2^-1032``)."""
    y = np.ldexp(x64[:200, :40], -520)
    with pytest.raises(bl.errors.ParameterError, match=r"^a: must have a Gram matrix within the range of float64 "
                       r"\(largest entry between 2\^-1022, the smallest normal number, and 2\^1024\)"):
        bl.gram(y, memory="32MiB") if route == "gram" else bl.matmul(y, y, trans_a=True, memory="32MiB")
