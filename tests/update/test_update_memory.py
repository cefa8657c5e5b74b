"""Peak memory of an append and of the updates that follow it, in a child process each.

The appended rows (80 MB in a ``.npy`` file) are five times the 16 MiB budget; the append streams
them in panels of whole chunk rows, and the updates of a Gram matrix and of an updatable PCA read
only those rows in strips (the PCA also rewrites its scores ``U``, in row bands); the updates of a stored sparse matrix's
``S^T S`` and ``S^T B`` read its 36 MB of appended entries in pieces. Each child's peak
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


# -- the sparse Gram and product updates ------------------------------------------------------------------

#: A child that opens the operands of one update (their imports and metadata: part of the baseline),
#: then runs ``blocklin.update(out, memory=...)`` and prints the peak above that baseline.
_SPARSE_CODE = """
import blocklin
import dask.threaded  # noqa: F401  (imported by the run anyway; part of the baseline)
args = json.loads(sys.argv[1])
for path in args["inputs"]:
    blocklin.open(path)
base = hwm()
reset_hwm()
u = blocklin.update(args["out"], memory=args["memory"])
print(json.dumps({"used": hwm() - base, "rows_read": u.report["updated"]["rows_read"]}))
"""
SM, SP, SN, SK = 20_000, 200_000, 300, 16


@pytest.fixture(scope="module")
def sparse_grown(tmp_path_factory):
    """A stored sparse ``S`` (``SM x SN``) with its Gram ``S^T S`` and product ``S^T B`` stored, then ``SP``
    rows appended to ``S`` (about 3 M entries: 36 MB of CSR values and column indices, more than twice the
    budget) and to ``B`` (``SP x SK``: 26 MB)."""
    import scipy.sparse

    d = tmp_path_factory.mktemp("update-sparse-mem")

    def rows(m, seed):
        return scipy.sparse.random(m, SN, density=0.05, random_state=seed, format="csr",
                                   data_rvs=np.random.default_rng(seed).standard_normal)

    s0, s1 = rows(SM, 1), rows(SP, 2)
    b0, b1 = (np.random.default_rng(seed).standard_normal((m, SK)) for seed, m in ((3, SM), (4, SP)))
    bl.from_sparse(s0, d / "S.zarr")
    bl.from_array(b0, d / "B.zarr", chunks=(4096, SK))
    bl.gram(d / "S.zarr", d / "G.zarr")
    bl.matmul(d / "S.zarr", d / "B.zarr", d / "C.zarr", trans_a=True)
    bl.append(d / "S.zarr", s1, memory=BUDGET)
    bl.append(d / "B.zarr", b1, memory=BUDGET)
    return d, scipy.sparse.vstack([s0, s1]).tocsr(), np.vstack([b0, b1])


@pytest.mark.slow
@needs_hwm
@pytest.mark.parametrize("name", ["G.zarr", "C.zarr"], ids=["gram", "StB"])
def test_sparse_updates_stay_within_the_budget(sparse_grown, name):
    """The update of ``S^T S`` / ``S^T B`` reads only the appended rows, in pieces its plan sizes to the
    budget; the child's peak above its baseline (operands opened, Dask imported) must stay within the
    budget plus :func:`support.memcheck.margin`, the dense update's allowance: the same allocator slack,
    thread stacks and Python objects beside the planned buffers. The updated results against SciPy's with
    the entry-wise bound ``gamma_m |S|^T |B|`` (twice: the reference is a float64 sum too; Higham 2002,
    eq. 3.5) plus one float64 rounding of the stored result (tests/update/test_update_sparse_sums.py)."""
    d, s, b = sparse_grown
    nbytes = s.data.nbytes + s.indices.nbytes
    assert nbytes >= 2 * BUDGET
    r = run_child(_SPARSE_CODE, json.dumps({"out": str(d / name), "memory": BUDGET,
                                            "inputs": [str(d / "S.zarr"), str(d / "B.zarr")]}))
    print(f"{name}: {r['used'] / MiB:.1f} MiB above the baseline, budget {BUDGET / MiB:.0f} MiB")
    assert r["rows_read"] == SP
    assert r["used"] <= BUDGET + margin(BUDGET), f"{name}: {r['used'] / MiB:.1f} MiB for a {BUDGET / MiB:.0f} MiB budget"
    other = s.toarray() if name == "G.zarr" else b
    ref, mag = s.T @ other, abs(s).T @ np.abs(other)
    eps = np.finfo(np.float64).eps
    got = bl.open(d / name).to_numpy()
    assert (np.abs(got - ref) <= (2 * s.shape[0] + 2) * eps * mag).all()
