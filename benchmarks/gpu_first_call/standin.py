"""Run a script with the CuPy stand-in installed as ``cupy`` (``STANDIN=1`` mode of ``gpu_first_call.sh``).

``python3 benchmarks/gpu_first_call/standin.py SCRIPT [ARGS...]``: the NumPy-backed stand-in of
``tests/support/cupy_standin.py`` is installed (CUDA's ordering rules checked, no GPU needed), then
``SCRIPT`` runs as ``__main__`` with ``ARGS``; the exit status is the script's. Ordering violations the
stand-in saw make the exit status 3.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

from support import cupy_standin  # noqa: E402


def main() -> int:
    if len(sys.argv) < 2:
        print("usage: standin.py SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    cupy_standin.install()
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path.insert(0, str(Path(script).resolve().parent))
    rc = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    races = cupy_standin.take_races()
    if races:
        print(f"standin: {len(races)} CUDA ordering violation(s), the first:\n{races[0]}", file=sys.stderr)
        return rc or 3
    return rc


if __name__ == "__main__":
    sys.exit(main())
