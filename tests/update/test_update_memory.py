"""Peak memory of an append and of the updates that follow it, in a child process each.

The appended rows (80 MB in a ``.npy`` file) are five times the 16 MiB budget; the append streams
them in panels of whole chunk rows, and the updates of a Gram matrix and of an updatable PCA read
only those rows in strips (the PCA also rewrites its scores ``U``, in row bands). Each child's peak
resident set (``VmHWM``) must stay within the import baseline plus the budget plus the margin of
:mod:`support.memcheck`.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import blocklin as bl
from support.memcheck import margin, needs_hwm, run_child

MiB = 2**20
BUDGET = 16 * MiB
M, P, N = 60_000, 160_000, 64

_CODE = """
import json, sys
import numpy, zarr
import blocklin
args = json.loads(sys.argv[1])
report = None
if args.get("append"):
    blocklin.append(args["a"], args["append"], memory=args["memory"])
for out in args.get("update", []):
    blocklin.update(out, memory=args["memory"])
print(json.dumps({"peak": hwm()}))
"""


@pytest.fixture(scope="module")
def grown(tmp_path_factory):
    """A stored A, its Gram matrix and an updatable PCA, and the rows to append in a ``.npy`` file."""
    d = tmp_path_factory.mktemp("update-mem")
    rng = np.random.default_rng(3)
    a = rng.standard_normal((M, N)) + np.linspace(0, 3, N)
    bl.from_array(a, d / "A.zarr", chunks=(4096, N))
    bl.gram(d / "A.zarr", d / "G.zarr")
    bl.pca(d / "A.zarr", 5, out=d / "F.zarr", updatable=True)
    np.save(d / "new.npy", rng.standard_normal((P, N)) + np.linspace(0, 3, N))
    return d


@pytest.mark.slow  # about 10 s: three children, 80 MB appended and read twice
@needs_hwm
def test_append_and_updates_stay_within_the_budget(grown):
    d = grown
    base = run_child(_CODE, json.dumps({}))["peak"]
    appended = run_child(_CODE, json.dumps({"a": str(d / "A.zarr"), "append": str(d / "new.npy"),
                                            "memory": BUDGET}))["peak"] - base
    assert bl.open(d / "A.zarr").shape == (M + P, N)
    updated = {name: run_child(_CODE, json.dumps({"update": [str(d / name)], "memory": BUDGET}))["peak"] - base
               for name in ("G.zarr", "F.zarr")}
    allowed = BUDGET + margin(BUDGET)
    print({what: f"{used / MiB:.1f} MiB" for what, used in (("append", appended), *updated.items())})
    for what, used in (("append", appended), *updated.items()):
        assert used <= allowed, f"{what}: {used / MiB:.1f} MiB above the baseline for a {BUDGET / MiB:.0f} MiB budget"
    # the updated Gram matrix against NumPy's: each entry a dot product of M + P terms, within
    # gamma_{M+P} |A|^T |A| of the exact one (Higham, Accuracy and Stability, 3.5), for both
    full = bl.open(d / "A.zarr").to_numpy()
    g = bl.open(d / "G.zarr").to_numpy()
    assert (np.abs(g - full.T @ full) <= 2 * (M + P) * np.finfo(np.float64).eps * (np.abs(full).T @ np.abs(full))).all()
