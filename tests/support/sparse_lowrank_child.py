"""The child process of the sparse ``svd``/``eigsh`` peak-memory tests (``support.memcheck.run_child``):
a warm-up call on a tiny graph (the operation's imports, threads and BLAS buffers belong to the
baseline), the matrix opened, the baseline taken, then the operation at ``memory``.

Arguments (one JSON object): ``op`` (``"svd"`` or ``"eigsh"``), ``path`` (the stored sparse matrix),
``k``, ``memory``, ``dir`` (where the outputs go); optional ``eigsh_out`` (eigsh writes ``w``, ``V`` to
an output group, as svd always does) and ``max_passes``. Prints one JSON line: ``baseline``,
``peak``, ``passes``, ``spilled``, ``block``; or ``minimum`` where the budget is refused."""

CHILD = """
import os, tempfile
import numpy as np, scipy.sparse
import blocklin
args = json.loads(sys.argv[1])
r = scipy.sparse.random(300, 300, density=0.05, random_state=1)
tiny = blocklin.from_sparse(r + r.T, os.path.join(tempfile.mkdtemp(), "w.zarr"))
def run(a, mem, out):
    if args["op"] == "svd":
        return blocklin.svd(a, args["k"], seed=0, memory=mem, out=out)
    kw = {"max_passes": args["max_passes"]} if args.get("max_passes") else {}
    return blocklin.eigsh(a, args["k"], seed=0, order="descending", memory=mem,
                          out=out if args.get("eigsh_out") else None, **kw)
run(tiny, "64MiB", os.path.join(args["dir"], "warm.zarr"))
s = blocklin.open(args["path"])
s.row_block(0)
base = hwm()
reset_hwm()
try:
    res = run(s, args["memory"], os.path.join(args["dir"], "F.zarr"))
except blocklin.errors.BudgetError as exc:
    print(json.dumps({"minimum": exc.minimum}))
    sys.exit(0)
print(json.dumps({"baseline": base, "peak": hwm(), "spilled": res.report.get("basis_spilled"),
                  "block": res.report.get("block"),
                  "passes": res.report.get("operator_products", res.report.get("passes"))}))
"""
