"""Where the time of the general square solve goes: seconds per phase of ``blocklin.solve(G, b)``.

A random ``n x n`` float64 matrix ``G`` and a right-hand side ``b`` are written to zarr once (in
``--dir``, reused by later runs), then one ``blocklin.solve(G, b, out=...)`` runs (out-of-core LU,
triangular solves, residual, refinement) with timers around every block operation it runs
(``Job.run``, named by its description: "LU panels", "LU back substitution U x = y", "residual b - A
x", "write x", ...) and every recorded step. Printed: the total, each phase's seconds, bytes read and
written, the process's CPU time, the load average. With ``--profile``, cProfile's top functions too.

Usage::

    python benchmarks/solve_phases.py --n 8192 --chunk 1024 --memory 256MiB [--dir D] [--profile]

The load changes the seconds: compare the shares of the phases within one run, or runs taken in turn.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np


def make_inputs(folder: Path, n: int, chunk: int) -> tuple[Path, Path]:
    import zarr

    g, b = folder / "G.zarr", folder / "b.zarr"
    if not g.exists():
        z = zarr.create_array(str(g), shape=(n, n), dtype="float64", chunks=(chunk, chunk), compressors=None)
        rng = np.random.default_rng(2)
        for i in range(0, n, chunk):
            z[i:i + chunk, :] = rng.standard_normal((min(chunk, n - i), n))
    if not b.exists():
        zb = zarr.create_array(str(b), shape=(n, 1), dtype="float64", chunks=(chunk, 1), compressors=None)
        zb[...] = np.random.default_rng(4).standard_normal((n, 1))
    return g, b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--memory", default="64MiB")
    ap.add_argument("--precision", default="double")
    ap.add_argument("--dir", help="folder of the inputs (kept, reused); default a temporary one")
    ap.add_argument("--profile", action="store_true", help="also print cProfile's top functions by own time")
    args = ap.parse_args()
    folder = Path(args.dir or tempfile.mkdtemp(prefix="blocklin-bench-phases-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        g, b = make_inputs(folder, args.n, args.chunk)
        run(g, b, folder / "x.zarr", args)
    finally:
        if not args.dir:
            shutil.rmtree(folder, ignore_errors=True)


def run(g: Path, b: Path, out: Path, args: argparse.Namespace) -> None:
    import blocklin
    from blocklin.runtime import job as jobmod
    from blocklin.runtime import stages as stmod

    times: dict[str, float] = collections.OrderedDict()

    def timed(kind, real, name_of):
        def wrapper(self, *a, **kw):
            t = time.perf_counter()
            try:
                return real(self, *a, **kw)
            finally:
                key = f"{kind} {name_of(a, kw)}"
                times[key] = times.get(key, 0.0) + time.perf_counter() - t
        return wrapper

    jobmod.Job.run = timed("op", jobmod.Job.run, lambda a, kw: kw.get("description"))
    stmod.Stages.run = timed("step", stmod.Stages.run, lambda a, kw: a[0])
    prof = None
    if args.profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    c0, t0 = os.times(), time.perf_counter()
    x = blocklin.solve(str(g), str(b), out=str(out), overwrite=True, memory=args.memory, precision=args.precision)
    seconds, c1 = time.perf_counter() - t0, os.times()
    if prof is not None:
        import pstats

        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    r = x.report
    print(f"solve n = {args.n}, chunk {args.chunk}, memory {args.memory}, precision {args.precision}: {seconds:.2f} s, "
          f"backward error {r['backward_error']:.2e}, {r['refine_steps']} refinement step(s), panels of "
          f"{r['plan']['tile']}")
    print(f"read {r.get('bytes_read', 0) / 2**20:.0f} MiB, written {r.get('bytes_written', 0) / 2**20:.0f} MiB; "
          f"CPU user {c1.user - c0.user:.2f} s, system {c1.system - c0.system:.2f} s; load average "
          + " ".join(f"{v:.2f}" for v in os.getloadavg()))
    for key, v in times.items():
        print(f"  {key:50s} {v:7.2f} s  {100 * v / seconds:5.1f}%")


if __name__ == "__main__":
    main()
