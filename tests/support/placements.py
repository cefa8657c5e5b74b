"""Where a job can run, as test parameters: every scheduler (a LocalCluster's client among them) and
every device (the GPU under the ``gpu`` marker, run by ``--cupy-standin`` on the stand-in)."""

from __future__ import annotations

import pytest

#: The named schedulers and ``"cluster"``: the module-scoped LocalCluster of tests/conftest.py's
#: ``client`` fixture (its start takes seconds, so its cases are slow).
SCHEDULERS = ["sync", "threads", "processes", pytest.param("cluster", marks=pytest.mark.slow)]

DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


def scheduler_arg(name: str, request: pytest.FixtureRequest):
    """The ``scheduler=`` for a :data:`SCHEDULERS` name: the cluster's client for ``"cluster"``."""
    return request.getfixturevalue("client") if name == "cluster" else name


#: Every scheduler on the CPU and the GPU (on the sync scheduler): one list for a test body that runs
#: wherever a job can.
PLACEMENTS = SCHEDULERS + [pytest.param("gpu", marks=pytest.mark.gpu)]


def placement_kwargs(name: str, request: pytest.FixtureRequest) -> dict:
    """``scheduler=`` and ``device=`` for a :data:`PLACEMENTS` name."""
    if name == "gpu":
        return {"scheduler": "sync", "device": "gpu"}
    return {"scheduler": scheduler_arg(name, request), "device": "cpu"}
