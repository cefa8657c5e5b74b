"""The import check of the first device call: blocklin and its dependencies import, CuPy sees a GPU;
the versions and the GPU (``gpu_check.environment``) written to ``OUT.json``. Exit 4 when CuPy is
missing or sees no GPU.

``python3 benchmarks/gpu_first_call/env.py OUT.json``
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
gc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gc)

from blocklin.device import gpu_available  # noqa: E402

env = gc.environment()
env["gpu_available"] = gpu_available()
Path(sys.argv[1] if len(sys.argv) > 1 else "env.json").write_text(json.dumps(env, indent=1, default=str))
print(json.dumps(env, default=str))
sys.exit(0 if env["gpu_available"] and "cupy_error" not in env else 4)
