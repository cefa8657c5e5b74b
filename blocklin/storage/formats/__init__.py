"""Matrix file formats: one module per format, dispatched by extension or explicit name.

============  ======================================  ===========================================
format        files                                   notes
============  ======================================  ===========================================
``npy``       ``.npy``                                C and Fortran order, positioned reads
``npz``       ``.npz:name``                           read only; stored members by offset
``mtx``       ``.mtx``, ``.mm``                       array + coordinate read, dense array written
``hdf5``      ``.h5:/group/dataset``, ``.hdf5``       needs h5py
``raw``       ``.bin``, ``.raw``                      ``shape``, ``dtype``, ``order``, ``offset``
``csv``       ``.csv``, ``.txt`` (whitespace)         streamed; ``delimiter``, ``skip_rows``
``tsv``       ``.tsv``, ``.tab``                      csv with a tab delimiter
``zarr``      ``.zarr`` or any zarr folder            v2 and v3 read, v3 written
============  ======================================  ===========================================
"""

from __future__ import annotations

import os
from typing import Any

from blocklin.errors import ConfigError, FormatError, explain
from blocklin.storage.formats.base import Reader, Writer
from blocklin.storage.location import split_spec

FORMATS = ("npy", "npz", "mtx", "hdf5", "raw", "csv", "tsv", "zarr")
WRITABLE = ("npy", "mtx", "hdf5", "raw", "csv", "tsv", "zarr")
_ALIASES = {"h5": "hdf5", "hdf": "hdf5", "zarr2": "zarr", "zarr3": "zarr", "bin": "raw", "binary": "raw",
            "txt": "csv", "text": "csv", "mm": "mtx", "matrixmarket": "mtx", "matrix-market": "mtx"}
_EXT = {".npy": "npy", ".npz": "npz", ".mtx": "mtx", ".mm": "mtx", ".h5": "hdf5", ".hdf5": "hdf5",
        ".he5": "hdf5", ".hdf": "hdf5", ".h5ad": "hdf5", ".bin": "raw", ".raw": "raw", ".csv": "csv", ".txt": "csv",
        ".tsv": "tsv", ".tab": "tsv", ".zarr": "zarr"}

__all__ = ["FORMATS", "WRITABLE", "Reader", "Writer", "check_zarr_output", "detect_format", "open_reader", "open_writer"]


def _is_location(spec: Any) -> bool:
    from blocklin.storage.location import Location

    if isinstance(spec, str) and "://" in spec:  # a URL names a zarr store (other formats are local files)
        return True
    return isinstance(spec, Location) and not spec.is_local or type(spec).__module__.startswith("zarr")


def check_zarr_output(out: Any, name: str = "out") -> None:
    """Refuse an output name whose extension promises another format (``-o X.npy`` on an operation
    that writes a zarr store would make a zarr folder named ``X.npy``)."""
    if not isinstance(out, (str, os.PathLike)) or "://" in str(out):
        return
    path = os.fspath(out).rstrip("/")
    fmt = _EXT.get(os.path.splitext(path.lower())[1])
    if fmt is not None and fmt != "zarr":
        stem = os.path.splitext(path)[0]
        raise FormatError(explain(name, "operations write zarr stores (a folder, conventionally .zarr)",
                                  f"{path!r}, a {fmt} file name", f"write {stem}.zarr, then convert it if a {fmt} "
                                  f"file is wanted: blocklin convert {stem}.zarr {path}"))


def detect_format(path: str, explicit: str | None = None, *, output: bool = False) -> str:
    """Format name from ``explicit`` (``--from``/``--to``) or else the extension of ``path``."""
    name = "to" if output else "from"
    if explicit:
        fmt = _ALIASES.get(explicit.lower(), explicit.lower())
        allowed = WRITABLE if output else FORMATS
        if fmt not in allowed:
            raise ConfigError(explain(name, f"must be one of {allowed}", repr(explicit),
                                      f"pass --{name} {'zarr' if output else 'npy'}"))
        return fmt
    p = path.rstrip("/")
    ext = os.path.splitext(p.lower())[1]
    if ext in _EXT:
        fmt = _EXT[ext]
    elif os.path.isdir(p) and (os.path.exists(os.path.join(p, "zarr.json"))
                               or os.path.exists(os.path.join(p, ".zarray"))):
        fmt = "zarr"
    else:
        raise FormatError(explain("out" if output else "input", "must have a known extension "
                                  f"({', '.join(sorted(_EXT))}) or an explicit format", f"{path!r}",
                                  f"pass --{name} FORMAT (one of {', '.join(WRITABLE if output else FORMATS)})"))
    if output and fmt not in WRITABLE:
        raise FormatError(explain("out", f"must be a writable format {WRITABLE}", f"{path!r} ({fmt}, read only)",
                                  "write .npy or .zarr instead"))
    return fmt


def open_reader(spec: Any, *, format: str | None = None, **opts: Any) -> Reader:
    """Open a matrix file for block reads.

    Parameters
    ----------
    spec : str or path-like
        ``path``, ``file.npz:name`` or ``file.h5:/group/dataset``.
    format : str, optional
        Explicit format (see :data:`FORMATS`); by default from the extension.
    **opts
        Format options: ``shape``, ``dtype``, ``order``, ``offset`` (raw); ``delimiter``,
        ``skip_rows``, ``header``, ``dtype`` (csv); unknown options are ignored by formats that do
        not use them.
    """
    if _is_location(spec):
        from blocklin.storage.formats.zarrfmt import ZarrReader
        return ZarrReader(spec, **opts)
    path, member = split_spec(spec)
    fmt = detect_format(path, format)
    if fmt == "npy":
        from blocklin.storage.formats.npy import NpyReader
        return NpyReader(path, **opts)
    if fmt == "npz":
        from blocklin.storage.formats.npy import open_npz
        return open_npz(path, member, **opts)
    if fmt == "mtx":
        from blocklin.storage.formats.mtx import MtxReader
        return MtxReader(path, **opts)
    if fmt == "hdf5":
        from blocklin.storage.formats.hdf5 import Hdf5Reader
        return Hdf5Reader(path, member, **opts)
    if fmt == "raw":
        from blocklin.storage.formats.raw import RawReader
        return RawReader(path, **opts)
    if fmt in ("csv", "tsv"):
        from blocklin.storage.formats.text import CsvReader
        if fmt == "tsv" and opts.get("delimiter") is None:
            opts["delimiter"] = "\t"
        return CsvReader(path, **opts)
    from blocklin.storage.formats.zarrfmt import ZarrReader
    return ZarrReader(path, **opts)


#: The reader options each format uses (``dtype``: the file's own dtype, raw and text only).
READER_OPTIONS = {"raw": ("shape", "dtype", "order", "offset"),
                  "csv": ("delimiter", "skip_rows", "header", "dtype"),
                  "tsv": ("delimiter", "skip_rows", "header", "dtype")}


def reader_format(spec: Any, format: str | None = None) -> str:
    """The format :func:`open_reader` reads ``spec`` as."""
    if _is_location(spec):
        return "zarr"
    return detect_format(split_spec(spec)[0], format)


def check_reader_options(spec: Any, fmt: str, given: dict[str, str]) -> None:
    """Refuse reader options that ``fmt`` does not use, which :func:`open_reader` would ignore: a
    ``--shape`` or ``--delimiter`` given for a ``.npy`` had been dropped without a word, so a user who
    meant a raw or CSV read got the file read as what its extension says. ``given`` maps each option
    the user set to how they spelled it (``{"shape": "--shape"}``)."""
    unused = [flag for name, flag in given.items() if name not in READER_OPTIONS.get(fmt, ())]
    if unused:
        used = READER_OPTIONS.get(fmt)
        raise ConfigError(explain(
            unused[0],
            "raw input options (--shape, --order, --offset, the file's dtype) apply to raw binary input and "
            "text options (--delimiter, --skip-rows, --header) to CSV/TSV input only",
            f"{', '.join(unused)} for {spec!s}, read as {fmt}" + (f" (which takes {', '.join(used)})" if used else
                                                                  " (which records its own layout)"),
            f"drop {' '.join(unused)}, or pass --from raw / --from csv to read the file as that format"))


def open_writer(spec: Any, shape: tuple[int, int], dtype: Any, *, format: str | None = None,
                **opts: Any) -> Writer:
    """Create an output that publishes itself atomically on ``commit()``.

    Options: ``inputs`` (refused as output), ``overwrite``, ``token``; ``chunks``, ``codec``,
    ``checksum``, ``resume`` (zarr); ``order`` (npy, raw); ``delimiter`` (csv); ``dataset`` via
    ``file.h5:/name``.
    """
    if _is_location(spec):
        from blocklin.storage.formats.zarrfmt import ZarrWriter
        return ZarrWriter(spec, shape, dtype, **opts)
    path, member = split_spec(spec)
    fmt = detect_format(path, format, output=True)
    if fmt == "npy":
        from blocklin.storage.formats.npy import NpyWriter
        return NpyWriter(path, shape, dtype, **opts)
    if fmt == "raw":
        from blocklin.storage.formats.raw import RawWriter
        return RawWriter(path, shape, dtype, **opts)
    if fmt == "mtx":
        from blocklin.storage.formats.mtx import MtxWriter
        return MtxWriter(path, shape, dtype, **opts)
    if fmt == "hdf5":
        from blocklin.storage.formats.hdf5 import Hdf5Writer
        return Hdf5Writer(path, shape, dtype, dataset=member, **opts)
    if fmt in ("csv", "tsv"):
        from blocklin.storage.formats.text import CsvWriter
        if fmt == "tsv" and opts.get("delimiter") is None:
            opts["delimiter"] = "\t"
        return CsvWriter(path, shape, dtype, **opts)
    from blocklin.storage.formats.zarrfmt import ZarrWriter
    return ZarrWriter(path, shape, dtype, **opts)
