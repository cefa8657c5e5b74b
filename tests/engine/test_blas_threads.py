"""``blocklin._blas.blas_threads``: BLAS thread limits through one process-wide controller, as
``threadpoolctl.threadpool_limits`` sets them (every BLAS library NumPy and SciPy loaded), restored on
leaving, nested and on error."""

from __future__ import annotations

import pytest
from threadpoolctl import threadpool_info

from blocklin._blas import _controller, blas_threads


def _blas() -> dict[str, int]:
    return {lib["filepath"]: lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"}


def test_limits_every_blas_library_and_restores_them():
    before = _blas()
    assert before  # NumPy's BLAS at least
    with blas_threads(1):
        assert set(_blas().values()) == {1} and _blas().keys() == before.keys()
        with blas_threads(None):  # no limit: the threads as they are
            assert set(_blas().values()) == {1}
    assert _blas() == before
    with pytest.raises(RuntimeError), blas_threads(1):
        raise RuntimeError("restored on error too")
    assert _blas() == before


def test_one_controller_serves_every_limit():
    with blas_threads(1):
        first = _controller()
    with blas_threads(1):
        assert _controller() is first
