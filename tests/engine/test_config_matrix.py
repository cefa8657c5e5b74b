"""Configuration layers and the Matrix handle."""

from __future__ import annotations

import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import ConfigError, ShapeError


def test_config_precedence(monkeypatch):
    monkeypatch.setenv("BLOCKLIN_MEMORY", "2GiB")
    monkeypatch.setenv("BLOCKLIN_DEVICE", "cpu")
    monkeypatch.setenv("BLOCKLIN_WORKERS", "2")
    bl.config.reset()
    cfg = bl.config.get_config()
    assert (cfg.memory, cfg.device, cfg.workers) == (2 * 2**30, "cpu", 2)
    bl.configure(memory="512MiB")
    assert bl.config.get_config().memory == 512 * 2**20
    with bl.config.set(memory="1MiB", codec="zstd") as inner:
        assert inner.memory == 2**20 and bl.config.get_config().codec == "zstd"
        with bl.config.set(memory="2MiB"):
            assert bl.config.get_config().memory == 2 * 2**20
        assert bl.config.get_config().memory == 2**20
    assert bl.config.get_config().memory == 512 * 2**20
    assert bl.config.resolve(memory="3MiB").memory == 3 * 2**20


@pytest.mark.parametrize("var,value,match", [("BLOCKLIN_DEVICE", "tpu", "device: must be one of"),
                                             ("BLOCKLIN_WORKERS", "many", "BLOCKLIN_WORKERS: must be an integer"),
                                             ("BLOCKLIN_MEMORY", "huge", "memory: must be a byte size"),
                                             ("BLOCKLIN_CODEC", "lzma", "codec: must be one of")])
def test_bad_environment_is_named(monkeypatch, var, value, match):
    monkeypatch.setenv(var, value)
    bl.config.reset()
    with pytest.raises(ConfigError, match=match):
        bl.config.resolve()  # what every operation calls; the call's own setting overrides it


def test_bad_scheduler_is_named():
    with pytest.raises(ConfigError, match="scheduler: must be threads, sync, processes"):
        bl.matmul(np.ones((2, 2)), np.ones((2, 2)), scheduler="fast")
    with pytest.raises(ConfigError, match="'distributed' needs an active distributed.Client"):
        bl.matmul(np.ones((2, 2)), np.ones((2, 2)), scheduler="distributed")


def test_matrix_handle(tmp_path):
    x = np.arange(60, dtype=np.float32).reshape(6, 10)
    m = bl.from_array(x, tmp_path / "x.zarr", chunks=(4, 4))
    assert (m.shape, m.dtype, m.chunks, m.ndim, m.nbytes) == ((6, 10), np.float32, (4, 4), 2, 240)
    assert m.codec == "none"
    np.testing.assert_array_equal(m.to_numpy(), x)
    np.testing.assert_array_equal(np.asarray(m), x)
    np.testing.assert_array_equal(m[2:5, 3], x[2:5, 3])
    np.testing.assert_array_equal(m.to_dask().compute(), x)
    assert "shape=(6, 10)" in repr(m)
    assert m.provenance["operation"] == "from_array"
    z = bl.from_array(x, tmp_path / "z.zarr", codec="zstd")
    assert z.codec == "zstd"
    v = bl.from_array(np.arange(3.0), tmp_path / "v.zarr")  # a vector is stored as one column
    assert v.shape == (3, 1) and np.array_equal(v.to_numpy()[:, 0], np.arange(3.0))
    with pytest.raises(ShapeError, match="x: must be"):
        bl.from_array(np.ones((2, 2, 2)), tmp_path / "t.zarr")
    import dask.array as da

    d = bl.from_array(da.from_array(x, chunks=(3, 7)), tmp_path / "d.zarr", chunks=(2, 5))
    np.testing.assert_array_equal(d.to_numpy(), x)
    assert d.chunks == (2, 5)


def test_random_is_deterministic_and_column_chunk_independent(tmp_path):
    a = bl.random(tmp_path / "a.zarr", (50, 30), seed=7, chunks=(16, 30))
    b = bl.random(tmp_path / "b.zarr", (50, 30), seed=7, chunks=(16, 8))
    np.testing.assert_array_equal(a.to_numpy(), b.to_numpy())
    c = bl.random(tmp_path / "c.zarr", (50, 30), seed=8, chunks=(16, 30))
    assert not np.array_equal(a.to_numpy(), c.to_numpy())
