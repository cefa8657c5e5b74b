"""Peak memory of conversions much larger than the budget, measured in child processes.

Each measurement runs in a fresh interpreter and reads its peak resident set there (``VmHWM`` of
its own address space: ``ru_maxrss`` would also count this parent's resident set at fork time); the
import baseline (numpy, zarr, blocklin) is measured the same way in a separate child, so

    peak(conversion) <= baseline + budget + MARGIN

checks the conversion's own buffers against its budget. MARGIN covers what no planner controls:
thread stacks and arenas of the I/O threads, and allocator slack.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

MiB = 2**20
BUDGET = 64 * MiB
MARGIN = 24 * MiB
SHAPE = (10_000, 5_000)  # 400 MB of float64: about six times the budget

_CHILD = textwrap.dedent("""
    import json, resource, sys
    import numpy, zarr
    import blocklin
    args = json.loads(sys.argv[1])
    report = None
    if "warm_s3" in args:  # the S3 client libraries loaded and used once: part of an S3 baseline
        blocklin.from_array(numpy.ones((2, 2)), args.pop("warm_s3"), storage_options=args.pop("storage_options"))
    if args:
        report = blocklin.convert(args.pop("src"), args.pop("out"), **args)
        report = {k: report[k] for k in ("planned_memory", "blocks", "seconds", "plan")}
    hwm = [int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:")]
    print(json.dumps({"peak": hwm[0] if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "report": report}))
""")


def _child(args: dict) -> dict:
    proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(args)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def big_npy(tmp_path_factory):
    path = tmp_path_factory.mktemp("mem") / "big.npy"
    mm = np.lib.format.open_memmap(path, mode="w+", dtype=np.float64, shape=SHAPE)
    rng = np.random.default_rng(0)
    for r in range(0, SHAPE[0], 1000):
        mm[r:r + 1000] = rng.standard_normal((1000, SHAPE[1]))
    mm.flush()
    del mm
    return path


@pytest.fixture(scope="module")
def baseline():
    return _child({})["peak"]


@pytest.mark.slow
@pytest.mark.parametrize("out,extra", [
    ("o.zarr", {}),
    ("z.zarr", {"codec": "zstd", "chunks": [1000, 1000]}),
    ("f.npy", {"out_order": "F"}),
], ids=["zarr", "zarr-zstd", "npy-transposed-layout"])
def test_npy_conversion_stays_within_budget(tmp_path, big_npy, baseline, out, extra):
    assert big_npy.stat().st_size > 5 * BUDGET
    res = _child({"src": str(big_npy), "out": str(tmp_path / out), "memory": BUDGET, **extra})
    assert res["report"]["planned_memory"] <= BUDGET
    assert res["report"]["blocks"] > 6
    used = res["peak"] - baseline
    assert used <= BUDGET + MARGIN, (
        f"peak {res['peak'] / MiB:.0f} MiB = baseline {baseline / MiB:.0f} MiB + {used / MiB:.0f} MiB, "
        f"over the {BUDGET / MiB:.0f} MiB budget + {MARGIN / MiB:.0f} MiB margin")


@pytest.mark.slow
def test_zarr_rechunk_stays_within_budget(tmp_path, big_npy, baseline):
    src = tmp_path / "src.zarr"
    _child({"src": str(big_npy), "out": str(src), "memory": BUDGET, "chunks": [250, 2500]})
    res = _child({"src": str(src), "out": str(tmp_path / "re.zarr"), "memory": BUDGET, "chunks": [1000, 500]})
    used = res["peak"] - baseline
    assert used <= BUDGET + MARGIN, f"{used / MiB:.0f} MiB over a {BUDGET / MiB:.0f} MiB budget"


def _used(res: dict, baseline: int, budget: int) -> str:
    used = res["peak"] - baseline
    assert used <= budget + MARGIN, (
        f"peak {res['peak'] / MiB:.0f} MiB = baseline {baseline / MiB:.0f} MiB + {used / MiB:.0f} MiB, "
        f"over the {budget / MiB:.0f} MiB budget + {MARGIN / MiB:.0f} MiB margin")
    return f"{used / MiB:.1f} MiB"


def _symmetric_array_file(path, n: int) -> None:
    """A random symmetric ``n x n`` array file: the lower triangle, column by column."""
    rng = np.random.default_rng(1)
    with open(path, "w") as f:
        f.write(f"%%MatrixMarket matrix array real symmetric\n{n} {n}\n")
        for j in range(n):
            f.write("\n".join(map(repr, rng.standard_normal(n - j).tolist())) + "\n")


@pytest.fixture(scope="module")
def symmetric_mtx(tmp_path_factory):
    path = tmp_path_factory.mktemp("mem-sym") / "s.mtx"
    _symmetric_array_file(path, 2000)
    return path


@pytest.mark.parametrize("out", ["o.zarr", "o.mtx"])
def test_symmetric_dense_mtx_stays_within_budget(tmp_path, symmetric_mtx, baseline, out):
    """The symmetric array file is mirrored in strips through a scratch zarr: the matrix (31 MB) is
    about twice the budget, and the peak (the staging step or the copy, whichever needs more) stays
    in it."""
    budget = 16 * MiB
    assert 2000 * 2000 * 8 > 1.8 * budget
    res = _child({"src": str(symmetric_mtx), "out": str(tmp_path / out), "memory": budget})
    plan = res["report"]["plan"]
    assert 0 < plan["prepare_bytes"] <= res["report"]["planned_memory"] <= budget
    _used(res, baseline, budget)


def test_conversion_to_s3_stays_within_budget(tmp_path, s3):
    """A .npy (61 MiB) converted into a bucket: zarr's chunk writes to an object store hold one more
    copy of each chunk in flight (the request body), which the plan counts; the baseline has the S3
    client libraries loaded (they are not buffers of the conversion)."""
    bucket, opts = s3
    budget = 24 * MiB
    src = tmp_path / "a.npy"
    np.save(src, np.random.default_rng(2).standard_normal((4000, 2000)))
    base = _child({"warm_s3": f"{bucket}/warm.zarr", "storage_options": opts})["peak"]
    res = _child({"src": str(src), "out": f"{bucket}/o.zarr", "memory": budget, "storage_options": opts})
    plan = res["report"]["plan"]
    assert res["report"]["planned_memory"] <= budget and res["report"]["blocks"] > 2
    chunk = int(np.prod(plan["unit"])) * 8
    assert plan["fixed_bytes"] >= plan["concurrency"] * 3 * chunk  # the request bodies are counted
    _used(res, base, budget)
