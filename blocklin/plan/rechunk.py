"""Advice when an input's chunking forces extra reads: which chunks, how often, and the command to fix it.

Strips and panels narrower than a chunk read only their part of it where the layout allows
(uncompressed C-order chunks, cut along their rows: :mod:`blocklin.storage.rawchunks`); elsewhere
(compressed chunks, or chunks cut across their width) each one reads the whole chunk again. Then a
one-time ``blocklin convert`` to chunks no larger than the strips costs one read and one write of
the input and saves the re-reads on every later pass.
"""

from __future__ import annotations

from typing import Any


def rechunked_name(path: Any) -> str:
    """``A.zarr`` -> ``A-rechunked.zarr`` (the suggested output of the rechunk)."""
    url = str(getattr(path, "url", path)).rstrip("/")
    stem = url[:-5] if url.endswith(".zarr") else url
    return f"{stem}-rechunked.zarr"


def rechunk_advice(name: str, path: Any, shape: tuple[int, int], chunks: tuple[int, int],
                   want: tuple[int, int], rereads: int, why: str) -> str:
    """One line: ``name``'s chunks are read ``rereads`` times per pass because of ``why``; the
    ``blocklin convert`` command that rechunks it to ``want`` (clipped to the shape)."""
    want = (max(1, min(want[0], shape[0])), max(1, min(want[1], shape[1])))
    url = str(getattr(path, "url", path))
    cmd = f"blocklin convert {url} {rechunked_name(path)} --chunks {want[0]},{want[1]}"
    return (f"{name}: its {chunks[0]} x {chunks[1]} chunks are read up to {rereads} times per pass ({why}); "
            f"rechunk it once to read each byte once: {cmd}")
