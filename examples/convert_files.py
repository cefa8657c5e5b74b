"""Bring matrices from other tools into blocklin, inspect them, and export them again.

Run: python examples/convert_files.py [folder]   (a temporary folder, removed at the end, by default)

The .npy input is 3000 x 2000 float64 (46 MiB), converted within a third of its size (15 MiB; the
planner's minimum instead, should that not hold one block);
``BLOCKLIN_EXAMPLE_SIZE=small`` uses 600 x 400 (the test suite does).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import numpy as np

import blocklin
from blocklin.storage.inspect import format_info, inspect


def within_budget(run, budget):
    """``run(budget)``, or ``run`` at the budget the planner names when ``budget`` cannot hold its plan
    (``BudgetError.minimum``, refused before the step reads anything; a step planned later may name
    more, so each retry grows the budget by at least a quarter, as blocklin's own budget searches do)."""
    for _ in range(5):
        try:
            return run(budget), budget
        except blocklin.errors.BudgetError as exc:
            if not exc.minimum:
                raise
            print(f"{blocklin.config.format_size(budget)} is below what the plan needs; the planner names "
                  f"{blocklin.config.format_size(exc.minimum)}")
            budget = max(exc.minimum, budget + budget // 4)
    return run(budget), budget


def main(folder: Path) -> None:
    small = os.environ.get("BLOCKLIN_EXAMPLE_SIZE") == "small"
    rng = np.random.default_rng(0)
    a = rng.standard_normal((600, 400) if small else (3000, 2000))
    np.save(folder / "a_fortran.npy", np.asfortranarray(a))  # read by column panels, no transpose
    np.savetxt(folder / "a.csv", a[:50, :20], delimiter=",", header="generated", fmt="%.17g")
    (folder / "s.mtx").write_text("%%MatrixMarket matrix coordinate real symmetric\n3 3 3\n1 1 2\n2 1 -1\n3 3 4\n")

    # 1. a .npy three times larger than the budget, into zarr with chunks sized for the budget
    rep, budget = within_budget(lambda mem: blocklin.convert(folder / "a_fortran.npy", folder / "a.zarr", memory=mem,
                                                             codec="zstd"), a.nbytes // 3)
    print(f"npy -> zarr: {rep['blocks']} blocks in {rep['seconds']:.2f} s, planned {rep['planned_memory'] / 2**20:.1f} "
          f"MiB of {budget / 2**20:.1f} MiB, chunks {rep['chunks']}")

    # 2. rechunk and add checksums; then what does the store hold and cost?
    blocklin.convert(folder / "a.zarr", folder / "b.zarr", chunks=(512, 512), checksum=True, memory="64MiB")
    print(format_info(inspect(folder / "b.zarr", memory="64MiB")))

    # 3. text and Matrix Market in, exports out
    blocklin.convert(folder / "a.csv", folder / "c.zarr")           # header line detected
    blocklin.convert(folder / "s.mtx", folder / "s.zarr")           # symmetric entries mirrored
    blocklin.convert(folder / "b.zarr", folder / "b.mtx", memory="64MiB")
    blocklin.convert(folder / "b.zarr", folder / "b_f32.npy", dtype="float32", memory="64MiB")
    print("exports:", sorted(p.name for p in folder.iterdir() if p.suffix in (".mtx", ".npy")))

    # 4. check: every copy holds the original numbers (float32 export: rounded once, exactly)
    same = np.array_equal(blocklin.open(folder / "b.zarr").to_numpy(), a)
    same &= np.array_equal(np.load(folder / "b_f32.npy"), a.astype(np.float32))
    same &= np.array_equal(blocklin.open(folder / "c.zarr").to_numpy(), a[:50, :20])
    same &= np.array_equal(blocklin.open(folder / "s.zarr").to_numpy(), [[2, -1, 0], [-1, 0, 0], [0, 0, 4]])
    print("check: zarr copies, the csv, the Matrix Market file and the float32 export match the originals:", same)
    if not same:
        sys.exit("check failed: a converted copy differs from its original")

    # 5. bad input: a clear message, and no output left behind
    (folder / "bad.csv").write_text("1,2\n3,oops\n")
    try:
        blocklin.convert(folder / "bad.csv", folder / "bad.zarr")
    except blocklin.errors.FormatError as exc:
        print("refused:", exc)
    assert not (folder / "bad.zarr").exists()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp, blocklin.config.set(temp_dir=tmp):
            main(Path(tmp))
