"""Every operation reads from and writes to ``s3://`` (a real S3 API server on loopback) with the
same bits as the local run: storage moves bytes, it never changes a plan or a summation order."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import blocklin
from blocklin.storage.backend import backend
from blocklin.storage.location import as_location
from blocklin.storage.recorded_peaks import recorded

RNG = np.random.default_rng(11)
A = RNG.standard_normal((120, 90))
B = RNG.standard_normal((90, 60))
SPD = A.T @ A / 120 + np.eye(90)  # well conditioned: inv and eigsh converge in a few steps
MEM = "1MiB"


@pytest.fixture(scope="module")
def stores(s3_server, tmp_path_factory):
    """The same inputs on local disk and in a fresh bucket: ``(local, remote, opts)`` name factories.

    Shared by the module's tests (each writes its own outputs), so the inputs are written once.
    """
    import uuid

    import s3fs

    opts = dict(s3_server)
    base = f"s3://blocklin-{uuid.uuid4().hex[:10]}"
    s3fs.S3FileSystem(**opts).mkdir(base[5:])
    tmp_path = tmp_path_factory.mktemp("s3-local")
    for name, x, ch in (("A", A, (40, 30)), ("B", B, (30, 20)), ("S", SPD, (30, 30))):
        blocklin.from_array(x, tmp_path / f"{name}.zarr", chunks=ch)
        blocklin.from_array(x, f"{base}/{name}.zarr", chunks=ch, storage_options=opts)

    def local(name):
        return str(tmp_path / name)

    def remote(name):
        return f"{base}/{name}"
    return local, remote, opts


def _bits(m) -> np.ndarray:
    return np.asarray(m.to_numpy() if hasattr(m, "to_numpy") else m)


def test_gemm(stores):
    local, remote, opts = stores
    ref = blocklin.matmul(local("A.zarr"), local("B.zarr"), local("C.zarr"), memory=MEM)
    got = blocklin.matmul(remote("A.zarr"), remote("B.zarr"), remote("C.zarr"), memory=MEM, storage_options=opts,
                          overwrite=True)
    np.testing.assert_array_equal(_bits(got), _bits(ref))
    assert got.path == remote("C.zarr") and got.provenance["inputs"] == [remote("A.zarr"), remote("B.zarr")]
    # Only the array in the committed output, chunks and zarr.json, and its peaks record (the output's own,
    # written after the commit): no marker, no work file.
    from blocklin.storage.records import PEAKS_COLUMNS, PEAKS_RECORD

    keys = backend(got.location).keys("")
    assert "zarr.json" in keys and all(k in ("zarr.json", PEAKS_RECORD, PEAKS_COLUMNS) or k.startswith("c/")
                                       for k in keys)
    assert got.report["output_peaks_recorded"] is True and PEAKS_RECORD in keys
    # An S3-backed zarr.Array is read in place, not copied to a local temp dir.
    import zarr

    arr = zarr.open_array(store=zarr.storage.FsspecStore.from_url(remote("A.zarr"), storage_options=opts), mode="r")
    again = blocklin.matmul(arr, remote("B.zarr"), memory=MEM, storage_options=opts)
    np.testing.assert_array_equal(_bits(again), _bits(ref))
    assert again.provenance["inputs"][0] == remote("A.zarr")


def test_inverse(stores):
    local, remote, opts = stores
    ref = blocklin.inv(local("S.zarr"), out=local("X.zarr"), memory=MEM)
    got = blocklin.inv(remote("S.zarr"), out=remote("X.zarr"), memory=MEM, storage_options=opts)
    np.testing.assert_array_equal(_bits(got), _bits(ref))


def test_solve(stores):
    local, remote, opts = stores
    y = RNG.standard_normal((120, 3))
    ref = blocklin.solve(local("A.zarr"), y, lam=0.1, out=local("x.zarr"), memory=MEM)
    got = blocklin.solve(remote("A.zarr"), y, lam=0.1, out=remote("x.zarr"), memory=MEM, storage_options=opts,
                         temp_dir=remote("tmp"))
    np.testing.assert_array_equal(_bits(got), _bits(ref))
    assert not backend(as_location(remote("tmp"), opts)).keys("")  # staged y and intermediates removed


def test_svd(stores):
    local, remote, opts = stores
    ref = blocklin.svd(local("A.zarr"), 4, out=local("svd.zarr"), memory=MEM, seed=0)
    got = blocklin.svd(remote("A.zarr"), 4, out=remote("svd.zarr"), memory=MEM, seed=0, storage_options=opts)
    for r, g in zip(ref, got):
        np.testing.assert_array_equal(_bits(g), _bits(r))
    m = blocklin.open(remote("svd.zarr") + "/S", storage_options=opts)
    np.testing.assert_array_equal(m.to_numpy(), ref[1])
    opened = blocklin.open(remote("svd.zarr"), storage_options=opts)  # the group: the result as svd returned it
    np.testing.assert_array_equal(opened.s, ref[1])
    np.testing.assert_array_equal(opened.Vt, ref[2])
    np.testing.assert_array_equal(opened.U.to_numpy(), ref[0].to_numpy())


def test_eigsh(stores):
    local, remote, opts = stores
    ref = blocklin.eigsh(local("S.zarr"), 3, memory=MEM, seed=0)
    got = blocklin.eigsh(remote("S.zarr"), 3, memory=MEM, seed=0, storage_options=opts)
    for r, g in zip(ref, got):
        np.testing.assert_array_equal(_bits(g), _bits(r))


def test_convert_to_from_and_within_s3(stores, tmp_path):
    local, remote, opts = stores
    np.save(tmp_path / "a.npy", A)
    up = blocklin.convert(tmp_path / "a.npy", remote("up.zarr"), chunks=(25, 35), storage_options=opts)
    assert up["output"] == remote("up.zarr")
    re = blocklin.convert(remote("up.zarr"), remote("re.zarr"), chunks=(50, 45), codec="zstd", storage_options=opts)
    down = blocklin.convert(remote("re.zarr"), tmp_path / "down.npy", storage_options=opts)
    np.testing.assert_array_equal(np.load(down["output"]), A)
    m = blocklin.open(remote("re.zarr"), storage_options=opts)
    assert m.chunks == (50, 45) and m.codec == "zstd" and re["bytes_written"] > 0
    np.testing.assert_array_equal(m.to_numpy(), A)
    # the peaks recorded with each zarr output hold for it (ETags), and a job takes them
    assert up["peaks_recorded"] and re["peaks_recorded"]
    assert recorded(m.location, m.shape).amax == float(np.abs(A).max())
    g = blocklin.gram(remote("re.zarr"), memory=MEM, storage_options=opts)
    assert g.report["peaks_recorded"] == ["a"]


def test_cli_storage_option_and_info(stores, capsys):
    from blocklin.cli.main import main

    local, remote, opts = stores
    so = [f"--storage-option=key={opts['key']}", f"--storage-option=secret={opts['secret']}",
          f"--storage-option=endpoint_url={opts['endpoint_url']}"]
    assert main(["gemm", remote("A.zarr"), remote("B.zarr"), "-o", remote("Ccli.zarr"), "--memory", MEM,
                 "--json", "--temp-dir", remote("tmp-cli"), *so]) == 0
    assert json.loads(capsys.readouterr().out)["output"] == remote("Ccli.zarr")
    ref = blocklin.matmul(local("A.zarr"), local("B.zarr"), memory=MEM)
    np.testing.assert_array_equal(blocklin.open(remote("Ccli.zarr"), storage_options=opts).to_numpy(), _bits(ref))
    assert main(["info", remote("Ccli.zarr"), "--json", *so]) == 0
    assert json.loads(capsys.readouterr().out)["provenance"]["operation"] == "matmul"
    assert not backend(as_location(remote("tmp-cli"), opts)).keys("")
    assert not os.path.exists("s3:")  # nothing was written to a local path named like the URL


def test_svd_gram_route_streamed_from_s3(stores):
    """The default's Gram route (a narrow A, streamed: the SYRK pass, the Rayleigh-Ritz pass and its
    intermediates under an S3 temp dir) agrees with the local run and with NumPy's singular values."""
    local, remote, opts = stores
    x = RNG.standard_normal((3000, 40)) / np.sqrt(1.0 + np.arange(40))
    blocklin.from_array(x, local("N.zarr"), chunks=(500, 40))
    blocklin.from_array(x, remote("N.zarr"), chunks=(500, 40), storage_options=opts)
    ref = blocklin.svd(local("N.zarr"), 5, memory="1MiB", seed=0)
    got = blocklin.svd(remote("N.zarr"), 5, out=remote("svdN.zarr"), memory="1MiB", seed=0, storage_options=opts,
                       temp_dir=remote("tmpN"))
    assert got.report["method"] == "gram" and got.report["passes"] == 2 and not got.report["in_core"]
    # Local chunk files are read directly, S3 objects by range requests with zarr's temporaries counted:
    # the strips, and so the order of the sums, differ (as for every streamed method), so the runs agree
    # to rounding, not bit for bit
    tol = 10 * np.sqrt(40) * np.finfo(np.float64).eps
    np.testing.assert_allclose(got.s, ref.s, rtol=0, atol=tol * ref.s[0])
    np.testing.assert_allclose(np.abs(_bits(got.U)), np.abs(_bits(ref.U)), rtol=0, atol=1e-12)
    s0 = np.linalg.svd(x, compute_uv=False)[:5]
    assert np.max(np.abs(got.s - s0)) <= tol * s0[0]
    assert not backend(as_location(remote("tmpN"), opts)).keys("")  # intermediates removed


@pytest.mark.parametrize("end", ["success", "error", "error with resume", "interrupt"])
def test_work_folders_on_s3_leave_nothing_but_what_a_resume_needs(s3, monkeypatch, tmp_path, end):
    """A job whose temp dir and output are both on an object store (the inverse: work stores, resumable
    stages, the output committed in place). After success nothing is left under the temp prefix and the
    bucket holds the input and the output; after an error nothing is left (no partial, no work folder);
    where the run is resumable (an error with ``resume``, an interrupt) the owned partial output and its
    work folder are kept, the rerun with ``resume`` gives the uninterrupted run's bits and removes both."""
    from blocklin.runtime.stages import Stages

    base, opts = s3
    rng = np.random.default_rng(5)
    a = rng.standard_normal((160, 160))
    blocklin.from_array(a, f"{base}/A.zarr", chunks=(64, 64), storage_options=opts)
    kw = dict(memory="256KiB", refine=1, scheduler="sync", storage_options=opts, temp_dir=f"{base}/tmp")
    local = blocklin.from_array(a, tmp_path / "A.zarr", chunks=(64, 64))
    ref = blocklin.inv(local, **{**kw, "storage_options": None, "temp_dir": str(tmp_path)})  # the same plan

    def keys(prefix):
        return sorted(backend(as_location(f"{base}/{prefix}", opts)).keys(""))

    def tops():
        return sorted({k.split("/", 1)[0] for k in backend(as_location(base, opts)).keys("")})

    if end != "success":
        step, real = [0], Stages.run
        error = KeyboardInterrupt if end == "interrupt" else RuntimeError

        def failing(self, name, fn):
            step[0] += 1
            if step[0] == 6:  # the second leaf: work stores and finished stages exist
                raise error("simulated failure")
            return real(self, name, fn)

        monkeypatch.setattr(Stages, "run", failing)
        with pytest.raises(error, match="simulated failure"):
            blocklin.inv(f"{base}/A.zarr", out=f"{base}/X.zarr", resume=end == "error with resume", **kw)
        monkeypatch.setattr(Stages, "run", real)
        if end == "error":
            assert keys("tmp") == [] and tops() == ["A.zarr"]
            return
        assert keys("tmp") and "X.zarr" in tops()  # kept for the rerun: the work folder and the owned partial
        with pytest.raises(Exception, match="resume|unfinished|uncommitted"):
            blocklin.open(f"{base}/X.zarr", storage_options=opts)  # not a finished output
    x = blocklin.inv(f"{base}/A.zarr", out=f"{base}/X.zarr", resume=end != "success", **kw)
    if end != "success":
        assert x.report["resumed"] and x.report["stages_skipped"] > 0
    np.testing.assert_array_equal(_bits(x), _bits(ref))
    assert keys("tmp") == [] and tops() == ["A.zarr", "X.zarr"]


def _root_reads(monkeypatch, name):
    """A counter of the GETs of the group or array ``name``'s own ``zarr.json`` through blocklin's object
    store backend (one ``cat_file`` each)."""
    from blocklin.storage.backend import FsspecBackend

    count = [0]
    real = FsspecBackend.read_bytes

    def counted(self, key):
        count[0] += key == "zarr.json" and self.loc.url.rstrip("/").endswith(name)
        return real(self, key)

    monkeypatch.setattr(FsspecBackend, "read_bytes", counted)
    return count


@pytest.mark.parametrize("what", ["svd", "pca", "array", "sparse"])
def test_open_reads_a_groups_metadata_once(stores, monkeypatch, tmp_path, what):
    """``blocklin.open`` reads the root ``zarr.json`` once to tell a sparse matrix, a stored result or an
    array (it had read a group's twice, an array's three times: one GET each on an object store), and
    gives the same result as the local open (against NumPy's: the stored bits)."""
    import scipy.sparse

    local, remote, opts = stores
    name = f"open-{what}.zarr"
    if what in ("svd", "pca"):
        call = blocklin.svd if what == "svd" else blocklin.pca
        ref = call(A, 3, seed=0, out=remote(name), storage_options=opts)
    elif what == "array":
        blocklin.from_array(A, remote(name), storage_options=opts)
    else:
        x = scipy.sparse.random(30, 20, density=0.2, random_state=0, format="csr")
        blocklin.from_sparse(x, tmp_path / name)
        import s3fs

        s3fs.S3FileSystem(**opts).put(str(tmp_path / name), remote(name)[5:], recursive=True)
    count = _root_reads(monkeypatch, name)
    got = blocklin.open(remote(name), storage_options=opts)
    # a group: its metadata alone; an array or a sparse group: once more by the object opened (its own check)
    assert count[0] == (1 if what in ("svd", "pca") else 2), count[0]
    if what == "svd":
        np.testing.assert_array_equal(got.s, ref.s)
    elif what == "pca":
        assert type(got).__name__ == "PCAResult"
        np.testing.assert_array_equal(got.components_, ref.components_)
    elif what == "array":
        np.testing.assert_array_equal(got.to_numpy(), A)
    else:
        np.testing.assert_array_equal(got.to_scipy().toarray(), x.toarray())
