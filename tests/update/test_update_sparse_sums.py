"""blocklin.update of the Gram ``S^T S`` and the product ``S^T B`` (``matmul(S, B, trans_a=True)``) of a stored
sparse matrix after rows were appended to it (and to ``B``): the appended rows' sums added to the stored
result, against ``scipy.sparse.vstack`` references of the grown inputs.

The bound, entry-wise (it implies the norm-wise one, and it makes the entries whose ``|S|^T |B|`` is zero
exact). The tasks sum the products of the entries in float64 for the Gram and in the data's precision
within a piece of ``S`` for the product, in any order: ``|fl(sum) - sum| <= gamma_m (|S|^T |B|)_ij``
(Higham 2002, sec. 3.1, eq. 3.5), ``gamma_m = m u / (1 - m u) <= m eps`` for ``m eps < 1``, ``u = eps / 2``
of the working precision (at most the result dtype's ``eps``). Each store of the sum in the result dtype
rounds once more, ``u_d |g_ij| <= u_d (|S|^T |B|)_ij`` (to first order): once at creation and once per
update, whose float64 sum adds the stored value to the new rows' sums before that one rounding. The
reference is a float64 product of the same entries (``gamma_m`` of float64 again). After ``t`` updates::

    |G - S^T B|_ij <= (2 m eps_d + (t + 1) eps_d) (|S|^T |B|)_ij,

with ``eps_d = 2 u_d`` covering the float64 evaluation of ``|S|^T |B|`` itself (a relative ``m eps_64``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import scipy.sparse

import blocklin as bl
from blocklin.cli.main import main
from blocklin.errors import ParameterError
from support.listings import count_listings

N, P = 30, 6


def _rows(p, seed, dtype, *, density=0.15):
    return scipy.sparse.random(p, N, density=density, random_state=seed, format="csr",
                               data_rvs=np.random.default_rng(seed).standard_normal).astype(dtype)


def _dense(p, seed, dtype):
    return np.random.default_rng(seed + 100).standard_normal((p, P)).astype(dtype)


def _check(got, s, b, dtype, updates):
    """``got`` against ``S^T B`` of the stacked rows with the bound of the module docstring."""
    s64 = s.astype(np.float64)
    b64 = b.astype(np.float64) if not scipy.sparse.issparse(b) else b.astype(np.float64)
    ref = np.asarray((s64.T @ b64).todense() if scipy.sparse.issparse(b) else s64.T @ b64)
    absb = abs(b64) if scipy.sparse.issparse(b) else np.abs(b64)
    mag = np.asarray(abs(s64).T @ absb)
    mag = np.asarray(mag.todense()) if scipy.sparse.issparse(mag) else mag
    e = float(np.finfo(dtype).eps)
    bound = (2 * s.shape[0] + updates + 1) * e * mag
    err = np.abs(got.astype(np.float64) - ref)
    assert got.dtype == dtype and (err <= bound).all(), float(np.max(err - bound))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gram_and_product_updated_after_two_appends(tmp_path, dtype):
    s0, b0 = _rows(700, 1, dtype), _dense(700, 1, dtype)
    bl.from_sparse(s0, tmp_path / "S.zarr")
    bl.from_array(b0, tmp_path / "B.zarr", chunks=(128, P))
    g = bl.gram(tmp_path / "S.zarr", tmp_path / "G.zarr")
    c = bl.matmul(tmp_path / "S.zarr", tmp_path / "B.zarr", tmp_path / "C.zarr", trans_a=True)
    bl.matmul(tmp_path / "S.zarr", tmp_path / "S.zarr", tmp_path / "M.zarr", trans_a=True)  # matmul's S^T S
    s, b = s0, b0
    for t, (p, seed) in enumerate(((90, 2), (45, 3)), start=1):
        sn, bn = _rows(p, seed, dtype, density=0.3), _dense(p, seed, dtype)
        bl.append(tmp_path / "S.zarr", sn)
        bl.append(tmp_path / "B.zarr", bn)
        s, b = scipy.sparse.vstack([s, sn]).tocsr(), np.vstack([b, bn])
        ug, uc = bl.update(g.path), bl.update(c.path)
        for u in (ug, uc):
            assert u.report["updated"]["rows_read"] == p and u.report["updated"]["rows"] == s.shape[0]
        _check(ug.to_numpy(), s, s, dtype, t)
        _check(uc.to_numpy(), s, b, dtype, t)
        um = bl.update(tmp_path / "M.zarr")
        assert um.report["updated"]["rows_read"] == p
        _check(um.to_numpy(), s, s, dtype, t)
        for out in (tmp_path / "G.zarr", tmp_path / "C.zarr"):  # the version covered: a second update after the next append reads its rows
            prov = json.load(open(out / "zarr.json"))["attributes"]["blocklin"]
            assert [cv["shape"][0] for cv in prov["covers"]] == [s.shape[0]] * len(prov["covers"])
            assert len(prov["updates"]) == t
    assert np.array_equal(ug.to_numpy(), ug.to_numpy().T)


def test_a_current_result_is_returned_unchanged(tmp_path):
    bl.from_sparse(_rows(200, 4, np.float64), tmp_path / "S.zarr")
    g = bl.gram(tmp_path / "S.zarr", tmp_path / "G.zarr")
    before = open(tmp_path / "G.zarr" / "zarr.json").read()
    u = bl.update(g.path)
    assert u.report == {"operation": "gram", "updated": None, "current": True}
    assert open(tmp_path / "G.zarr" / "zarr.json").read() == before and np.array_equal(u.to_numpy(), g.to_numpy())


def test_a_rewritten_input_is_refused(tmp_path):
    x = _rows(200, 5, np.float64)
    bl.from_sparse(x, tmp_path / "S.zarr")
    bl.from_array(_dense(200, 5, np.float64), tmp_path / "B.zarr", chunks=(64, P))
    g = bl.gram(tmp_path / "S.zarr", tmp_path / "G.zarr").to_numpy()
    c = bl.matmul(tmp_path / "S.zarr", tmp_path / "B.zarr", tmp_path / "C.zarr", trans_a=True).to_numpy()
    bl.from_sparse(x * 2.0, tmp_path / "S.zarr", overwrite=True)  # the same rows' values rewritten
    for out, was in (("G.zarr", g), ("C.zarr", c)):
        with pytest.raises(ParameterError, match="not by blocklin.append"):
            bl.update(tmp_path / out)
        assert np.array_equal(bl.open(tmp_path / out).to_numpy(), was)


def test_products_that_do_not_sum_over_the_rows_are_refused(tmp_path):
    bl.from_sparse(_rows(200, 6, np.float64), tmp_path / "S.zarr")
    bl.from_array(_dense(N, 6, np.float64), tmp_path / "B.zarr", chunks=(N, P))
    bl.matmul(tmp_path / "S.zarr", tmp_path / "B.zarr", tmp_path / "C.zarr")  # S B: grows by rows
    x = np.random.default_rng(6).standard_normal((4, N))
    bl.matmul(x, tmp_path / "S.zarr", tmp_path / "X.zarr", trans_b=True)  # X S^T: grows by columns
    bl.append(tmp_path / "S.zarr", _rows(5, 7, np.float64))
    for out in ("C.zarr", "X.zarr"):
        with pytest.raises(ParameterError, match=r"S\^T S, a product S\^T B.*grew from 200 to 205 rows"):
            bl.update(tmp_path / out)


def test_b_must_grow_by_the_same_rows(tmp_path):
    bl.from_sparse(_rows(200, 8, np.float64), tmp_path / "S.zarr")
    bl.from_array(_dense(200, 8, np.float64), tmp_path / "B.zarr", chunks=(64, P))
    bl.matmul(tmp_path / "S.zarr", tmp_path / "B.zarr", tmp_path / "C.zarr", trans_a=True)
    bl.append(tmp_path / "S.zarr", _rows(5, 9, np.float64))
    with pytest.raises(ParameterError, match=r"^b: must have grown by the rows A grew by"):
        bl.update(tmp_path / "C.zarr")


def test_update_beyond_the_range_is_refused_and_the_result_kept(tmp_path):
    """Appended rows near ``1e160``: their Gram and product leave float64's range. Refused as ``gram`` and
    ``matmul`` of the grown inputs refuse them; the stored results are unchanged."""
    x = _rows(100, 10, np.float64)
    x.data *= 1e150
    bl.from_sparse(x, tmp_path / "S.zarr")
    bl.from_array(_dense(100, 10, np.float64) * 1e150, tmp_path / "B.zarr", chunks=(64, P))
    g = bl.gram(tmp_path / "S.zarr", tmp_path / "G.zarr").to_numpy()
    c = bl.matmul(tmp_path / "S.zarr", tmp_path / "B.zarr", tmp_path / "C.zarr", trans_a=True).to_numpy()
    y = _rows(10, 11, np.float64, density=0.5)
    y.data *= 1e160
    bl.append(tmp_path / "S.zarr", y)
    bl.append(tmp_path / "B.zarr", _dense(10, 11, np.float64) * 1e160)
    with pytest.raises(ParameterError, match=r"^a: must have a Gram matrix within the range of float64.*the stored "
                                             r"result is unchanged"):
        bl.update(tmp_path / "G.zarr")
    with pytest.raises(ParameterError, match=r"^a: must give a product within float64's range.*the stored result "
                                             r"is unchanged"):
        bl.update(tmp_path / "C.zarr")
    assert np.array_equal(bl.open(tmp_path / "G.zarr").to_numpy(), g)
    assert np.array_equal(bl.open(tmp_path / "C.zarr").to_numpy(), c)


@pytest.mark.parametrize("dtype,e", [(np.float64, -530), (np.float32, -70)])
def test_a_product_update_below_the_normal_numbers_is_refused(tmp_path, dtype, e):
    """Old rows of ``S`` without entries (a zero ``S^T B``), then rows near ``2^-530`` (float32 ``2^-70``)
    appended to ``S`` and ``B``: ``c max |s_new| max |b_new| + max |C|`` is below ``2^minexp``, so every entry
    of the update is a subnormal of few digits. Refused as ``matmul`` of the grown inputs refuses it, the
    stored result unchanged."""
    bl.from_sparse(scipy.sparse.csr_matrix((60, N), dtype=dtype), tmp_path / "S.zarr")
    bl.from_array(np.ldexp(_dense(60, 12, np.float64), e).astype(dtype), tmp_path / "B.zarr", chunks=(32, P))
    c = bl.matmul(tmp_path / "S.zarr", tmp_path / "B.zarr", tmp_path / "C.zarr", trans_a=True).to_numpy()
    assert not c.any()
    y = _rows(10, 13, np.float64, density=0.5)
    y.data = np.ldexp(y.data, e)
    bl.append(tmp_path / "S.zarr", y.astype(dtype))
    bl.append(tmp_path / "B.zarr", np.ldexp(_dense(10, 13, np.float64), e).astype(dtype))
    with pytest.raises(ParameterError, match=r"^a: must give a product within \w+'s normal range"):
        bl.matmul(tmp_path / "S.zarr", tmp_path / "B.zarr", trans_a=True)
    with pytest.raises(ParameterError, match=rf"^a: must give a product within {np.dtype(dtype).name}'s normal "
                                             r"range .*max \|c\| \(the stored result\).*Fix: the stored result is "
                                             r"unchanged"):
        bl.update(tmp_path / "C.zarr")
    assert np.array_equal(bl.open(tmp_path / "C.zarr").to_numpy(), c)


_KILL = textwrap.dedent("""
    import os, signal, sys
    import blocklin as bl
    import blocklin.linalg.products.sparse_gemm as sg
    def killed(*args, **kw):  # the new rows are summed; killed as the result is written
        os.kill(os.getpid(), signal.SIGKILL)
    sg.write_block = killed
    bl.update(sys.argv[1], scheduler="sync")
""")


@pytest.mark.parametrize("out", ["G.zarr", "C.zarr"])
def test_sigkill_during_update_keeps_the_old_result_then_resume(tmp_path, out):
    s0, b0 = _rows(300, 14, np.float64), _dense(300, 14, np.float64)
    bl.from_sparse(s0, tmp_path / "S.zarr")
    bl.from_array(b0, tmp_path / "B.zarr", chunks=(64, P))
    bl.gram(tmp_path / "S.zarr", tmp_path / "G.zarr")
    bl.matmul(tmp_path / "S.zarr", tmp_path / "B.zarr", tmp_path / "C.zarr", trans_a=True)
    sn, bn = _rows(40, 15, np.float64), _dense(40, 15, np.float64)
    bl.append(tmp_path / "S.zarr", sn)
    bl.append(tmp_path / "B.zarr", bn)
    before = bl.open(tmp_path / out).to_numpy()
    p = subprocess.run([sys.executable, "-c", _KILL, str(tmp_path / out)], cwd=tmp_path)
    assert p.returncode == -9
    assert np.array_equal(bl.open(tmp_path / out).to_numpy(), before)  # the old result, whole
    assert any(f.startswith(f".{out}.partial-") for f in os.listdir(tmp_path))
    u = bl.update(tmp_path / out, resume=True)
    s = scipy.sparse.vstack([s0, sn]).tocsr()
    _check(u.to_numpy(), s, s if out == "G.zarr" else np.vstack([b0, bn]), np.float64, 1)
    assert not any(f.startswith(f".{out}.partial-") for f in os.listdir(tmp_path))


def test_cli_update_of_a_sparse_gram_and_product(tmp_path, capsys):
    s0, b0 = _rows(250, 16, np.float32), _dense(250, 16, np.float32)
    bl.from_sparse(s0, tmp_path / "S.zarr")
    bl.from_array(b0, tmp_path / "B.zarr", chunks=(64, P))
    s, b = str(tmp_path / "S.zarr"), str(tmp_path / "B.zarr")
    assert main(["gram", s, "-o", str(tmp_path / "G.zarr")]) == 0
    assert main(["gemm", s, b, "-o", str(tmp_path / "C.zarr"), "--trans-a"]) == 0
    sn, bn = _rows(30, 17, np.float32), _dense(30, 17, np.float32)
    scipy.sparse.save_npz(tmp_path / "new.npz", sn)
    np.save(tmp_path / "bn.npy", bn)
    assert main(["append", s, str(tmp_path / "new.npz")]) == 0
    assert main(["append", b, str(tmp_path / "bn.npy")]) == 0
    capsys.readouterr()
    full = scipy.sparse.vstack([s0, sn]).tocsr()
    for out, other in (("G.zarr", full), ("C.zarr", np.vstack([b0, bn]))):
        assert main(["update", str(tmp_path / out), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["updated"]["rows_read"] == 30
        _check(bl.open(tmp_path / out).to_numpy(), full, other, np.float32, 1)


@pytest.mark.slow
def test_sparse_sums_updated_on_a_cluster(tmp_path, client):
    """The updates' tasks on a LocalCluster's workers: within the bound, and the bits of the local scheduler's."""
    s0, b0 = _rows(400, 18, np.float64), _dense(400, 18, np.float64)
    bl.from_sparse(s0, tmp_path / "S.zarr")
    bl.from_array(b0, tmp_path / "B.zarr", chunks=(64, P))
    for sched, tag in ((client, ""), ("sync", "-local")):
        bl.gram(tmp_path / "S.zarr", tmp_path / f"G{tag}.zarr", scheduler=sched)
        bl.matmul(tmp_path / "S.zarr", tmp_path / "B.zarr", tmp_path / f"C{tag}.zarr", trans_a=True, scheduler=sched)
    sn, bn = _rows(60, 19, np.float64), _dense(60, 19, np.float64)
    bl.append(tmp_path / "S.zarr", sn)
    bl.append(tmp_path / "B.zarr", bn)
    s = scipy.sparse.vstack([s0, sn]).tocsr()
    for name, other in (("G", s), ("C", np.vstack([b0, bn]))):
        got = bl.update(tmp_path / f"{name}.zarr", scheduler=client).to_numpy()
        _check(got, s, other, np.float64, 1)
        assert got.tobytes() == bl.update(tmp_path / f"{name}-local.zarr", scheduler="sync").to_numpy().tobytes()


def test_rows_appended_after_the_matrix_was_opened_are_read_by_the_update(tmp_path):
    """A Gram or product covers the rows its run read: rows appended after the handle was opened (and before
    the output's claim) had been recorded as covered, so the update would have called the result current
    without them."""
    s0, b0 = _rows(300, 20, np.float64), _dense(300, 20, np.float64)
    bl.from_sparse(s0, tmp_path / "S.zarr")
    bl.from_array(b0, tmp_path / "B.zarr", chunks=(64, P))
    s, b = bl.open(tmp_path / "S.zarr"), bl.open(tmp_path / "B.zarr")  # 300 rows
    sn, bn = _rows(40, 21, np.float64), _dense(40, 21, np.float64)
    bl.append(tmp_path / "S.zarr", sn)
    bl.append(tmp_path / "B.zarr", bn)
    bl.gram(s, tmp_path / "G.zarr")
    bl.matmul(s, b, tmp_path / "C.zarr", trans_a=True)
    full = scipy.sparse.vstack([s0, sn]).tocsr()
    for out, other in (("G.zarr", full), ("C.zarr", np.vstack([b0, bn]))):
        prov = json.load(open(tmp_path / out / "zarr.json"))["attributes"]["blocklin"]
        assert [c["shape"][0] for c in prov["covers"]] == [300] * len(prov["covers"])
        u = bl.update(tmp_path / out)
        assert u.report["updated"]["rows_read"] == 40
        _check(u.to_numpy(), full, other, np.float64, 1)


def test_a_sparse_update_lists_the_matrix_once_at_its_open_and_once_at_the_commit(tmp_path, monkeypatch):
    """Cost: the update opens ``S`` (one listing, its handle's) and its run takes that stamp; the commit lists
    it once more. The output's claim had taken a listing of its own, the handle's left unused."""
    s0, b0 = _rows(200, 6, np.float64), _dense(200, 6, np.float64)
    S = tmp_path / "S.zarr"
    bl.from_sparse(s0, S)
    bl.from_array(b0, tmp_path / "B.zarr", chunks=(64, P))
    g = bl.gram(S, tmp_path / "G.zarr")
    c = bl.matmul(S, tmp_path / "B.zarr", tmp_path / "C.zarr", trans_a=True)
    sn, bn = _rows(40, 7, np.float64), _dense(40, 7, np.float64)
    bl.append(S, sn)
    bl.append(tmp_path / "B.zarr", bn)
    listed = count_listings(monkeypatch)
    s, b = scipy.sparse.vstack([s0, sn]).tocsr(), np.vstack([b0, bn])
    for out, other in ((g, s), (c, b)):
        listed.clear()
        u = bl.update(out.path)
        assert listed.count(str(S)) == 2, listed
        _check(u.to_numpy(), s, other, np.float64, 1)
