"""Shared fixtures: temp stores, dtype tolerances, GPU marker handling, the CuPy stand-in option.

``pytest --cupy-standin`` installs the NumPy-backed CuPy stand-in (tests/support/cupy_standin.py) as
``cupy``, runs only the tests marked ``gpu`` (the GPU halves of the device-parametrized test
bodies), so that they execute through ``CudaDevice`` on the stand-in, and fails every test after
which the stand-in saw a CUDA ordering violation.
"""

from __future__ import annotations

import signal
from pathlib import Path

import numpy as np
import pytest

import blocklin
from blocklin.device.select import gpu_available


def pytest_addoption(parser):
    parser.addoption("--cupy-standin", action="store_true", default=False,
                     help="run the gpu-marked tests through CudaDevice on the NumPy-backed CuPy stand-in, "
                          "failing on any CUDA ordering violation")


def pytest_configure(config):
    # A shell without job control starts background commands with SIGINT ignored, and Python then
    # installs no KeyboardInterrupt handler (nor do the children it starts): the Ctrl-C tests need the
    # default one, in this process and in the subprocesses they signal.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if config.getoption("--cupy-standin"):
        from support import cupy_standin

        cupy_standin.install()


#: Node ids the default job leaves to the slow job (see the file's header).
SLOW_CASES = frozenset(line.strip() for line in (Path(__file__).parent / "slow_cases.txt").read_text().splitlines()
                       if line.strip() and not line.startswith("#"))


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by the marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid in SLOW_CASES:
            item.add_marker(pytest.mark.slow)
    if config.getoption("--cupy-standin"):
        # the marker, not ``"gpu" in item.keywords``: keywords also hold directory names (a checkout in gpu/)
        keep = [item for item in items if item.get_closest_marker("gpu")]
        config.hook.pytest_deselected(items=[item for item in items if not item.get_closest_marker("gpu")])
        items[:] = keep
        return
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs CuPy and a CUDA device")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _standin_races(request):
    """Under ``--cupy-standin``: run what is still queued after the test and fail on any race."""
    if not request.config.getoption("--cupy-standin"):
        yield
        return
    from support import cupy_standin

    cupy_standin.STATE.races.clear()
    yield
    cupy_standin.check()


@pytest.fixture
def standin():
    """The CuPy stand-in installed as ``cupy`` for one test (with fresh per-GPU device budgets)."""
    from support import cupy_standin

    from blocklin.device.cuda import DeviceBudget

    with cupy_standin.installed() as state:
        import cupy

        DeviceBudget._budgets.clear()
        yield cupy
        state.races.clear()


@pytest.fixture(autouse=True)
def _isolated_config(request, tmp_path, monkeypatch, record_leftovers):
    """Each test gets its own temp dir for staged inputs and default outputs, and its own rates cache.

    What ``blocklin clean`` would find in it when the test ends (work folders, staged inputs,
    partial outputs), and work folders of runs given ``temp_dir=tmp_path``, are recorded as the
    test's leftovers: they fail the session (the root conftest.py reports them).
    """
    monkeypatch.setenv("BLOCKLIN_TEMP_DIR", str(tmp_path / "blocklin-tmp"))
    # the rates cache (plan/rates.py) of this test alone: `--explain` prints the default rates unless
    # a test calibrates, and no test writes the user's ~/.cache
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "blocklin-tmp").mkdir()
    blocklin.config.reset()
    yield
    blocklin.config.reset()
    record_leftovers(request.node.nodeid, tmp_path / "blocklin-tmp")
    record_leftovers(request.node.nodeid, tmp_path, work_only=True)


def gemm_tol(dtype, k: int) -> float:
    """Elementwise tolerance for a dot product of length k of O(1) normal entries.

    Rounding error of a length-k dot product is bounded by about k*eps*sum|a_i b_i|; for normal
    entries sum|a_i b_i| ~ 0.64 k and the error behaves like sqrt(k)*eps*sqrt(k) in practice. We use
    4*sqrt(k)*eps*||row||*||col|| ~ 4*k*eps, a bound a blocked summation order satisfies with margin.
    """
    eps = np.finfo(np.dtype(dtype)).eps
    return 4.0 * max(1, k) * eps


@pytest.fixture
def rng():
    return np.random.default_rng(20261129)


from support.s3server import s3, s3_server  # noqa: E402,F401 - the loopback S3 server fixtures


@pytest.fixture(scope="module")
def client():
    """A two-process ``LocalCluster`` on 127.0.0.1 (one thread per worker) and a client of its own."""
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                           host="127.0.0.1")
    c = Client(cluster, set_as_default=False)
    yield c
    c.close()
    cluster.close()
