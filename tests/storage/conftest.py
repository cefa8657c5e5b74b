"""Fixtures shared by the conversion tests: a small dense matrix and its ``.npy`` file."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def a(rng):
    return rng.standard_normal((120, 90))


@pytest.fixture
def npy(tmp_path, a):
    p = tmp_path / "a.npy"
    np.save(p, a)
    return p
