"""One storage test suite, run against every backend (zarr's ``StoreTests`` pattern).

:class:`BackendTests` holds the tests; each subclass only says where its stores live: a local
folder (rename commit), ``file://`` and ``memory://`` URLs and a real S3 API server on loopback
(in-place commit). The same assertions hold everywhere: bytes round-trip, arrays round-trip through
the opener, an output is invisible until committed, an interrupted job leaves an output that
``open``/``info`` refuse and ``resume`` completes with the same bits, nothing but the array is left
in a committed output.
"""

from __future__ import annotations

import pickle
import uuid

import numpy as np
import pytest

import blocklin
from blocklin.errors import OutputExistsError, OutputIsInputError, StoreNotFoundError, UncommittedOutputError
from blocklin.storage.atomic import AtomicOutput
from blocklin.storage.backend import backend, remove
from blocklin.storage.recorded_peaks import recorded
from blocklin.storage.records import PEAKS_COLUMNS, PEAKS_RECORD
from blocklin.storage.location import Location, as_location
from blocklin.storage.zarr_store import create_array, open_zarr, read_block, write_block

RNG = np.random.default_rng(7)
A = RNG.standard_normal((96, 80))
B = RNG.standard_normal((80, 72))


class _Interrupt(RuntimeError):
    pass


def _interrupt_after(monkeypatch, n: int) -> list:
    """Make the GEMM tile task fail after ``n`` tiles (a job killed mid-way); returns the call log."""
    import blocklin.runtime.tiles as tiles_mod

    real = tiles_mod.run_tile
    calls: list = []

    def flaky(*args, **kw):
        if len(calls) >= n:
            raise _Interrupt("killed")
        calls.append(args[1:3])
        return real(*args, **kw)

    monkeypatch.setattr(tiles_mod, "run_tile", flaky)
    return calls


class BackendTests:
    """Subclasses define the ``root`` fixture: ``(url_or_path, storage_options)``."""

    in_place = True

    @pytest.fixture
    def loc(self, root):
        base, opts = root

        def make(name: str) -> Location:
            return as_location(f"{base}/{name}", opts)
        return make

    # -- bytes ----------------------------------------------------------------------------------
    def test_bytes_round_trip(self, loc):
        be = backend(loc("b"))
        assert not be.exists("x/y")
        be.write_bytes("x/y", b"hello")
        be.write_text("z", "text")
        assert be.exists("x/y") and be.read_bytes("x/y") == b"hello" and be.read_text("z") == "text"
        assert be.keys("") == ["x/y", "z"]
        assert be.size("") == 9
        s1 = be.stamp("z")
        be.write_text("z", "other text")
        assert be.stamp("z") != s1 and be.stamp("missing") is None
        be.remove("x")
        assert be.keys("") == ["z"]
        remove(loc("b"))
        assert not be.exists("z")

    def test_location_is_a_small_picklable_value(self, loc):
        l1 = loc("A.zarr")
        assert pickle.loads(pickle.dumps(l1)) == l1 and hash(l1) == hash(as_location(l1))
        assert (l1 / "c").parent == l1 and l1.name == "A.zarr"
        assert l1.is_local == (not self.in_place)
        assert "secret" not in repr(l1)

    # -- arrays ----------------------------------------------------------------------------------
    def test_array_round_trip(self, loc):
        where = loc("A.zarr")
        arr = create_array(where, shape=A.shape, dtype=A.dtype, chunks=(32, 40))
        write_block(arr, slice(0, 96), slice(0, 80), A)
        back = open_zarr(where)
        got = read_block(back, slice(10, 70), slice(5, 77))
        np.testing.assert_array_equal(got, A[10:70, 5:77])  # storage copies bits: exact
        assert blocklin.open(where).shape == A.shape

    def test_info_describes_a_result_group(self, loc):
        """``blocklin info`` of a committed result group (an svd's ``U``, ``S``, ``Vt``) names its arrays
        and provenance on every backend."""
        from blocklin.storage.inspect import inspect

        a = blocklin.from_array(A, loc("A.zarr"), chunks=(32, 40))
        blocklin.svd(a, 3, out=loc("S.zarr"), seed=1, scheduler="sync")
        d = inspect(loc("S.zarr"))
        assert d["format"] == "zarr group" and d["provenance"]["operation"] == "svd"
        assert d["arrays"]["U"]["shape"] == [96, 3] and d["arrays"]["S"]["shape"] == [3]
        assert d["arrays"]["Vt"] == {"shape": [3, 80], "dtype": "float64"}

    def test_missing_store_named(self, loc):
        with pytest.raises(StoreNotFoundError, match="does not exist"):
            blocklin.open(loc("nothing.zarr"))

    # -- commit protocol --------------------------------------------------------------------------
    def test_output_appears_only_when_committed(self, loc):
        out = loc("O.zarr")
        ao = AtomicOutput(out, token="t1")
        arr = create_array(ao.array_path(), shape=A.shape, dtype=A.dtype, chunks=(32, 40))
        write_block(arr, slice(0, 96), slice(0, 80), A)
        ao.mark_done("unit-0")
        err = UncommittedOutputError if self.in_place else StoreNotFoundError
        with pytest.raises(err, match="resume"):
            blocklin.open(out)
        final = ao.commit("test", params={"p": 1})
        m = blocklin.open(final)
        np.testing.assert_array_equal(m.to_numpy(), A)
        assert m.provenance["operation"] == "test" and m.provenance["params"] == {"p": 1}
        keys = backend(out).keys("")
        assert "zarr.json" in keys and all(k == "zarr.json" or k.startswith("c/") for k in keys), keys

    def test_abort_leaves_nothing(self, loc):
        out = loc("O.zarr")
        with pytest.raises(_Interrupt):
            with AtomicOutput(out) as ao:
                create_array(ao.array_path(), shape=(4, 4), dtype="f8", chunks=(2, 2))
                raise _Interrupt
        assert not backend(out).keys("")
        assert not any(".partial-" in k for k in backend(out.parent).keys(""))

    def test_existing_output_needs_overwrite(self, loc):
        out = loc("O.zarr")
        blocklin.from_array(A, out, chunks=(32, 40))
        with pytest.raises(OutputExistsError, match="overwrite"):
            blocklin.from_array(B, out)
        m = blocklin.from_array(B, out, chunks=(40, 36), overwrite=True)
        np.testing.assert_array_equal(m.to_numpy(), B)
        # no chunk of the old array is left, and the record of the peaks is the new array's
        assert sorted(backend(out).keys("")) == sorted(["zarr.json", PEAKS_RECORD, PEAKS_COLUMNS] + [f"c/{i}/{j}" for i in range(2)
                                                                                    for j in range(2)])
        assert recorded(out).amax == float(np.abs(B).max())

    def test_overwrite_never_deletes_other_data(self, loc):
        if not self.in_place:
            pytest.skip("local outputs are folders replaced by a rename")
        backend(loc("data")).write_bytes("notes.txt", b"keep me")
        with pytest.raises(OutputExistsError, match="other objects"):
            blocklin.from_array(A, loc("data"), overwrite=True)
        assert backend(loc("data")).read_bytes("notes.txt") == b"keep me"

    def test_output_is_input_refused(self, loc):
        src = blocklin.from_array(A, loc("A.zarr"), chunks=(32, 40))
        with pytest.raises(OutputIsInputError):
            blocklin.matmul(src, src.location, src.location, trans_b=True)

    def test_interrupted_gemm_refused_then_resumed_same_bits(self, loc, monkeypatch):
        a = blocklin.from_array(A, loc("A.zarr"), chunks=(32, 40))
        b = blocklin.from_array(B, loc("B.zarr"), chunks=(40, 24))
        ref = blocklin.matmul(a, b, loc("ref.zarr"), memory="64KiB", scheduler="sync")
        out = loc("C.zarr")
        calls = _interrupt_after(monkeypatch, 2)
        with pytest.raises(_Interrupt):
            blocklin.matmul(a, b, out, memory="64KiB", scheduler="sync", resume=True)
        assert len(calls) == 2
        if self.in_place:
            with pytest.raises(UncommittedOutputError, match="resume=True"):
                blocklin.open(out)
            from blocklin.storage.inspect import inspect

            with pytest.raises(UncommittedOutputError):
                inspect(out)
        else:
            with pytest.raises(StoreNotFoundError, match="resume=True"):
                blocklin.open(out)
        monkeypatch.undo()
        done = blocklin.matmul(a, b, out, memory="64KiB", scheduler="sync", resume=True)
        assert done.report["skipped"] == 2
        np.testing.assert_array_equal(done.to_numpy(), ref.to_numpy())  # same plan, same bits
        # no work file left; the peaks record (of the recovered tiles' peaks) is the output's own
        records = (PEAKS_RECORD, PEAKS_COLUMNS)
        assert not [k for k in backend(out).keys("") if k not in records and ("blocklin" in k or ".tmp-" in k)]

    def test_staged_inputs_and_temp_results_removed(self, loc):
        tmp = loc("tmp")
        with blocklin.config.set(temp_dir=tmp):
            r = blocklin.matmul(A, B, memory="128KiB")
            assert r.path.startswith(tmp.url)
            np.testing.assert_allclose(r.to_numpy(), A @ B, rtol=0, atol=1e-12 * 80)
            left = [k for k in backend(tmp).keys("") if not k.startswith(r.location.name)]
            assert not left, left
            r.delete()
            with pytest.raises(ValueError):
                blocklin.matmul(A, np.ones((3, 3)), memory="128KiB")
        assert not backend(tmp).keys("")


    def test_ctrl_c_removes_temporaries_and_partial_output(self, loc, monkeypatch):
        import blocklin.runtime.tiles as tiles_mod

        def interrupted(*args, **kw):
            raise KeyboardInterrupt

        monkeypatch.setattr(tiles_mod, "run_tile", interrupted)
        tmp, out = loc("tmp"), loc("C.zarr")
        with pytest.raises(KeyboardInterrupt):
            blocklin.matmul(A, B, out, memory="128KiB", scheduler="sync", temp_dir=tmp)
        assert not backend(tmp).keys("")  # the staged A and B are gone
        assert not backend(out).keys("") and not [k for k in backend(out.parent).keys("") if "C.zarr" in k]


class TestLocal(BackendTests):
    in_place = False

    @pytest.fixture
    def root(self, tmp_path):
        return str(tmp_path), None

    def test_killed_raw_writer_temporaries_not_committed(self, loc):
        out = loc("O.zarr")
        ao = AtomicOutput(out)
        arr = create_array(ao.array_path(), shape=(4, 4), dtype="f8", chunks=(2, 2))
        write_block(arr, slice(0, 4), slice(0, 4), np.ones((4, 4)))
        import os

        stray = os.path.join(ao.partial.url, "c", "0", "1.tmp-4242-140000")
        with open(stray, "wb") as f:
            f.write(b"half")  # a writer killed mid-chunk
        ao.commit("test")
        assert not [k for k in backend(out).keys("") if ".tmp-" in k]
        np.testing.assert_array_equal(blocklin.open(out).to_numpy(), np.ones((4, 4)))


class TestFileURL(BackendTests):
    """``file://`` runs the object-store protocol on local disk."""

    @pytest.fixture
    def root(self, tmp_path):
        return f"file://{tmp_path}", None


class TestMemory(BackendTests):
    @pytest.fixture
    def root(self):
        base = f"memory://blocklin-{uuid.uuid4().hex[:8]}"
        yield base, None
        remove(as_location(base))


class TestS3(BackendTests):
    @pytest.fixture
    def root(self, s3):
        return s3


def test_unknown_scheme_and_missing_backend_name_the_fix():
    from blocklin.errors import StorageBackendError

    with pytest.raises(StorageBackendError, match="unknown protocol 'nosuch'"):
        blocklin.open("nosuch://bucket/A.zarr")
    import importlib.util

    if importlib.util.find_spec("gcsfs") is None:
        with pytest.raises(StorageBackendError, match="pip install gcsfs"):
            blocklin.open("gs://bucket/A.zarr")


def test_store_objects_and_zarr_arrays_name_their_location(tmp_path):
    import zarr

    m = blocklin.from_array(A, tmp_path / "A.zarr", chunks=(32, 40))
    store = zarr.storage.LocalStore(str(tmp_path / "A.zarr"))
    assert blocklin.open(store).location == m.location
    fs_store = zarr.storage.FsspecStore.from_url(f"file://{tmp_path}/A.zarr")
    out_store = zarr.storage.FsspecStore.from_url(f"file://{tmp_path}/AAt.zarr")
    r = blocklin.matmul(zarr.open_array(store=fs_store, mode="r"), m, out_store, trans_b=True)
    assert r.path == f"file://{tmp_path}/AAt.zarr"
    np.testing.assert_allclose(r.to_numpy(), A @ A.T, rtol=0, atol=1e-12 * 80)
    with pytest.raises(TypeError, match="LocalStore or an FsspecStore"):
        blocklin.matmul(A, A.T, zarr.storage.MemoryStore())


def test_task_tokens_name_the_store_not_its_credentials():
    from dask.base import tokenize

    def loc(**o):
        return as_location("s3://bucket/A.zarr", o) if _has_s3fs() else as_location("memory://b/A.zarr", o)
    assert tokenize(loc(key="a", secret="x")) == tokenize(loc(key="b", secret="y"))
    assert tokenize(loc(endpoint_url="http://h:1")) != tokenize(loc(endpoint_url="http://h:2"))
    assert tokenize(loc()) != tokenize(loc().with_pending())


def _has_s3fs() -> bool:
    import importlib.util

    return importlib.util.find_spec("s3fs") is not None


def test_storage_options_from_config_env_and_cli(monkeypatch):
    from blocklin.storage.location import storage_options_from_items

    monkeypatch.setenv("BLOCKLIN_STORAGE_OPTIONS", '{"anon": true}')
    blocklin.config.reset()
    assert as_location("memory://x/y").storage_options == {"anon": True}
    with blocklin.config.set(storage_options={"s3": {"key": "k"}, "memory": {"z": 1}}):
        assert as_location("memory://x/y").storage_options == {"z": 1}
        assert as_location("memory://x/y", {"w": 2}).storage_options == {"z": 1, "w": 2}
    assert storage_options_from_items(["anon=false", "client_kwargs.endpoint_url=http://h:1", "retries=3"]) == {
        "anon": False, "client_kwargs": {"endpoint_url": "http://h:1"}, "retries": 3}
    from blocklin.errors import ConfigError

    with pytest.raises(ConfigError, match="KEY=VALUE"):
        storage_options_from_items(["novalue"])
