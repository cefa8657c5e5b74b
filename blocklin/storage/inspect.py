"""Facts about a matrix file for ``blocklin info``: layout, sizes, provenance and cost estimates.

Nothing here reads matrix data (a CSV is scanned once to count its rows). Estimates combine the
planners' byte and memory figures with rough machine rates (:data:`RATES`); they are meant to tell
"seconds, minutes or hours" and "fits or not", not to benchmark.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from blocklin.config import format_size, resolve
from blocklin.plan.chunks import auto_chunks
from blocklin.plan.convert import plan_convert
from blocklin.storage import seen_peaks
from blocklin.storage.formats import check_reader_options, open_reader, reader_format
from blocklin.storage.recorded_peaks import recorded

#: Rough rates used for time estimates (bytes/s and flop/s). Disk rates are the ones measured for
#: the engine's zarr stores (DESIGN.md: 0.7 GB/s uncompressed, 0.27 GB/s zstd); the flop rate
#: assumes about 8 GFLOP/s per core in float64 BLAS (twice that in float32).
RATES = {"read": 0.7e9, "read_compressed": 0.27e9, "write": 0.7e9, "text": 0.03e9, "flops_per_core": 8e9}


def _read_rate(desc: dict) -> float:
    codec = str(desc.get("codec") or "none")
    if codec == "text":
        return RATES["text"]
    return RATES["read"] if codec in ("none", "") else RATES["read_compressed"]


def estimates(shape: tuple[int, int], dtype: Any, chunks: tuple[int, int] | None, memory: int,
              read_rate: float = RATES["read"], reader_resident: int = 0) -> dict[str, Any]:
    """Memory and time estimates of the main operations on a matrix of ``shape`` within ``memory``.

    Each entry holds ``memory`` (planned peak bytes) and ``seconds``, or ``error`` when the budget
    cannot hold the operation (the planner's message, with the minimum).
    """
    m, n = (int(s) for s in shape)
    dt = np.dtype(dtype)
    nbytes = m * n * dt.itemsize
    zchunks = auto_chunks((m, n), dt, memory)
    chunks = tuple(chunks) if chunks else zchunks
    flop_rate = RATES["flops_per_core"] * (os.cpu_count() or 1) * (2 if dt.itemsize <= 4 else 1)
    out: dict[str, Any] = {}
    try:
        p = plan_convert((m, n), dt, dt, memory=memory, unit=zchunks, resident=reader_resident,
                         out_chunk_bytes=zchunks[0] * zchunks[1] * dt.itemsize)
        out["convert_to_zarr"] = {"memory": p.peak_memory, "seconds": nbytes / read_rate + nbytes / RATES["write"],
                                  "chunks": list(zchunks)}
    except Exception as exc:  # noqa: BLE001 - reported, not raised: info must always work
        out["convert_to_zarr"] = {"error": str(exc)}
    try:
        p = plan_convert((m, n), dt, dt, memory=memory, unit=chunks, order="C",
                         in_chunk_bytes=chunks[0] * chunks[1] * dt.itemsize)
        out["pass"] = {"what": "one streaming pass over A (a matvec, a Lanczos step)", "memory": p.peak_memory,
                       "seconds": nbytes / RATES["read"] + 2 * m * n / flop_rate}
    except Exception as exc:  # noqa: BLE001
        out["pass"] = {"error": str(exc)}
    out["gram"] = _gram_estimate(m, n, dt, chunks, memory, flop_rate)
    return out


def _gram_estimate(m: int, n: int, dt: np.dtype, chunks: tuple[int, int], memory: int, flop_rate: float) -> dict:
    """The Gram matrix a user computes from this matrix: ``A^T A`` of a tall one (``n x n``, the covariance
    of the columns), ``A A^T`` of a wide one, by :func:`blocklin.gram` (SYRK, one read when it fits)."""
    try:
        from blocklin.plan.gram import gram_tasks, plan_gram

        trans = m < n
        tasks = gram_tasks(min(m, n), dt, memory, gpu=False)  # as blocklin.gram plans it on the CPU
        g = plan_gram((m, n), dt, chunks=chunks, memory=memory, trans=trans, workers=tasks, tasks=tasks)
        reads = "one read of A" if g.route == "pass" else f"stored tiles, A read ~{g.reads:.0f} times"
        return {"what": f"{g.product} ({g.s} x {g.s}, blocklin gram: SYRK, {reads})", "product": g.product,
                "route": g.route, "memory": int(g.peak_memory), "flops": int(g.flops), "bytes_read": int(g.bytes_read),
                "bytes_written": int(g.bytes_written),
                "seconds": max(g.flops / flop_rate, (g.bytes_read + g.bytes_written) / RATES["read"])}
    except Exception as exc:  # noqa: BLE001 - reported, not raised: info must always work
        return {"error": str(exc)}


#: The options that describe a file's layout (raw and text input), refused for a format that records its own.
_FILE_OPTIONS = ("shape", "dtype", "order", "offset", "delimiter", "skip_rows", "header")


def inspect(path: Any, *, format: str | None = None, memory: Any = None, **reader_opts: Any) -> dict[str, Any]:
    """Describe a matrix file or zarr store.

    Returns
    -------
    dict
        ``format``, ``path``, ``shape``, ``dtype``, ``order``, ``chunks``, ``codec``,
        ``bytes_on_disk``, ``bytes_in_memory``, ``compression_ratio`` (in memory / on disk),
        ``provenance`` (what blocklin recorded, for its zarr outputs), ``peaks`` (of a floating zarr
        array: whether a job's first pass over it takes its peaks from its writer's record, ``"writer"``,
        or from an earlier job's scan, ``"earlier job"``, or scans every value, ``None``; and ``amax``),
        ``memory_budget`` and ``estimates`` (see :func:`estimates`), plus format details.
    """
    check_reader_options(path, reader_format(path, format),
                         {k: "--" + k.replace("_", "-") for k, v in reader_opts.items() if k in _FILE_OPTIONS and v is not None})
    cfg = resolve(memory=memory)
    sparse = _sparse_info(path, cfg.memory)
    if sparse is not None:
        return sparse
    group = _group_info(path, cfg.memory)
    if group is not None:
        return group
    # info reports missing chunk files (chunk_files) instead of refusing the store
    reader = open_reader(path, format=format, check_chunks=False, **reader_opts)
    try:
        d = reader.describe()
        resident = reader.resident_bytes
        rate = _read_rate(d)
    finally:
        reader.close()
    d["bytes_on_disk"] = int(d.get("bytes_on_disk") or 0)
    d["compression_ratio"] = (d["bytes_in_memory"] / d["bytes_on_disk"]) if d["bytes_on_disk"] else None
    if d.get("format") == "zarr" and len(d["shape"]) == 2 and np.dtype(d["dtype"]).kind in "fc":
        d["peaks"] = _peaks(path, tuple(d["shape"]))
    d["memory_budget"] = cfg.memory
    d["estimates"] = estimates(tuple(d["shape"]), d["dtype"], tuple(d["chunks"]) if d.get("chunks") else None,
                               cfg.memory, rate, resident)
    return d


def _peaks(path: Any, shape: tuple[int, int]) -> dict[str, Any]:
    """Where a job's first pass over the array at ``path`` takes its largest magnitude from: its writer's
    record (:mod:`blocklin.storage.recorded_peaks`), an earlier job's scan (:mod:`blocklin.storage.seen_peaks`),
    or a scan of every value (``source`` None). Reads those records and the chunk files' stamps, no data."""
    got = recorded(path, shape, column_peaks=False)
    if got is not None:
        return {"source": "writer", "amax": got.amax}
    got = seen_peaks.seen(path, shape, column_peaks=False)
    if got is not None:
        return {"source": "earlier job", "amax": got.amax}
    return {"source": None, "amax": None}


def _sparse_info(path: Any, memory: int) -> dict[str, Any] | None:
    """The facts of a stored sparse matrix (a ``blocklin-csr`` group), None for anything else."""
    from blocklin.storage.sparse import SparseStore, is_sparse

    if not isinstance(path, (str, os.PathLike)) or not is_sparse(path):
        return None
    store = SparseStore(path)
    m, n = store.shape
    rows = np.diff(store.row_blocks)
    in_memory = store.nnz * (store.dtype.itemsize + store.index_dtype.itemsize) + (m + 1) * 8
    on_disk = store.bytes_on_disk()
    prov = store.attrs.get("blocklin")
    return {"format": "blocklin-csr", "sparse": True, "path": str(path), "shape": [m, n],
            "dtype": store.dtype.str, "nnz": store.nnz, "density": store.nnz / (m * n) if m * n else 0.0,
            "index_dtype": store.index_dtype.name, "row_blocks": int(rows.size),
            "block_rows": [int(rows.min()), int(rows.max())] if rows.size else [0, 0],
            "entry_chunk": int(store.attrs.get("entry_chunk", 0)), "bytes_on_disk": on_disk,
            "bytes_in_memory": in_memory, "bytes_dense": m * n * store.dtype.itemsize,
            "compression_ratio": in_memory / on_disk if on_disk else None, "memory_budget": memory,
            "fits_budget": in_memory <= memory, "provenance": prov, "estimates": {}}


def _group_info(path: Any, memory: int) -> dict[str, Any] | None:
    """A result group blocklin wrote (an svd's ``U``, ``S``, ``Vt``, what an update keeps): its arrays
    and provenance (``blocklin info`` then says whether it is current); None for anything else, and
    for an uncommitted output (the reader then refuses it with the way to resume or remove it)."""
    import json

    from blocklin.storage.backend import backend
    from blocklin.storage.location import Location, as_location
    from blocklin.storage.records import PENDING_RECORD

    if not isinstance(path, (str, os.PathLike, Location)):
        return None
    be = backend(as_location(path))
    meta = be.try_read("zarr.json")
    if meta is None or b'"group"' not in meta:
        return None
    meta = json.loads(meta)
    if meta.get("node_type") != "group" or be.try_read(PENDING_RECORD) is not None:
        return None
    arrays = {}
    # the children's metadata: one level down (a local listing, or the object keys of a store)
    names = (sorted(os.listdir(be.loc.url)) if be.loc.is_local
             else sorted({k.split("/")[0] for k in be.keys() if k.count("/") == 1 and k.endswith("/zarr.json")}))
    for name in names:
        try:
            sub = json.loads(be.read_bytes(f"{name}/zarr.json"))
        except (OSError, ValueError):
            continue
        if sub.get("node_type") == "array":
            arrays[name] = {"shape": sub.get("shape"), "dtype": str(sub.get("data_type"))}
    return {"format": "zarr group", "group": True, "path": str(path), "arrays": arrays,
            "provenance": (meta.get("attributes") or {}).get("blocklin"), "memory_budget": memory, "estimates": {}}


def _format_group(d: dict[str, Any]) -> str:
    lines = [f"{d['path']}", "  format       zarr group (zarr v3)"]
    for name, a in d["arrays"].items():
        lines.append(f"  {name:<17} {' x '.join(str(x) for x in a['shape'] or [])} {a['dtype']}")
    lines += _history_lines(d)
    return "\n".join(lines)


def _format_sparse(d: dict[str, Any]) -> str:
    shape = " x ".join(str(s) for s in d["shape"])
    lo, hi = d["block_rows"]
    lines = [f"{d['path']}",
             "  format       blocklin-csr (sparse CSR row blocks, zarr v3 group)",
             f"  shape        {shape}",
             f"  dtype        {np.dtype(d['dtype']).name} ({d['dtype']}), column indices {d['index_dtype']}",
             f"  entries      {d['nnz']} stored, density {d['density']:.3g}",
             f"  row blocks   {d['row_blocks']} of {lo}" + (f"..{hi}" if hi != lo else "") + " rows",
             f"  on disk      {format_size(d['bytes_on_disk'])}",
             f"  in memory    {format_size(d['bytes_in_memory'])} as CSR "
             f"({'fits' if d['fits_budget'] else 'exceeds'} memory={format_size(d['memory_budget'])}); "
             f"{format_size(d['bytes_dense'])} dense"]
    lines += _history_lines(d)
    return "\n".join(lines)


def _history_lines(d: dict[str, Any]) -> list[str]:
    """Where a store came from: blocklin's provenance, the versions of a grown matrix, and whether a
    result is current with its inputs."""
    lines = []
    prov = d.get("provenance")
    if prov:
        lines.append(f"  provenance   {prov.get('operation')} of {', '.join(prov.get('inputs', [])) or '-'} "
                     f"by blocklin {prov.get('version')} at {prov.get('created')}")
    versions = d.get("versions")
    if versions:
        rows = " -> ".join(str(v.get("rows")) for v in versions[-6:])
        lines.append(f"  versions     {len(versions)} ({'... -> ' if len(versions) > 6 else ''}{rows} rows; "
                     f"grown by blocklin append)")
    if d.get("current"):
        lines.append(f"  current      {_current_line(d['current'])}")
    return lines


def _current_line(c: dict[str, Any]) -> str:
    """Whether a result is up to date with its inputs (``linalg.update.status``), in one line."""
    if c.get("current") is None:
        return "unknown (the result records no stored input's version)"
    if c["current"]:
        return "yes (every input as it was computed from)"
    grown = [f"{i['url']}: {i['rows_then']} rows then, {i['rows_now']} now" for i in c["inputs"]
             if "rows_now" in i and not i["current"]]
    changed = [f"{i['url']}: {i['error']}" for i in c["inputs"] if "error" in i]
    fix = "blocklin update PATH" if c.get("updatable") and not changed else "recompute it with --overwrite"
    return f"no ({'; '.join(grown + changed)}); {fix}"


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _chunk_line(c: dict[str, Any]) -> str:
    line = f"  chunk files  {c['stored']} of {c['grid']} stored"
    if c.get("recorded") is not None and c["stored"] < c["recorded"]:
        return line + (f"; DAMAGED: {c['recorded']} when blocklin wrote it (first missing {c['first_missing']}); "
                       "operations refuse it")
    if c["missing"]:
        why = "all fill value when blocklin wrote it" if c.get("recorded") is not None else \
            "read as the fill value; --require-complete refuses it"
        return line + f"; {c['missing']} missing, first {c['first_missing']} ({why})"
    return line + " (complete)"


def format_info(d: dict[str, Any]) -> str:
    """Human text for :func:`inspect`'s dict."""
    if d.get("sparse"):
        return _format_sparse(d)
    if d.get("group"):
        return _format_group(d)
    shape = " x ".join(str(s) for s in d["shape"])
    lines = [
        f"{d['path']}",
        f"  format       {d['format']}" + (f" (zarr v{d['zarr_format']})" if d.get("zarr_format") else "")
        + (f", {d['layout']} {d['field']} {d['symmetry']}" if d.get("layout") else ""),
        f"  shape        {shape}",
        f"  dtype        {np.dtype(d['dtype']).name} ({d['dtype']})",
        f"  order        {d['order']}",
        f"  chunks       {' x '.join(map(str, d['chunks'])) if d.get('chunks') else '-'}",
        f"  codec        {d.get('codec', 'none')}" + (" + crc32c" if d.get("checksum")
                                                         and "crc32c" not in str(d.get("codec")) else ""),
        f"  on disk      {format_size(d['bytes_on_disk'])}",
        f"  in memory    {format_size(d['bytes_in_memory'])}",
    ]
    if d.get("compression_ratio"):
        lines.append(f"  compression  {d['compression_ratio']:.2f}x")
    if d.get("nnz") is not None:
        lines.append(f"  entries      {d['nnz']} stored")
    census = d.get("chunk_files")
    if census:
        lines.append(_chunk_line(census))
    peaks = d.get("peaks")
    if peaks is not None:
        if peaks["source"] is None:
            lines.append("  peaks        none kept: a job's first pass scans every value for its largest magnitude")
        else:
            by = "recorded by its writer" if peaks["source"] == "writer" else "seen by an earlier job's scan"
            lines.append(f"  peaks        {by} (largest magnitude {peaks['amax']:.3g}): a first pass need not scan")
    lines += _history_lines(d)
    lines.append(f"  estimates with memory={format_size(d['memory_budget'])} (rough rates):")
    for name, e in d["estimates"].items():
        if "error" in e:
            lines.append(f"    {name:<16} does not fit: {e['error']}")
        else:
            what = f"{e['what']}: " if name == "gram" else ""
            lines.append(f"    {name:<16} {what}peak {format_size(e['memory'])}, ~{_duration(e['seconds'])}")
    return "\n".join(lines)


__all__ = ["RATES", "estimates", "format_info", "inspect"]
