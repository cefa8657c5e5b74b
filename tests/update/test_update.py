"""blocklin.update: results brought up to date from appended rows, checked against a recompute."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import ParameterError
from support.tolerances import assert_gram, assert_product, assert_singular_values, eps


def _stored(tmp_path, m=900, n=40, dtype=np.float64, seed=0, chunks=(128, 40)):
    a = np.random.default_rng(seed).standard_normal((m, n)).astype(dtype)
    bl.from_array(a, tmp_path / "A.zarr", chunks=chunks)
    return a, tmp_path / "A.zarr"


def _check_gram(g, a, dtype):
    """The update's bound: the Gram's (any summation order), plus one rounding of the stored old
    result in the result's dtype per update (``u ||A||_F^2``)."""
    a64 = a.astype(np.float64)
    assert_gram(g, a64.T @ a64, a, dtype=dtype, extra=eps(dtype) * float(np.linalg.norm(a64)) ** 2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("memory", ["32MiB", "96KiB"])
def test_gram_update_matches_a_recompute(tmp_path, dtype, memory):
    a, path = _stored(tmp_path, n=100, dtype=dtype, chunks=(128, 100))
    g = bl.gram(path, tmp_path / "G.zarr", memory=memory)
    assert g.report["route"] == ("pass" if memory == "32MiB" else "tiles")
    rows = [np.random.default_rng(s).standard_normal((p, 100)).astype(dtype) for s, p in ((1, 77), (2, 300))]
    for r in rows:
        bl.append(path, r)
    u = bl.update(g.path, memory=memory)
    full = np.vstack([a] + rows)
    assert u.report["updated"]["rows_read"] == 377 and u.report["updated"]["rows_before"] == 900
    assert u.report["bytes_read"] >= 377 * 100 * np.dtype(dtype).itemsize
    r = bl.gram(path, tmp_path / "R.zarr", memory=memory)  # the recompute reads every row (as often)
    assert u.report["bytes_read"] < 0.5 * r.report["bytes_read"]
    got = u.to_numpy()
    assert got.dtype == dtype and np.array_equal(got, got.T)
    _check_gram(got, full, dtype)
    assert bl.update(g.path).report["current"]  # a second update has nothing to read


@pytest.mark.parametrize("scheduler", ["sync", "threads", "processes"])
def test_gram_update_on_every_scheduler(tmp_path, scheduler):
    a, path = _stored(tmp_path)
    g = bl.gram(path, tmp_path / "G.zarr", scheduler=scheduler)
    new = np.random.default_rng(5).standard_normal((250, 40))
    bl.append(path, new)
    got = bl.update(g.path, scheduler=scheduler).to_numpy()
    _check_gram(got, np.vstack([a, new]), np.float64)


def test_float64_update_equals_recompute_up_to_summation_order(tmp_path):
    """Old result plus new rows' sums, rounded once: the recompute sums the same rows in other groups."""
    a, path = _stored(tmp_path)
    g = bl.gram(path, tmp_path / "G.zarr")
    bl.append(path, np.random.default_rng(6).standard_normal((256, 40)))
    u = bl.update(g.path).to_numpy()
    r = bl.gram(path, tmp_path / "R.zarr").to_numpy()
    full = bl.open(path).to_numpy()
    assert_gram(u, r, full)


def test_what_cannot_be_updated_is_refused_with_the_recompute(tmp_path):
    a, path = _stored(tmp_path)
    gt = bl.gram(path, tmp_path / "GT.zarr", trans=True)
    bl.convert(path, tmp_path / "C.zarr", chunks=(64, 40))  # a copy: recomputed, not updated
    inmem = bl.gram(a, tmp_path / "GM.zarr")
    bl.append(path, np.ones((5, 40)))
    with pytest.raises(ParameterError, match="A A\\^T.*recompute it: blocklin gram A OUT --trans --overwrite"):
        bl.update(gt.path)
    with pytest.raises(ParameterError, match="a convert result.*--overwrite"):
        bl.update(tmp_path / "C.zarr")
    with pytest.raises(ParameterError, match="records none"):
        bl.update(inmem.path)


def test_inputs_changed_other_than_by_appends_are_refused(tmp_path):
    a, path = _stored(tmp_path)
    g = bl.gram(path, tmp_path / "G.zarr")
    bl.from_array(np.ones((950, 41)), path, chunks=(128, 41), overwrite=True)  # columns added
    with pytest.raises(ParameterError, match="columns 40 then, 41 now"):
        bl.update(g.path)
    bl.from_array(np.ones((950, 40)), path, chunks=(128, 40), overwrite=True)  # replaced: rows differ
    with pytest.raises(ParameterError, match="not by blocklin.append"):
        bl.update(g.path)
    bl.from_array(np.ones((10, 40)), path, chunks=(128, 40), overwrite=True)
    with pytest.raises(ParameterError, match="900 rows then, 10 now"):
        bl.update(g.path)
    assert np.array_equal(bl.open(g.path).to_numpy(), g.to_numpy())  # the result is untouched by a refusal


_KILL = textwrap.dedent("""
    import os, signal, sys
    import blocklin as bl
    import blocklin.linalg.products.gram as gm
    def killed(*args, **kw):  # the new rows are summed; killed as the result is written
        os.kill(os.getpid(), signal.SIGKILL)
    gm.write_block = killed
    bl.update(sys.argv[1], scheduler="sync")
""")


def test_sigkill_during_update_keeps_the_old_result_then_resume(tmp_path):
    a, path = _stored(tmp_path)
    g = bl.gram(path, tmp_path / "G.zarr")
    new = np.random.default_rng(7).standard_normal((300, 40))
    bl.append(path, new)
    before = g.to_numpy()
    p = subprocess.run([sys.executable, "-c", _KILL, str(g.path)], cwd=tmp_path)
    assert p.returncode == -9
    assert np.array_equal(bl.open(g.path).to_numpy(), before)  # the old result, whole
    assert any(f.startswith(".G.zarr.partial-") for f in os.listdir(tmp_path))
    u = bl.update(g.path, resume=True)
    _check_gram(u.to_numpy(), np.vstack([a, new]), np.float64)
    assert not any(f.startswith(".G.zarr.partial-") for f in os.listdir(tmp_path))


def test_append_and_update_on_s3(s3):
    base, opts = s3
    a = np.random.default_rng(8).standard_normal((500, 20))
    bl.from_array(a, f"{base}/A.zarr", chunks=(64, 20), storage_options=opts)
    g = bl.gram(f"{base}/A.zarr", f"{base}/G.zarr", storage_options=opts)
    new = np.random.default_rng(9).standard_normal((130, 20))
    m = bl.append(f"{base}/A.zarr", new, storage_options=opts)
    assert m.shape == (630, 20) and np.array_equal(m.to_numpy(), np.vstack([a, new]))
    u = bl.update(f"{base}/G.zarr", storage_options=opts)
    assert u.report["updated"]["rows_read"] == 130
    _check_gram(u.to_numpy(), np.vstack([a, new]), np.float64)
    assert bl.update(f"{base}/G.zarr", storage_options=opts).report["current"]


def test_pca_update_on_s3_rewrites_the_scores_from_a_copy(s3):
    """On an object store the old scores are copied before the overwriting run starts (their output is
    removed then), and the new U is written band by band by the job's tasks."""
    base, opts = s3
    rng = np.random.default_rng(18)
    basis = np.linalg.qr(rng.standard_normal((12, 12)))[0]

    def rows(p):  # a rank-3 signal with separated scales plus small noise: the old subspace holds
        return (np.hstack([rng.standard_normal((p, 3)) * [30.0, 20.0, 10.0], 1e-9 * rng.standard_normal((p, 9))])
                @ basis.T + 2.0)

    a = rows(600)
    bl.from_array(a, f"{base}/A.zarr", chunks=(64, 12), storage_options=opts)
    bl.pca(f"{base}/A.zarr", 3, out=f"{base}/P.zarr", updatable=True, storage_options=opts)
    new = rows(90)
    bl.append(f"{base}/A.zarr", new, storage_options=opts)
    res = bl.update(f"{base}/P.zarr", storage_options=opts).svd  # a PCAResult: its factors
    full = np.vstack([a, new])
    c = full - full.mean(axis=0)
    u_ref, s_ref, _ = np.linalg.svd(c, full_matrices=False)
    assert res.report["updated"]["rows_read"] == 90 and res.report["updated"]["scores"] == "rotated"
    assert_singular_values(res.s, s_ref[:3], n=690, gram=True, s1=s_ref[0])
    u = bl.open(f"{base}/P.zarr/U", storage_options=opts).to_numpy()
    # B v_i = s_i u_i: the stored scores against the grown, centered rows and the updated factors,
    # within the rotation's rounding and the u_errors the update reports
    resid = np.linalg.norm(c @ res.Vt.T - u * res.s, axis=0) / res.s
    assert (resid <= np.asarray(res.report["u_errors"]) + 64 * 690 * eps(np.float64)).all(), resid


def _check_product(got, a, b, dtype):
    """A^T B's product bound (any summation order) plus one rounding of the stored result per update."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    from support.tolerances import assert_product

    assert_product(got, a64.T @ b64, a64.T, b64, dtype=dtype,
                   extra=eps(dtype) * float(np.linalg.norm(a64) * np.linalg.norm(b64)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_product_at_b_update(tmp_path, dtype):
    rng = np.random.default_rng(10)
    a, b = rng.standard_normal((900, 30)).astype(dtype), rng.standard_normal((900, 7)).astype(dtype)
    pa, pb = bl.from_array(a, tmp_path / "A.zarr", chunks=(128, 30)), bl.from_array(b, tmp_path / "B.zarr", chunks=(128, 7))
    c = bl.matmul(pa.path, pb.path, tmp_path / "C.zarr", trans_a=True, alpha=0.5)
    g = bl.matmul(pa.path, pa.path, tmp_path / "G.zarr", trans_a=True)  # matmul's Gram route
    a2, b2 = rng.standard_normal((77, 30)).astype(dtype), rng.standard_normal((77, 7)).astype(dtype)
    bl.append(pa.path, a2)
    bl.append(pb.path, b2)
    A, B = np.vstack([a, a2]), np.vstack([b, b2])
    u = bl.update(c.path)
    assert u.report["updated"]["rows_read"] == 77 and u.dtype == dtype
    _check_product(u.to_numpy() * 2.0, A, B, dtype)
    v = bl.update(g.path)
    assert v.report["updated"]["rows_read"] == 77
    _check_gram(v.to_numpy(), A, dtype)


def test_a_product_update_beyond_the_range_is_refused(tmp_path):
    """Appended rows whose products push ``A^T B`` past float64's range had updated the result to Inf,
    silently, where ``matmul`` of the grown inputs refuses: the update refuses as the product does, and
    the stored result is left as it was."""
    rng = np.random.default_rng(12)
    a, b = rng.standard_normal((120, 9)) * 1e150, rng.standard_normal((120, 7)) * 1e150
    pa = bl.from_array(a, tmp_path / "A.zarr", chunks=(32, 9))
    pb = bl.from_array(b, tmp_path / "B.zarr", chunks=(32, 7))
    c = bl.matmul(pa.path, pb.path, tmp_path / "C.zarr", trans_a=True).to_numpy()
    bl.append(pa.path, rng.standard_normal((10, 9)) * 1e150)
    bl.append(pb.path, rng.standard_normal((10, 7)) * 1e158)
    with pytest.raises(ParameterError, match=r"^a: must give a product within float64's range"):
        bl.matmul(pa.path, pb.path, trans_a=True, memory="96KiB")  # the product of the grown inputs
    with pytest.raises(ParameterError, match=r"^a: must give a product within float64's range.*Fix: the stored "
                                             r"result is unchanged"):
        bl.update(tmp_path / "C.zarr", memory="96KiB")
    assert np.array_equal(bl.open(tmp_path / "C.zarr").to_numpy(), c)


@pytest.mark.parametrize("dtype,e", [(np.float64, -530), (np.float32, -70)])
def test_a_product_update_below_the_normal_numbers_is_refused(tmp_path, dtype, e):
    """``A^T B`` of old rows that give exact zeros (``A``'s are zero), then rows near ``2^-530`` (float32
    ``2^-70``) appended to both: ``|alpha| k max|a| max|b| + max|c|`` of the update is below ``2^minexp``, so
    every entry is a subnormal of few digits. The update had returned them without a word (``2e-5`` off in
    float64, ``6e-4`` in float32, norm-wise, against the reference on operands scaled by exact powers of two),
    where ``matmul`` of the grown inputs refuses: the update refuses as it does, the stored result left as it
    was; ``check_finite=False`` keeps it as computed (outside the bound); the scalings it names, applied to all
    of ``a`` and ``b``, give the product within the usual bound."""
    import re

    rng = np.random.default_rng(13)
    a, b = np.zeros((60, 9), dtype), np.ldexp(rng.standard_normal((60, 7)), e).astype(dtype)
    pa = bl.from_array(a, tmp_path / "A.zarr", chunks=(32, 9))
    pb = bl.from_array(b, tmp_path / "B.zarr", chunks=(32, 7))
    c = bl.matmul(pa.path, pb.path, tmp_path / "C.zarr", trans_a=True).to_numpy()
    assert not c.any()
    a2, b2 = (np.ldexp(rng.standard_normal((10, w)), e).astype(dtype) for w in (9, 7))
    bl.append(pa.path, a2)
    bl.append(pb.path, b2)
    A, B = np.vstack([a, a2]), np.vstack([b, b2])
    with pytest.raises(ParameterError, match=r"^a: must give a product within \w+'s normal range"):
        bl.matmul(pa.path, pb.path, trans_a=True)  # the product of the grown inputs
    with pytest.raises(ParameterError, match=rf"^a: must give a product within {np.dtype(dtype).name}'s normal "
                                             r"range .*got a product whose entries are all below 2\^-\d+ .*a and b: "
                                             r"the appended rows, c: the stored result.*Fix: the stored result is "
                                             r"unchanged; scale all of a by 2\^\d+") as err:
        bl.update(tmp_path / "C.zarr")
    assert np.array_equal(bl.open(tmp_path / "C.zarr").to_numpy(), c)
    a64, b64 = np.ldexp(A.astype(np.float64), -e), np.ldexp(B.astype(np.float64), -e)  # A^T B = 2^(2e) a64^T b64
    with np.errstate(under="ignore"):
        unchecked = bl.update(tmp_path / "C.zarr", check_finite=False).to_numpy()
    with pytest.raises(AssertionError):  # what had come back
        _check_product(np.ldexp(unchecked.astype(np.float64), -2 * e), a64, b64, dtype)
    ea, eb, p = (int(g) for g in re.search(r"a by 2\^(\d+) and b by 2\^(\d+) .*then 2\^(\d+) times",
                                           str(err.value)).groups())
    assert ea + eb == p
    sa, sb = np.ldexp(A, ea), np.ldexp(B, eb)  # exact: normal numbers, and so are these
    got = bl.matmul(sa, sb, tmp_path / "C.zarr", trans_a=True, overwrite=True).to_numpy()
    _check_product(np.ldexp(got.astype(np.float64), -(p + 2 * e)), a64, b64, dtype)


def test_products_that_grow_or_add_c_are_refused(tmp_path):
    a, path = _stored(tmp_path)
    ab = bl.matmul(path, np.ones((40, 2)), tmp_path / "AB.zarr")
    atc = bl.matmul(path, path, tmp_path / "ATC.zarr", trans_a=True, c=np.ones((40, 40)), beta=1.0)
    xxt = bl.matmul(path, path, tmp_path / "XXT.zarr", trans_b=True)
    bl.append(path, np.ones((5, 40)))
    for p, what in ((ab.path, "trans_a=False"), (atc.path, "beta=1.0"), (xxt.path, "X X\\^T")):
        with pytest.raises(ParameterError, match=what):
            bl.update(p)


def test_product_update_on_s3(s3):
    base, opts = s3
    rng = np.random.default_rng(11)
    a, b = rng.standard_normal((400, 12)), rng.standard_normal((400, 3))
    bl.from_array(a, f"{base}/A.zarr", chunks=(64, 12), storage_options=opts)
    bl.from_array(b, f"{base}/B.zarr", chunks=(64, 3), storage_options=opts)
    bl.matmul(f"{base}/A.zarr", f"{base}/B.zarr", f"{base}/C.zarr", trans_a=True, storage_options=opts)
    a2, b2 = rng.standard_normal((30, 12)), rng.standard_normal((30, 3))
    bl.append(f"{base}/A.zarr", a2, storage_options=opts)
    bl.append(f"{base}/B.zarr", b2, storage_options=opts)
    u = bl.update(f"{base}/C.zarr", storage_options=opts)
    _check_product(u.to_numpy(), np.vstack([a, a2]), np.vstack([b, b2]), np.float64)


@pytest.mark.slow
def test_updates_on_a_cluster(tmp_path, client):
    """Append, then update a Gram, a PCA and a ridge solve with every pass on a LocalCluster's workers."""
    a, path = _stored(tmp_path)
    b = a @ np.ones((40, 1))
    bl.from_array(b, tmp_path / "b.zarr", chunks=(128, 1))
    g = bl.gram(path, tmp_path / "G.zarr", scheduler=client)
    p = bl.pca(path, 3, out=tmp_path / "P.zarr", updatable=True, scheduler=client)
    x = bl.solve(path, tmp_path / "b.zarr", lam=0.1, out=tmp_path / "x.zarr", updatable=True, scheduler=client)
    new = np.random.default_rng(12).standard_normal((200, 40))
    bl.append(path, new)
    bl.append(tmp_path / "b.zarr", new @ np.ones((40, 1)))
    full = np.vstack([a, new])
    _check_gram(bl.update(g.path, scheduler=client).to_numpy(), full, np.float64)
    res = bl.update(tmp_path / "P.zarr", scheduler=client).svd  # a PCAResult: its factors
    ref = np.linalg.svd(full - full.mean(axis=0), compute_uv=False)
    assert res.report["converged"]
    assert_singular_values(res.s, ref[:3], n=full.shape[0], gram=True, s1=ref[0])
    u = bl.update(x.path, scheduler=client)
    assert u.report["updated"]["rows_read"] == 200
    K = full.T @ full + 0.01 * np.eye(40)
    ref_x = np.linalg.solve(K, full.T @ (full @ np.ones((40, 1))))
    # forward error by cond(K): the two solves' backward errors and forming A^T A from m rows (both sides)
    bound = np.linalg.cond(K) * (8 * 40 * eps(np.float64) * np.linalg.norm(K) + 2 * full.shape[0]
                                 * eps(np.float64) * np.linalg.norm(full) ** 2) / np.linalg.norm(K, 2)
    assert np.linalg.norm(u.to_numpy() - ref_x) <= bound * np.linalg.norm(ref_x)


@pytest.mark.parametrize("method", ["tsqr", "tiled"])
def test_qr_r_update(tmp_path, method):
    """R of [R; R_new]: R^T R is the grown A^T A within the Gram's rounding bound (QR is backward stable:
    R^T R = A^T A + E, ||E|| <= c m eps ||A||^2), with the non-negative diagonal of every blocklin R."""
    a, path = _stored(tmp_path)
    r = bl.qr(path, tmp_path / "R.zarr", method=method)
    new = np.random.default_rng(13).standard_normal((150, 40))
    bl.append(path, new)
    u = bl.update(r.path)
    assert u.report["updated"]["rows_read"] == 150
    got = u.to_numpy()
    full = np.vstack([a, new])
    assert np.array_equal(got, np.triu(got)) and (np.diag(got) >= 0).all()
    assert_gram(got.T @ got, full.T @ full, full, const=4.0)
    q, _ = bl.qr(path, tmp_path / "R2.zarr", q=tmp_path / "Q.zarr", mode="reduced")
    bl.append(path, new[:3])
    with pytest.raises(ParameterError, match="a stored Q"):
        bl.update(tmp_path / "R2.zarr")


def test_results_that_cannot_be_updated_name_the_command_that_recomputes(tmp_path):
    rng = np.random.default_rng(21)
    a = rng.standard_normal((96, 96))
    path = bl.from_array(a + a.T, tmp_path / "A.zarr", chunks=(32, 96)).path
    bl.eigsh(path, 2, out=tmp_path / "E.zarr", order="descending")
    bl.inv(path, out=tmp_path / "I.zarr")
    before = {p: sorted(os.listdir(tmp_path / p)) for p in ("E.zarr", "I.zarr")}
    bl.append(path, rng.standard_normal((4, 96)))
    for name, op, cli in (("E.zarr", "eigsh", "eigs"), ("I.zarr", "inv", "inv")):
        with pytest.raises(ParameterError, match=rf"out: must be a result blocklin can update from appended rows.*"
                                                 rf"an? {op} result.*rerun blocklin {cli} \(blocklin.{op} in Python\)"):
            bl.update(tmp_path / name)
        assert sorted(os.listdir(tmp_path / name)) == before[name]  # nothing touched


def _append_meanwhile(monkeypatch, module, name, path, rows):
    """Patch ``module.name`` to commit an append of ``rows`` to ``path`` before it runs: another
    process's append landing while an operation runs."""
    real = getattr(module, name)

    def racing(*args, **kw):
        bl.append(path, rows)
        monkeypatch.setattr(module, name, real)
        return real(*args, **kw)

    monkeypatch.setattr(module, name, racing)


@pytest.mark.parametrize("when", ["update", "fresh"])
def test_an_append_during_a_gram_is_left_to_the_next_update(tmp_path, monkeypatch, when):
    """Rows appended while a result is computed or updated are not in it: it covers the version it read,
    and the next update reads them (its coverage had named the grown version, so the next update found
    the result current: 20 rows missing, the Gram off by 31)."""
    import blocklin.linalg.products.gram as pg
    import blocklin.linalg.update.gram as ug

    a, path = _stored(tmp_path, m=300, n=6, chunks=(64, 6))
    late = np.random.default_rng(2).standard_normal((20, 6))
    if when == "fresh":  # between the opening of the input and the claim of the output
        _append_meanwhile(monkeypatch, pg.Gram, "plan", path, late)
        g = bl.gram(path, tmp_path / "G.zarr")
        _check_gram(g.to_numpy(), a, np.float64)
        full = np.vstack([a, late])
    else:
        g = bl.gram(path, tmp_path / "G.zarr")
        new = np.random.default_rng(1).standard_normal((10, 6))
        bl.append(path, new)
        _append_meanwhile(monkeypatch, ug, "copied_before_claim", path, late)
        u = bl.update(g.path)
        assert u.report["updated"]["rows"] == 310
        _check_gram(u.to_numpy(), np.vstack([a, new]), np.float64)
        full = np.vstack([a, new, late])
    u = bl.update(g.path)
    assert u.report["updated"]["rows_read"] == 20
    _check_gram(u.to_numpy(), full, np.float64)


def test_an_append_during_an_svd_update_is_left_to_the_next_update(tmp_path, monkeypatch):
    """The same for an updatable svd, the append landing during the pass over the new rows: its scores
    had kept 340 of 365 rows, its values those of the 340."""
    import blocklin.linalg.update.svd as us

    a, path = _stored(tmp_path, m=300, n=6, chunks=(64, 6))
    bl.svd(path, 2, out=tmp_path / "S.zarr", updatable=True, seed=0)
    new, late = (np.random.default_rng(s).standard_normal((p, 6)) for s, p in ((1, 40), (2, 25)))
    bl.append(path, new)
    _append_meanwhile(monkeypatch, us, "moments_and_gram", path, late)
    assert bl.update(tmp_path / "S.zarr")[0].shape == (340, 2)
    U, s, Vt = bl.update(tmp_path / "S.zarr")
    full = np.vstack([a, new, late])
    assert U.shape == (365, 2)
    assert_singular_values(s, np.linalg.svd(full, compute_uv=False)[:2], n=365, gram=True)
    # the late rows' scores are P V S^-1: the product bound of P V, and a rounding of the division by s
    # and of the multiplication back, each within an eps of the entry (const 4 rather than 2)
    assert_product(U.to_numpy()[340:] * s, late @ Vt.T, late, Vt.T, const=4.0)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128, np.float32])
def test_gram_update_with_rows_whose_own_gram_underflows(tmp_path, dtype):
    """Rows near 1e-200 (float32: 1e-30) appended to data near 1: their own Gram underflows, the sum does
    not. The update had refused it ("a Gram whose largest entry is about 2^-1328"), as if the result were
    the new rows' Gram alone; a sum beyond the range is still refused."""
    tiny = 1e-30 if dtype == np.float32 else 1e-200
    a, path = _stored(tmp_path, m=300, n=6, dtype=dtype, chunks=(64, 6))
    g = bl.gram(path, tmp_path / "G.zarr")
    new = (np.random.default_rng(3).standard_normal((4, 6)) * tiny).astype(dtype)
    bl.append(path, new)
    u = bl.update(g.path)
    _check_herm(u.to_numpy(), np.vstack([a, new]), dtype)
    bl.append(path, np.full((2, 6), 1e30 if dtype == np.float32 else 1e200, dtype=dtype))
    with pytest.raises(ParameterError, match="must have a Gram matrix within the range"):
        bl.update(g.path)
    _check_herm(bl.open(g.path).to_numpy(), np.vstack([a, new]), dtype)  # the result kept as it was


def _check_herm(g, a, dtype):
    """``_check_gram`` of complex data too: ``A^H A``, the same bound."""
    w = a.astype(np.complex128 if np.iscomplexobj(a) else np.float64)
    assert_gram(g, w.conj().T @ w, w, dtype=dtype, extra=eps(dtype) * float(np.linalg.norm(w)) ** 2)
