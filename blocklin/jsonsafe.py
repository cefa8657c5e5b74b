"""Strict JSON out of blocklin: NaN and Inf written as ``null``, with a field saying why.

Python's :mod:`json` writes ``NaN`` and ``Infinity`` tokens that strict parsers (``jq``,
JavaScript, Go, zarr readers in other languages) reject. Every JSON blocklin writes (``--json``
summaries, the provenance in a zarr output's attributes) goes through :func:`dumps` or
:func:`strict`: a non-finite number becomes ``null`` and the top-level ``"nonfinite"`` object
names it, ``{"residual_norm": null, "nonfinite": {"residual_norm": "nan"}}``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

#: The key of the top-level object that names the values written as ``null`` and what they were.
NONFINITE_KEY = "nonfinite"


def _word(x: float) -> str:
    return "nan" if math.isnan(x) else "inf" if x > 0 else "-inf"


def strict(obj: Any, default: Callable[[Any], Any] | None = None) -> Any:
    """``obj`` as plain JSON values (through ``default`` for other objects) with every non-finite
    float replaced by ``None``; a top-level dict gains :data:`NONFINITE_KEY` (path to ``"nan"``,
    ``"inf"`` or ``"-inf"``, paths such as ``"report.s[2]"``) when any was replaced."""
    plain = json.loads(json.dumps(obj, default=default))  # NaN tokens round-trip through Python's json
    found: dict[str, str] = {}

    def walk(x: Any, path: str) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            found[path or "value"] = _word(x)
            return None
        if isinstance(x, dict):
            return {k: walk(v, f"{path}.{k}" if path else str(k)) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v, f"{path}[{i}]") for i, v in enumerate(x)]
        return x

    clean = walk(plain, "")
    if found and isinstance(clean, dict):
        clean[NONFINITE_KEY] = {**(clean.get(NONFINITE_KEY) or {}), **found}
    return clean


def dumps(obj: Any, default: Callable[[Any], Any] | None = None, **kwargs: Any) -> str:
    """:func:`json.dumps` of :func:`strict` ``(obj)``: never a bare ``NaN`` or ``Infinity`` token."""
    return json.dumps(strict(obj, default), allow_nan=False, **kwargs)
