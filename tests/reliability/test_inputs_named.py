"""Inputs a randomized search of the solves found refused for the wrong reason, or not taken: each is
now named for what it is (a NaN in ``b``, an empty matrix) or taken as its neighbours take it (a stored
``b`` for ``lstsq``)."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import NonFiniteError, ParameterError, ShapeError
from support.interrupts import backdate
from support.tolerances import eps

#: The magnitudes a cast to float32 keeps with its full precision: from its smallest normal times 2^23 (below,
#: a few bits or none) up to its largest.
F32_LOW, F32_MAX = float(np.finfo(np.float32).tiny) * 2.0**23, float(np.finfo(np.float32).max)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("assume_a", ["gen", "pos"])
def test_a_nan_in_b_of_a_square_solve_names_b(assume_a, bad, tmp_path):
    """It had come out of the substitutions as "a singular or overflowing diagonal block of U" for a
    matrix of condition 1.3."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((40, 40)) + 40 * np.eye(40)
    a = a @ a.T if assume_a == "pos" else a
    b = rng.standard_normal((40, 2))
    b[3, 1] = bad
    with pytest.raises(NonFiniteError, match=r"b: must be finite.*at \[3, 1\]"):
        bl.solve(a, b, assume_a=assume_a, temp_dir=str(tmp_path))
    x = bl.solve(a, np.nan_to_num(b, posinf=0.0), assume_a=assume_a, temp_dir=str(tmp_path))  # the fix it names
    assert np.isfinite(x.to_numpy()).all()


def test_lstsq_takes_a_stored_b(tmp_path):
    """As ``a`` and every other solve's ``b``: a path had been read as a 0-d array (``got shape ()``)."""
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((60, 5)), rng.standard_normal((60, 2))
    bl.from_array(b, tmp_path / "b.zarr")
    got = bl.lstsq(a, str(tmp_path / "b.zarr"))[0]
    np.testing.assert_array_equal(np.asarray(got), np.asarray(bl.lstsq(a, b)[0]))


@pytest.mark.parametrize("call, shape", [("inv", (0, 0)), ("qr", (0, 0)), ("qr", (5, 0))])
def test_an_empty_matrix_is_refused_by_name(call, shape, tmp_path):
    """A bare ``ZeroDivisionError`` from the planner before."""
    with pytest.raises(ShapeError, match=r"a: must have at least one row and one column.*got \d x 0"):
        getattr(bl, call)(np.zeros(shape), temp_dir=str(tmp_path))


@pytest.mark.parametrize("far", [1e200, 1e-200])
@pytest.mark.parametrize("call", ["solve gen", "solve pos", "inv"])
def test_mixed_precision_of_data_beyond_float32_names_the_range(call, far, tmp_path):
    """``precision="mixed"`` factors in float32: data of ``1e+-200`` (condition 1) cast to Inf or 0 and was
    refused as a singular or indefinite ``A``. It is refused for its range, named as the products' refusal
    names it (the range kept with full precision, as ``matmul(precision="float32")`` says), with the fix that
    works."""
    rng = np.random.default_rng(0)
    q, _ = np.linalg.qr(rng.standard_normal((3, 3)))
    a = np.eye(3) * far if call == "solve pos" else q * far
    b = rng.standard_normal(3) * far
    kw = dict(temp_dir=str(tmp_path))
    if call == "inv":
        run = lambda **p: bl.inv(np.kron(np.eye(60), a), memory="256KiB", **p, **kw)  # noqa: E731
    else:
        run = lambda **p: bl.solve(a, b, assume_a=call.split()[1], **p, **kw)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # NumPy's own, of the cast that overflowed
        with pytest.raises(ParameterError, match=r"precision: a float32 factorization needs A's entries within "
                           + re.escape(f"float32's range (between {F32_LOW:.3g} and {F32_MAX:.3g}; ")
                           + r".*max \|A\| = .*e[+-]\d+"):
            run(precision="mixed")
    assert np.isfinite(run().to_numpy()).all()  # precision='double', the fix it names


@pytest.mark.parametrize("dtype, far", [(np.float32, 2.0 ** -122), (np.float32, 2.0 ** 110), (np.float64, 2.0 ** -1000),
                                        (np.float64, 2.0 ** 960)])
def test_inverse_of_a_block_far_from_one(dtype, far, tmp_path):
    """A block of condition 10 whose inverse fits its dtype: LAPACK's ``gecon`` guards returned ``rcond = 0``
    for a float32 block of ``1e-37`` (inverse ``1e37``), refused as singular. The block is factored scaled by
    a power of two (exact): the bits of ``A`` itself, scaled back."""
    rng = np.random.default_rng(12)
    n = 80
    q1, _ = np.linalg.qr(rng.standard_normal((n, n)))
    q2, _ = np.linalg.qr(rng.standard_normal((n, n)))
    a = ((q1 * np.logspace(0, -1, n)) @ q2.T).astype(dtype)
    from blocklin.runtime.powers import ldexp

    e = int(np.log2(far))
    plain = bl.inv(a, temp_dir=str(tmp_path)).to_numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # NumPy's own: the subnormal inputs of the reference
        x = ldexp(a, e)
        got = bl.inv(x, temp_dir=str(tmp_path)).to_numpy()
        assert np.isfinite(bl.cond(x, 1, temp_dir=str(tmp_path)))
    if np.array_equal(ldexp(x, -e), a):  # every entry kept its bits: the same inverse, scaled back
        np.testing.assert_array_equal(got, ldexp(plain, -e))
    else:  # some entries subnormal (rounded): LU's bound on the rounded matrix, kappa n eps, against float64
        ref = np.linalg.inv(ldexp(x, -e).astype(np.float64))
        err = np.linalg.norm(ldexp(got.astype(np.float64), e) - ref) / np.linalg.norm(ref)
        assert err <= 4 * n * eps(dtype) * np.linalg.cond(a.astype(np.float64)), err


def test_clean_leaves_a_folder_blocklin_did_not_write(tmp_path):
    """A record-less ``.NAME.partial-...`` older than the lease is removed only where it is a zarr store
    under blocklin's token (16 hex digits): a user's ``.data.zarr.partial-abc`` of notes was removed."""
    import os
    import time

    from blocklin.storage.cleanup import clean

    old = time.time() - 7200
    user = tmp_path / ".data.zarr.partial-abc"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    look_alike = tmp_path / ".data.zarr.partial-0123456789abcdef"  # blocklin's token, not a zarr store
    look_alike.mkdir()
    (look_alike / "notes.txt").write_text("mine too")
    ours = tmp_path / ".out.zarr.partial-fedcba9876543210"  # what an older blocklin left: a zarr store
    bl.from_array(np.ones((2, 2)), tmp_path / "x.zarr")
    os.rename(tmp_path / "x.zarr", ours)
    backdate((user, look_alike, ours), old)
    from blocklin.storage.records import OWNER_RECORD

    (ours / OWNER_RECORD).unlink(missing_ok=True)
    got = {os.path.basename(i.path): i.action for i in clean([str(tmp_path)])}
    assert got[user.name] == "skipped" and got[look_alike.name] == "skipped" and got[ours.name] == "removed"
    assert (user / "notes.txt").read_text() == "mine" and (look_alike / "notes.txt").exists()
    assert not ours.exists()


def test_a_killed_removal_leaves_the_owner_record(tmp_path, monkeypatch):
    """A gone run's folder is removed with its owner record last: a removal killed half way (here, at its
    first subfolder) leaves a folder that still says whose it was, which ``clean`` removes later; in any
    order a killed removal had left a record-less remnant that ``clean`` skips forever."""
    import importlib

    from blocklin.storage.records import OWNER_RECORD

    be = importlib.import_module("blocklin.storage.backend")  # the module (the package exports its function)
    folder = tmp_path / "blocklin-stage-0123456789ab"
    (folder / "a.zarr" / "c").mkdir(parents=True)
    (folder / "a.zarr" / "c" / "0").write_bytes(b"x")
    (folder / OWNER_RECORD).write_text("{}")
    real = be.shutil.rmtree

    def killed(path, *args, **kwargs):
        if str(path) != str(folder):
            raise KeyboardInterrupt
        return real(path, *args, **kwargs)

    monkeypatch.setattr(be.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        be.rmtree_owner_last(str(folder))
    assert (folder / OWNER_RECORD).exists()
    monkeypatch.undo()
    be.rmtree_owner_last(str(folder))
    assert not folder.exists()


def test_names_from_a_numpy_array_are_taken(tmp_path):
    """``method=np.str_("rsvd")`` (an element of an array of method names, as a loop over
    ``np.array([...])`` gives) was refused as not one of the methods; it is taken as the plain ``str``,
    with the same result, while ``True`` is still not ``1``."""
    from blocklin.validate import choice

    rng = np.random.default_rng(0)
    a = rng.standard_normal((60, 20))
    for method in np.array(["rsvd", "lanczos"]):
        got = bl.svd(a, k=3, method=method, seed=0, temp_dir=str(tmp_path))
        ref = bl.svd(a, k=3, method=str(method), seed=0, temp_dir=str(tmp_path))
        np.testing.assert_array_equal(got.s, ref.s)
        assert type(got.report["method"]) is str
    assert type(choice("p", np.str_("gen"), ("gen", "pos"), fix="")) is str
    with pytest.raises(ParameterError, match="must be one of"):
        choice("p", 1, (True, False), fix="")
    with pytest.raises(ParameterError, match="must be one of"):
        choice("p", np.str_("other"), ("gen", "pos"), fix="")
