"""Bounded-memory conversion between matrix file formats (and zarr rechunk/re-encode).

:func:`convert` opens a reader (:mod:`blocklin.storage.formats`), plans blocks that fit the budget
(:func:`blocklin.plan.convert.plan_convert`), and copies block by block: a helper thread reads the
next block while the current one is written, each block covers whole output chunks, and every
finished block leaves a resume marker. The output appears at its final path only when complete.
Converting is not math: values are copied (and cast when asked), never computed on.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import resource
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from blocklin._memory import check_budget
from blocklin.config import parse_size, resolve, size_hint
from blocklin.errors import BudgetError, ConfigError, DTypeError, FormatError, NonFiniteError, ParameterError, explain
from blocklin.plan.chunks import auto_chunks
from blocklin.plan.convert import plan_convert
from blocklin.peaks import block_peaks
from blocklin.progress import make_progress
from blocklin.storage import input_guard, stamps
from blocklin.storage.identity import resume_token
from blocklin.storage.atomic import check_output_path
from blocklin.storage.formats import check_reader_options, detect_format, open_reader, open_writer
from blocklin.storage.atomic import is_done, mark_done
from blocklin.storage.backend import backend
from blocklin.storage.formats.base import disk_usage, output_dtype
from blocklin.storage.location import Location, as_location, split_spec
from blocklin.storage.recorded_peaks import PeakTally, recordable, record as record_peaks
from blocklin.storage.space import check_space, raise_naming
from blocklin.storage.zarr_store import open_cached, read_block, array_file_bytes, write_block
from blocklin.validate import MAX_COUNT

NAN_POLICIES = ("allow", "error")
#: ``layout=``: ``auto`` keeps coordinate sources (Matrix Market ``coordinate``, SciPy ``.npz``) sparse
#: in a zarr output and writes every other source dense; ``sparse`` and ``dense`` insist.
LAYOUTS = ("auto", "sparse", "dense")


def parse_chunks(chunks: Any) -> str | tuple[int, int]:
    """``"auto"``, ``"R,C"`` or a pair of positive integers."""
    if chunks is None or (isinstance(chunks, str) and chunks.strip().lower() == "auto"):
        return "auto"
    parts = chunks.replace("x", ",").split(",") if isinstance(chunks, str) else chunks
    try:
        pair = tuple(int(p) for p in parts)
    except (TypeError, ValueError):
        pair = ()
    whole = isinstance(chunks, str) or all(isinstance(p, (int, np.integer)) and not isinstance(p, bool) for p in parts)
    if len(pair) != 2 or not whole or min(pair) < 1 or max(pair) > MAX_COUNT:  # 5.5 is not 5; 2**63 no size
        raise ConfigError(explain("chunks", "must be 'auto' or two positive integers ROWS,COLS", repr(chunks),
                                  "pass --chunks auto or --chunks 1024,1024"))
    return pair


def _remote(x: Any, storage_options: dict | None, name: str) -> Location | None:
    """A Location for URLs, Locations and zarr objects; None for local file specs (the format readers' own)."""
    if isinstance(x, Location):
        return as_location(x, storage_options, name=name)
    if type(x).__module__.startswith("zarr"):
        return as_location(x, storage_options, name=name)
    if isinstance(x, str) and "://" in x:
        return as_location(x, storage_options, name=name)
    return None


def _real(p: Any) -> str:
    return p.url if isinstance(p, Location) else os.path.realpath(p)


def _base(p: Any) -> str:
    return p.name if isinstance(p, Location) else os.path.basename(p)


def _unit_name(b: tuple[int, int, int, int]) -> str:
    return "block-{}-{}-{}-{}".format(*b)


def _peak_rss() -> int:
    """Peak resident bytes of this process.

    ``VmHWM`` of the process's own address space where Linux provides it: ``ru_maxrss`` also counts
    the parent's resident set at fork/exec time, which would hide a child's own peak.
    """
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:  # pragma: no cover - not Linux
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # pragma: no cover


def _current_rss() -> int:
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:  # pragma: no cover
        return 0


def convert(src: Any, out: Any, *, chunks: Any = "auto", dtype: Any = None, codec: str | None = None,
            checksum: bool = False, memory: Any = None, overwrite: bool = False, resume: bool = False,
            from_format: str | None = None, to_format: str | None = None, shape: Any = None, in_dtype: Any = None,
            order: str | None = None, out_order: str | None = None, offset: int = 0, delimiter: str | None = None,
            skip_rows: int | None = None, header: Any = "auto", nan: str = "allow", progress: Any = None,
            storage_options: dict | None = None, scheduler: Any = None, layout: str = "auto",
            sparse_format: str | None = None) -> dict[str, Any]:
    """Convert a matrix file to another format (or rechunk/re-encode a zarr array) in bounded memory.

    Parameters
    ----------
    src : str or path-like
        Input: ``.npy``, ``file.npz:name``, ``.mtx``, ``file.h5:/group/dataset``, raw binary,
        ``.csv``/``.tsv``/``.txt``, or a zarr (v2 or v3) folder.
    out : str or path-like
        Output: ``.zarr`` (v3), ``.npy``, ``.mtx`` (dense array), ``file.h5:/dataset``, raw binary,
        ``.csv``/``.tsv``. Written under a temporary name and renamed when complete.
    chunks : "auto" or (int, int)
        Zarr (or HDF5) chunks of the output; ``"auto"`` picks chunks that suit the engine's tiles for
        the budget (:func:`blocklin.plan.chunks.auto_chunks`).
    dtype : dtype, optional
        Output dtype (default: the source's). Lossy kinds (float to int, complex to real) are refused.
        For raw input it is also the file's dtype unless ``in_dtype`` is given; for CSV the parse dtype.
    codec : str, optional
        Zarr compression (``none``, ``zstd``, ``blosc-lz4``, ``blosc-zstd``, ``gzip``); default from
        the config (``none``). HDF5 output takes ``none`` or ``gzip``.
    checksum : bool
        Add a crc32c checksum to every zarr chunk (verified whenever it is read).
    memory : int or str, optional
        Budget (default from the config), for example ``"512MiB"``.
    overwrite, resume : bool
        Replace an existing output; continue an interrupted zarr conversion, skipping finished blocks.
    from_format, to_format : str, optional
        Override the format chosen by extension.
    shape, in_dtype, order, offset : optional
        Raw input layout (``order`` is ``"C"`` or ``"F"``).
    out_order : {"C", "F"}, optional
        Layout of ``.npy``/raw outputs (default: the source's order).
    delimiter, skip_rows, header :
        CSV options (``header`` is ``"auto"``, True or False).
    nan : {"allow", "error"}
        What NaN values do: copied (default; converting is not math), or an error naming the position.
    progress : bool or object, optional
        Progress bar (see :func:`blocklin.progress.make_progress`).
    storage_options : dict, optional
        fsspec options for URL inputs and outputs (``s3://bucket/A.zarr``; zarr only), merged over
        the configured ones.
    scheduler : str or distributed.Client, optional
        With a ``distributed`` client (given, or active when None), a zarr-to-zarr conversion is
        copied by the workers, one output block per task (bounded memory per worker); other
        conversions stream through this process.
    layout : {"auto", "sparse", "dense"}
        ``"auto"`` (default): a coordinate Matrix Market file or a SciPy ``save_npz`` file converted
        to ``.zarr`` stays sparse (a ``blocklin-csr`` group, ``docs/sparse.md``, opened by
        :func:`blocklin.open` as a :class:`~blocklin.sparse.SparseMatrix`), through an external sort
        within ``memory``; every other source is written dense. ``"dense"``: a coordinate file is
        densified into a zarr array (as before sparse outputs existed). A stored sparse matrix as
        ``src`` is exported to ``.mtx`` (coordinate general) or ``.npz``. An HDF5 group holding a
        CSR or CSC matrix (``file.h5:/X``: anndata, 10x Genomics, h5sparse) converts to a sparse
        group too (:mod:`blocklin.storage.sparse_hdf5`).
    sparse_format : {"csr", "csc"}, optional
        Whether an HDF5 sparse group compresses rows or columns, for a group whose attributes do
        not say (refused for other sources, and when the group says otherwise).

    Returns
    -------
    dict
        Report: ``output``, ``seconds``, ``bytes_read``, ``bytes_written`` (on disk), ``peak_memory``
        (peak resident bytes of the process, interpreter included), ``rss_before``,
        ``planned_memory``, ``blocks``, ``blocks_skipped``, ``throughput_gbps``, ``plan`` and more.

    Raises
    ------
    FormatError
        Malformed, truncated or mislabeled input (CSV messages name line and column).
    BudgetError
        The budget cannot hold one block (or the coordinate reader's entries); the message names the
        minimum.
    OutputExistsError, OutputIsInputError
        The output exists (without ``overwrite``) or is the input.

    Examples
    --------
    >>> import numpy as np
    >>> import blocklin as bl
    >>> np.save("A.npy", np.arange(12.0).reshape(3, 4))
    >>> report = bl.convert("A.npy", "A.zarr")
    >>> report["shape"], report["dtype"]
    ([3, 4], 'float64')
    >>> bl.open("A.zarr").to_numpy()
    array([[ 0.,  1.,  2.,  3.],
           [ 4.,  5.,  6.,  7.],
           [ 8.,  9., 10., 11.]])
    """
    if hasattr(src, "location") and (hasattr(src, "zarr") or hasattr(src, "aslinearoperator")):
        # a blocklin.Matrix (convert, rechunk) or SparseMatrix (export): its store
        src = src.location if not src.location.is_local else src.path
    _check_source_and_policy(src, nan)
    route = _sparse_route(src, out, layout, from_format, to_format)
    if sparse_format is not None and route != "hdf5":
        raise ConfigError(explain("sparse_format", "applies to an HDF5 group holding a CSR or CSC matrix",
                                  f"sparse_format={sparse_format!r} for {src!s}", "drop --sparse-format"))
    if route is not None:
        return _convert_sparse(route, src, out, memory=memory, dtype=dtype, overwrite=overwrite, nan=nan,
                               progress=progress, chunks=chunks, codec=codec, checksum=checksum, resume=resume,
                               sparse_format=sparse_format, from_format=from_format)
    t0 = time.perf_counter()
    rss0 = _current_rss()
    cfg = resolve(memory=memory)
    chunks = parse_chunks(chunks)
    codec = (codec if codec is not None else cfg.codec).lower()
    src, out, src_path, out_path, in_fmt, out_fmt = _ends(src, out, storage_options, from_format, to_format,
                                                          overwrite=overwrite, resume=resume)
    _check_output_encoding(out_fmt, codec, checksum)
    given = {"shape": shape is not None and "--shape", "dtype": in_dtype is not None and "--in-dtype",
             "order": order is not None and "--order", "offset": bool(offset) and "--offset",
             "delimiter": delimiter is not None and out_fmt not in ("csv", "tsv") and "--delimiter",
             "skip_rows": skip_rows is not None and "--skip-rows", "header": header != "auto" and "--header/--no-header"}
    check_reader_options(src, in_fmt, {k: v for k, v in given.items() if v})
    reader_opts = _reader_options(in_fmt, shape=shape, dtype=in_dtype if in_dtype is not None else dtype,
                                  order=order, offset=offset, delimiter=delimiter, skip_rows=skip_rows, header=header)
    # the source stamped before its first read (a text file's shape scan, a header): the output's
    # commit refuses a source rewritten since (input_guard)
    run = contextlib.ExitStack()
    try:
        inputs, _ = run.enter_context(input_guard.run_inputs())
        inputs.stamp(stamps.input_location(src_path, storage_options))
        reader = open_reader(src, format=from_format, **reader_opts)
    except BaseException:
        run.close()
        raise
    writer = None
    try:
        out_dt = output_dtype(reader.dtype, dtype)
        if out_fmt == "zarr" and (out_dt.kind == "f" and out_dt.itemsize > 8 or out_dt.itemsize > 16):
            # zarr 3 has no extended precision: its own error named no parameter
            raise DTypeError(explain("dtype", "must be a dtype zarr stores (float16, float32, float64, complex64, "
                                     "complex128 or an integer)", out_dt.name, "pass --dtype float64, or convert "
                                     "to .npy or .h5, which store extended precision"))
        if _opposite_sequential(reader, out_fmt):
            reader.close()
            return _staged(src, out, locals())
        m, n = reader.shape
        out_chunks = auto_chunks((m, n), out_dt, cfg.memory) if chunks == "auto" else chunks
        token = _resume_token(src, src_path, out_path, in_fmt, out_fmt, reader, out_dt, out_chunks, codec, checksum,
                              nan)
        _check_output_space(out_path, out_fmt, (m, n), out_dt, out_chunks)
        writer = open_writer(out, (m, n), out_dt, format=to_format, chunks=out_chunks if chunks != "auto" or
                             out_fmt == "zarr" else None, codec=codec, checksum=checksum,
                             order=(out_order or reader.order), delimiter=delimiter, inputs=[src_path],
                             vector=getattr(reader, "ndim", 2) == 1,
                             overwrite=overwrite, resume=resume, token=token)
        # (a 1-D zarr array is copied here: the workers' block task reads 2-D arrays)
        client = _cluster_client(scheduler) if in_fmt == "zarr" and out_fmt == "zarr" and \
            getattr(reader, "ndim", 2) == 2 else None
        try:
            if client is None:
                check_budget(cfg.memory)
            # On a cluster memory= is per worker process, shared by the blocks its threads copy at once.
            task_memory = cfg.memory // _threads_per_worker(client) if client is not None else cfg.memory
            plan = _fitting_plan(reader, writer, out_dt, task_memory, (m, n), chunks == "auto" and out_fmt == "zarr",
                                 chunks_given=chunks != "auto" and out_fmt == "zarr")
        except (BudgetError, ConfigError) as exc:
            err = _refused(writer, exc)
            writer = None
            raise err from None
        _prepare(reader, plan, cfg)
        copy = _copy if client is None else functools.partial(_copy_on_cluster, client)
        # the peaks of every value written, recorded with the output: its first passes need not scan
        tally = PeakTally((m, n)) if out_fmt == "zarr" and recordable(out_dt) and getattr(reader, "ndim", 2) == 2 \
            else None
        blocks, skipped = copy(reader, writer, plan, out_dt, nan, progress,
                               f"convert {_base(src_path)} -> {_base(out_path)}", tally)
        if skipped and tally is not None:  # blocks an earlier run copied: their values were not seen
            tally.skipped()
        report = {
            "input": str(src), "output": str(out_path), "from": in_fmt, "to": out_fmt, "shape": [m, n],
            "in_dtype": reader.dtype.str, "dtype": out_dt.name,
            "chunks": list(writer.chunks) if writer.chunks else None,
            "codec": codec if out_fmt in ("zarr", "hdf5") else "none", "checksum": bool(checksum),
            "memory": cfg.memory, "planned_memory": plan.peak_memory, "blocks": blocks,
            "blocks_skipped": skipped, "resumed": bool(skipped), "bytes_read": int(reader.bytes_read),
            "bytes_logical": m * n * reader.dtype.itemsize, "seconds": time.perf_counter() - t0, "staged": False, "on_cluster": client is not None,
        }
        final = _commit(writer, plan, report, out_path)
        writer = None
        report["peaks_recorded"] = tally is not None and record_peaks(final, tally)
        report.update(seconds=time.perf_counter() - t0, rss_before=rss0, plan=plan.to_dict(),
                      bytes_written=backend(final).size("") if isinstance(final, Location) else disk_usage(final))
        report["throughput_gbps"] = (plan.bytes_read / report["seconds"] / 1e9) if report["seconds"] > 0 else 0.0
        return report
    except BaseException as exc:
        if writer is None:
            raise
        partial = writer.partial_path
        writer.abort()
        raise_naming(exc, partial)  # a full disk's write() names no file: name the export's
    finally:
        reader.close()
        run.close()


def _refused(writer: Any, exc: Exception) -> Exception:
    """``exc`` (the budget refused) after the output is dropped: a partial this run created goes, even
    with ``resume``; the one of an interrupted run it took over is kept, and the message says how to
    continue or remove it."""
    if not writer.supports_resume:
        writer.abort()
        return exc
    writer.abort(refused=True)
    if writer.kept is None:
        return exc
    from blocklin.storage.cleanup import kept_message

    again = type(exc)(f"{exc}; {kept_message([(writer.kept, 'partial output')])}")
    if isinstance(exc, BudgetError):
        again.minimum = exc.minimum
    return again


#: Fewest bytes a text format spends on one value (a digit and a delimiter).
_TEXT_BYTES_PER_VALUE = 2


def _check_output_space(out_path: Any, out_fmt: str, shape: tuple[int, int], out_dt: np.dtype,
                        out_chunks: tuple[int, int]) -> None:
    """The output fits the free space of its folder (text formats: at least two bytes a value)."""
    m, n = shape
    detail = f"{m} x {n} {out_dt.name}"
    if out_fmt == "zarr":
        nbytes = array_file_bytes((m, n), out_chunks, out_dt)
    elif out_fmt in ("csv", "tsv", "mtx"):
        nbytes, detail = m * n * _TEXT_BYTES_PER_VALUE, detail + " as text, at least 2 bytes a value"
    else:
        nbytes = m * n * out_dt.itemsize
    check_space(out_path, nbytes, "out", detail)


def _opposite_sequential(reader: Any, out_fmt: str) -> bool:
    """A sequential reader and a sequential writer that walk the matrix in opposite orders."""
    writer_order = {"csv": "C", "tsv": "C", "mtx": "F"}.get(out_fmt)
    return bool(reader.sequential and writer_order and writer_order != reader.order)


def _check_source_and_policy(src: Any, nan: str) -> None:
    """In-memory arrays are written with ``from_array``, not converted; ``nan`` is a known policy."""
    if isinstance(src, (np.ndarray, list, tuple)) or hasattr(src, "dask"):
        raise ParameterError(explain("src", "must be a file, a zarr store or a URL (convert reads files in bounded "
                                     "memory)", f"an in-memory {type(src).__module__}.{type(src).__name__} of shape "
                                     f"{np.shape(src)}", "write it with blocklin.from_array(x, out, "
                                     "chunks='auto'), which takes NumPy and Dask arrays"))
    if nan not in NAN_POLICIES:
        raise ConfigError(explain("nan", f"must be one of {NAN_POLICIES}", repr(nan), "pass nan='allow'"))


def _mtx_layout(path: str) -> str | None:
    """The FORMAT word of a Matrix Market banner (``coordinate`` or ``array``), None when unreadable."""
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            toks = fh.readline(4096).split()
    except OSError:
        return None
    return toks[2].lower() if len(toks) >= 3 and toks[0].lower() == "%%matrixmarket" else None


def _sparse_route(src: Any, out: Any, layout: str, from_format: str | None, to_format: str | None) -> str | None:
    """``"export"`` (a stored sparse matrix to a file), ``"sparse"`` (a coordinate source to a sparse
    group) or None (the dense copy), by the source, the output and ``layout``."""
    from blocklin.storage.sparse import is_sparse
    from blocklin.storage.sparse_convert import is_scipy_npz

    if layout not in LAYOUTS:
        raise ConfigError(explain("layout", f"must be one of {LAYOUTS}", repr(layout), "pass layout='auto'"))
    if not isinstance(src, (str, os.PathLike)) or "://" in str(src) or not isinstance(out, (str, os.PathLike)) \
            or "://" in str(out):
        if layout == "sparse":
            raise ConfigError(explain("layout", "sparse conversions read and write local files",
                                      f"{src!s} -> {out!s}", "convert through local paths"))
        return None
    path, member = split_spec(src)
    if os.path.isdir(path) and is_sparse(path):
        return "export"
    in_fmt = detect_format(path, from_format)
    sparse_npz = in_fmt == "npz" and member is None and is_scipy_npz(path)
    sparse_h5 = in_fmt == "hdf5" and _hdf5_sparse(path, member)
    coordinate = (in_fmt == "mtx" and _mtx_layout(path) == "coordinate") or sparse_npz or sparse_h5
    if layout == "dense":
        if sparse_npz or sparse_h5:
            what = "a SciPy sparse .npz" if sparse_npz else "an HDF5 sparse group"
            raise FormatError(explain("layout", f"{what} converts to a sparse matrix only",
                                      f"layout='dense' for {src!s}", "drop --dense (layout='auto'); densify "
                                      "row blocks with SparseMatrix.rows(r0, r1).toarray()"))
        return None
    out_fmt = detect_format(os.fspath(split_spec(out)[0]), to_format, output=True)
    if layout == "sparse" and not coordinate:
        raise FormatError(explain("layout", "a sparse output needs a coordinate source (a coordinate Matrix "
                                  "Market file, a scipy.sparse.save_npz file or an HDF5 CSR/CSC group)",
                                  f"{path!r} ({in_fmt})", "drop --sparse (layout='auto')"))
    if coordinate and out_fmt != "zarr":
        if sparse_npz or sparse_h5 or layout == "sparse":
            raise FormatError(explain("out", "a sparse matrix is written to a .zarr group", repr(str(out)),
                                      "write OUT.zarr, then export it (blocklin convert OUT.zarr A.mtx)"))
        return None
    if sparse_h5:
        return "hdf5"
    return "sparse" if coordinate else None


def _hdf5_sparse(path: str, member: str | None) -> bool:
    """Whether ``path:member`` is an HDF5 group holding a CSR/CSC matrix (a group that holds none is
    refused; a dataset is dense)."""
    from blocklin.storage.sparse_hdf5 import hdf5_member_kind

    return os.path.isfile(path) and hdf5_member_kind(path, member) == "sparse"


def sparse_source(src: str, *, member: str | None = None, sparse_format: str | None = None,
                   from_format: str | None = None) -> Any:
    """The coordinate source at ``src``: a Matrix Market coordinate file, a SciPy ``.npz``, or the HDF5
    group ``member`` of ``src`` holding a CSR or CSC matrix (``sparse_format`` when the group does not
    say which)."""
    from blocklin.storage.formats.mtx import MtxReader
    from blocklin.storage.sparse_convert import MtxSource, NpzSource

    if detect_format(src, from_format) == "hdf5":
        from blocklin.storage.sparse_hdf5 import Hdf5SparseSource

        return Hdf5SparseSource(src, member, sparse_format=sparse_format)
    if str(src).lower().endswith(".npz"):
        return NpzSource(src)
    reader = MtxReader(src)
    if reader.layout != "coordinate":
        reader.close()
        raise FormatError(explain("layout", "a sparse output needs a coordinate Matrix Market file",
                                  f"{src!r} is an array (dense) file", "convert it dense: drop --sparse "
                                  "(layout='auto') or pass --dense"))
    return MtxSource(reader)


def _convert_sparse(route: str, src: Any, out: Any, *, memory: Any, dtype: Any, overwrite: bool, nan: str,
                    progress: Any, chunks: Any, codec: Any, checksum: bool, resume: bool,
                    sparse_format: str | None = None, from_format: str | None = None) -> dict[str, Any]:
    """A sparse conversion (:mod:`blocklin.storage.sparse_convert`): options of dense zarr outputs refused."""
    from blocklin.storage.sparse_convert import export_sparse, write_sparse

    for name, value, bad, fix in (
            ("chunks", chunks, parse_chunks(chunks) != "auto", "drop --chunks (row blocks follow the budget)"),
            ("codec", codec, (codec or "none").lower() != "none", "drop --codec (sparse arrays are uncompressed)"),
            ("checksum", checksum, bool(checksum), "drop --checksum"),
            ("resume", resume, bool(resume), "rerun without --resume (a sparse conversion is not resumable)")):
        if bad:
            raise ConfigError(explain(name, "applies to dense outputs only", f"{name}={value!r} for a sparse "
                                      "conversion", f"{fix}, or pass --dense (layout='dense')"))
    path, member = split_spec(src)
    if route == "export":
        ext = os.path.splitext(os.fspath(out).lower())[1]
        fmt = {".mtx": "mtx", ".mm": "mtx", ".npz": "npz"}.get(ext, ext.lstrip(".") or "?")
        return export_sparse(path, out, fmt, memory=memory, overwrite=overwrite, progress=progress)
    check_output_path(out, [path], overwrite=overwrite)
    source = sparse_source(path, member=member if route == "hdf5" else None, sparse_format=sparse_format,
                            from_format=from_format)
    params = {"from": source.kind}
    if route == "hdf5":
        params.update(group=source.group, sparse_format=source.format, convention=source.convention)
    try:
        report, _final = write_sparse(source, out, memory=memory, dtype=dtype, overwrite=overwrite, nan=nan,
                                      progress=progress, inputs=[path], params=params, source_name="src")
    finally:
        source.close()
    report.update({"input": str(src), "from": source.kind, "to": "zarr"})
    if route == "hdf5":
        report.update(sparse_format=source.format, convention=source.convention)
    return report


#: What a reader takes from the caller about how to read its file, beyond shape and dtype: a raw file's
#: order and header offset, a text file's delimiter, skipped lines, comment marker and header.
_READING = ("order", "offset", "delimiter", "skip_rows", "comments", "header_line")


def _resume_token(src: Any, src_path: Any, out_path: Any, in_fmt: str, out_fmt: str, reader: Any,
                  out_dt: np.dtype, out_chunks: Any, codec: str, checksum: bool, nan: str) -> str:
    """Equal for reruns of the same conversion of the same source: what resume matches (the output checks
    that the source's content is unchanged, :mod:`blocklin.storage.stamps`). How the file is read is part
    of it: the same raw file read in the other order (or a text file with other delimiters or skipped
    lines) has other values, and a resumed run must not keep blocks read the first way. So is the NaN
    policy: blocks finished under ``nan="allow"`` were never checked."""
    return resume_token("convert", [], {
        "src": _real(src_path), "spec": str(src), "fmt": in_fmt,
        "shape": list(reader.shape), "in": reader.dtype.str, "out": out_dt.str, "chunks": list(out_chunks),
        "codec": codec, "checksum": bool(checksum), "to": out_fmt, "dst": _real(out_path),
        "reading": {key: getattr(reader, key, None) for key in _READING}, "nan": nan})


def _commit(writer: Any, plan: Any, report: dict, out_path: Any) -> Any:
    """Commit the output with its provenance; ``report`` gains the output as the caller named it and
    the peak memory. Returns what the writer committed."""
    params = {key: report[key] for key in ("chunks", "dtype", "codec", "checksum", "memory", "from")}
    final = writer.commit(operation="convert", plan=plan.to_dict(), params=params, report=dict(report))
    # The output as the caller named it (a local path keeps its spelling; a URL is its URL).
    report["output"] = str(out_path) if isinstance(final, Location) and final.is_local else str(final)
    report["peak_memory"] = _peak_rss()
    return final


def _ends(src: Any, out: Any, storage_options: dict | None, from_format: str | None, to_format: str | None, *,
          overwrite: bool, resume: bool = False) -> tuple[Any, Any, Any, Any, str, str]:
    """Source and output as given (or their locations), their paths and formats, checked.

    Returns ``(src, out, src_path, out_path, in_fmt, out_fmt)``; URLs and store objects hold zarr only.
    """
    src_loc, out_loc = _remote(src, storage_options, "input"), _remote(out, storage_options, "out")
    src_path = src_loc if src_loc is not None else split_spec(src)[0]
    out_path = out_loc if out_loc is not None else split_spec(out)[0]
    in_fmt = "zarr" if src_loc is not None else detect_format(src_path, from_format)
    out_fmt = "zarr" if out_loc is not None else detect_format(out_path, to_format, output=True)
    for loc, fmt, what in ((src_loc, from_format, "from"), (out_loc, to_format, "to")):
        if loc is not None and fmt not in (None, "zarr", "zarr3", "zarr2"):
            raise ConfigError(explain(what, "URLs and store objects hold zarr arrays only", f"{fmt!r} for {loc.url}",
                                      f"convert through a local file, or pass --{what} zarr"))
    if out_loc is None:  # before anything is read; the writer checks again when it claims the output
        check_output_path(out_path, [src_path], overwrite=overwrite, kind=out_fmt, resume=resume)
    if src_loc is not None or out_loc is not None:
        src, out = src_path, out_path
    return src, out, src_path, out_path, in_fmt, out_fmt


def _check_output_encoding(out_fmt: str, codec: str, checksum: bool) -> None:
    """Checksums and codecs are zarr's (gzip also HDF5's)."""
    if out_fmt == "zarr":
        return
    if checksum:
        raise ConfigError(explain("checksum", "checksums are stored in zarr chunks only", f"output {out_fmt}",
                                  "write .zarr, or drop --checksum"))
    if codec not in ("none", "gzip") or (codec == "gzip" and out_fmt != "hdf5"):
        raise ConfigError(explain("codec", f"{out_fmt} output is not compressed by blocklin", repr(codec),
                                  "write .zarr (or .h5 with gzip), or pass --codec none"))


def _reader_options(in_fmt: str, *, shape: Any, dtype: Any, order: str | None, offset: int,
                    delimiter: str | None, skip_rows: int | None, header: Any) -> dict[str, Any]:
    """The options of the raw and CSV readers (``dtype``: the file's dtype)."""
    if in_fmt == "raw":
        return {"shape": shape, "dtype": dtype, "order": order, "offset": offset}
    if in_fmt in ("csv", "tsv"):
        return {"delimiter": delimiter, "skip_rows": skip_rows, "header": header, "dtype": dtype}
    return {}


def _prepare(reader: Any, plan: Any, cfg: Any) -> None:
    """What the reader does before the copy: a symmetric array file is mirrored into a scratch zarr
    under the temp dir (with the strips planned for the plan's budget), other readers load what they
    hold resident."""
    if getattr(reader, "mirrored", False):
        reader.stage(reader.plan_mirror(plan.memory), as_location(cfg.temp_dir, cfg.storage_options, name="temp_dir"))
    reader.prepare()


def _out_chunk_copies(writer: Any) -> int:
    """Copies of an output chunk per zarr write in flight: a contiguous copy and its encoding, and on
    fsspec stores (object stores) the ``bytes`` of the request body too (``FsspecStore.set`` takes
    ``value.to_bytes()``)."""
    loc = getattr(writer, "location", None)
    return 3 if isinstance(loc, Location) and not loc.is_local else 2


def _plan(reader: Any, writer: Any, out_dt: np.dtype, memory: int) -> Any:
    """The block plan: in the order of whichever side is sequential (a whole span then), else the reader's.

    A reader that mirrors a symmetric file first (``mirrored``) plans its staging step for the same
    budget; the copy then reads its scratch (square chunks, no parsing), and the plan's peak is the
    larger of the two steps."""
    mirror = reader.plan_mirror(memory) if getattr(reader, "mirrored", False) else None
    if reader.sequential:
        plan_order, full_span = reader.order, True
    elif writer.sequential:
        plan_order, full_span = writer.order, True
    else:
        plan_order, full_span = reader.order, False
    return plan_convert(
        reader.shape, reader.dtype, out_dt, memory=memory, order=plan_order, unit=writer.unit,
        full_span=full_span, align=reader.chunks, resident=reader.resident_bytes,
        resident_what=reader.resident_what, fixed=(0 if mirror else reader.overhead_bytes) + writer.overhead_bytes,
        in_chunk_bytes=getattr(reader, "chunk_bytes", 0), out_chunk_bytes=getattr(writer, "chunk_bytes", 0),
        relayout=bool(getattr(writer, "relayout_copy", False) and writer.order != plan_order),
        extra_per_element=writer.overhead_per_element, out_chunk_copies=_out_chunk_copies(writer),
        prepare=mirror.peak_memory if mirror else 0,
        prepare_what=f"mirroring the {reader.symmetry} file in strips of {mirror.width} columns" if mirror else "")


def _work(reader, writer, plan, prog):
    """The planned blocks to read, one at a time, each with whether an earlier run finished it.

    A sequential reader must still read skipped panels to move forward; others skip the read too
    (counted on ``prog`` as they are passed). Lazily: a plan of a huge declared shape never holds
    its block list in memory.
    """
    for b in plan.blocks():
        done = bool(writer.supports_resume and writer.is_done(_unit_name(b)))
        if reader.sequential or not done:
            yield b, done
        else:
            prog.advance(1)


#: Steps of the search for a sufficient budget (each grows it by at least a quarter).
_BUDGET_SEARCH_STEPS = 60


def _fitting_plan(reader: Any, writer: Any, out_dt: np.dtype, memory: int, shape: tuple[int, int],
                  auto: bool, *, chunks_given: bool = False) -> Any:
    """:func:`_plan` at ``memory``; a refusal names a budget checked to suffice. With automatic
    chunks the output chunks grow with the budget (and the blocks with them), so the minimum one
    plan names is not enough: the search replans at each candidate with the chunks it would pick.
    Smaller ``--chunks`` are suggested only where the user chose a zarr output's chunks
    (``chunks_given``): a file export has none (its refusals had suggested them)."""
    try:
        return _plan(reader, writer, out_dt, memory)
    except BudgetError as exc:
        need = max(memory + 1, exc.minimum or 0)
        for _ in range(_BUDGET_SEARCH_STEPS):
            hint = parse_size(size_hint(need))
            try:
                _plan(reader, _with_chunks(writer, auto_chunks(shape, out_dt, hint)) if auto else writer, out_dt, hint)
                break
            except BudgetError as again:
                need = max(hint + 1, again.minimum or hint + hint // 4)
        what = re.sub(r" \(needs [^)]*\)", "", str(exc).split(". Fix: ")[0])  # the search's figure replaces it
        raise BudgetError(f"{what}. Fix: raise the budget to at least {size_hint(hint)} "
                          f"(--memory {size_hint(hint)})" + (", or choose smaller --chunks" if chunks_given else ""),
                          minimum=hint) from None


def _with_chunks(writer: Any, chunks: tuple[int, int]) -> Any:
    """A shallow copy of a zarr writer as if it had been opened with ``chunks`` (for planning only)."""
    import copy

    view = copy.copy(writer)
    view.chunks = view.unit = tuple(int(c) for c in chunks)
    view.chunk_bytes = int(np.prod(view.chunks)) * writer.dtype.itemsize
    return view


def _copy(reader, writer, plan, out_dt: np.dtype, nan: str, progress: Any, desc: str,
          tally: PeakTally | None = None) -> tuple[int, int]:
    """Copy every planned block, their peaks merged into ``tally``; returns (blocks, blocks skipped
    as already done)."""
    import zarr

    prog = make_progress(progress)
    prog.start(plan.n_blocks, desc)
    copied = 0

    def read(b):
        r0, r1, c0, c1 = b
        return reader.read(slice(r0, r1), slice(c0, c1))

    try:
        with zarr.config.set({"async.concurrency": plan.concurrency}), \
                ThreadPoolExecutor(max_workers=1, thread_name_prefix="blocklin-read") as pool:
            work = _work(reader, writer, plan, prog)
            cur = next(work, None)
            nxt = pool.submit(read, cur[0]) if cur is not None else None
            while cur is not None:
                b, is_done = cur
                data = nxt.result()
                cur = next(work, None)
                nxt = pool.submit(read, cur[0]) if cur is not None and plan.depth > 1 else None
                if not is_done:
                    _write_block(reader, writer, data, b, out_dt, nan, tally)
                    copied += 1
                del data
                prog.advance(1)
                if nxt is None and cur is not None:
                    nxt = pool.submit(read, cur[0])
    finally:
        prog.close()
    return plan.n_blocks, plan.n_blocks - copied


def _write_block(reader, writer, data: np.ndarray, b, out_dt: np.dtype, nan: str,
                 tally: PeakTally | None = None) -> None:
    _check(reader, data, b, out_dt, nan)
    block = data.astype(out_dt, copy=False)
    r0, r1, c0, c1 = b
    writer.write(slice(r0, r1), slice(c0, c1), block)
    if tally is not None:
        tally.add(block, r0, c0)
    writer.mark_done(_unit_name(b))


def _cluster_client(scheduler: Any) -> Any:
    """The distributed client a zarr-to-zarr conversion runs on (given, or active), else None."""
    import sys

    scheduler = resolve(scheduler=scheduler).scheduler
    if hasattr(scheduler, "submit") and hasattr(scheduler, "gather"):
        return scheduler
    if isinstance(scheduler, str) and "://" in scheduler:
        return _connected(scheduler.strip())
    if scheduler in (None, "distributed") and "distributed" in sys.modules:
        from distributed import get_client

        try:
            return get_client()
        except ValueError:
            return None
    return None


def _threads_per_worker(client: Any) -> int:
    """Threads of the busiest worker process of ``client``'s cluster (1 when it cannot say)."""
    try:
        workers = client.scheduler_info().get("workers", {})
        return max([int(w.get("nthreads", 1)) for w in workers.values()] or [1])
    except Exception:  # noqa: BLE001 - a plan for one thread is still a valid plan
        return 1


@functools.lru_cache(maxsize=4)
def _connected(address: str) -> Any:
    from distributed import Client

    return Client(address, set_as_default=False)


class _Positions:
    """Element positions for messages of blocks copied on a worker (0-based in, 1-based out)."""

    @staticmethod
    def locate(row: int, col: int) -> str:
        return f"row {row + 1}, column {col + 1}"


def _copy_block_task(src: Location, dst: Location, done: Location | None, b: tuple[int, int, int, int],
                     out_dtype: str, nan: str, peaks: bool | None = None) -> tuple[int, np.ndarray | None]:
    """Task: copy one planned block (whole output chunks) of a zarr array; returns the bytes read and,
    where asked, the block's peaks (``peaks``: each row's where True, each column's where False; None
    for a block an earlier run copied)."""
    unit = _unit_name(b)
    if is_done(done, unit):
        return 0, None
    r0, r1, c0, c1 = b
    data = read_block(open_cached(src), slice(r0, r1), slice(c0, c1))
    out_dt = np.dtype(out_dtype)
    _check(_Positions, data, b, out_dt, nan)
    block = data.astype(out_dt, copy=False)
    write_block(open_cached(dst, "r+"), slice(r0, r1), slice(c0, c1), block)
    if done is not None:
        mark_done(done, unit)
    return int(data.nbytes), None if peaks is None else block_peaks(block, rows=peaks)


def _copy_on_cluster(client, reader, writer, plan, out_dt: np.dtype, nan: str, progress: Any,
                     desc: str, tally: PeakTally | None = None) -> tuple[int, int]:
    """Copy every planned block on the workers, one task per block (the plan's budget per task)."""
    from distributed import as_completed

    src, dst, done = reader.location, writer.location, writer.done
    prog = make_progress(progress)
    prog.start(plan.n_blocks, desc)
    window = 4 * max(1, _threads_per_worker(client)) * max(1, len(client.scheduler_info().get("workers", {})))
    submitted = 0
    corner: dict = {}  # the first row and column of each block in flight, by its future's key
    try:  # a window of blocks in flight: the plan's block list is never held whole
        running = as_completed([], loop=client.loop)  # this client's loop: it need not be the default client
        for b in plan.blocks():
            if writer.is_done(_unit_name(b)):
                prog.advance(1)
                continue
            fut = client.submit(_copy_block_task, src, dst, done, b, out_dt.str, nan,
                                None if tally is None else tally.transposed, pure=False)
            corner[fut.key] = (b[0], b[2])
            running.add(fut)
            submitted += 1
            while running.count() >= window:
                _collect(next(running), reader, prog, tally, corner)
        for fut in running:
            _collect(fut, reader, prog, tally, corner)
    finally:
        prog.close()
    return plan.n_blocks, plan.n_blocks - submitted


def _collect(fut, reader, prog, tally: PeakTally | None = None, corner: dict | None = None) -> None:
    nbytes, peaks = fut.result()
    r0, c0 = corner.pop(fut.key, (0, 0)) if corner is not None else (0, 0)
    reader.bytes_read += nbytes
    if tally is not None:
        if peaks is None:  # copied by an earlier run: its values were not seen
            tally.skipped()
        else:
            tally.merge(peaks, r0, c0)
    prog.advance(1)


def _check(reader, data: np.ndarray, b, out_dt: np.dtype, nan: str) -> None:
    """NaN policy and integer-narrowing overflow, with the position of the first offender."""
    r0, _r1, c0, _c1 = b
    if nan == "error" and data.dtype.kind in "fc":
        bad = np.isnan(data)
        if bad.any():
            i, j = np.argwhere(bad)[0]
            raise NonFiniteError(explain("input", "must not hold NaN when nan='error'",
                                         f"NaN at {reader.locate(r0 + int(i), c0 + int(j))}",
                                         "fix the value, or pass nan='allow' (CLI: --nan allow)"))
    if data.dtype.kind in "iu" and out_dt.kind in "iu" and not np.can_cast(data.dtype, out_dt, "safe") \
            and data.size:
        info = np.iinfo(out_dt)
        lo, hi = data.min(), data.max()
        if lo < info.min or hi > info.max:
            bad = (data < info.min) | (data > info.max)
            i, j = np.argwhere(bad)[0]
            raise DTypeError(explain("dtype", f"values must fit {out_dt.name} ({info.min}..{info.max})",
                                     f"{data[i, j]} at {reader.locate(r0 + int(i), c0 + int(j))}",
                                     "pick a wider dtype"))
    if out_dt.kind in "fc" and data.dtype.kind in "iufc" and data.size:
        _check_float_range(reader, data, r0, c0, out_dt)


def _check_float_range(reader, data: np.ndarray, r0: int, c0: int, out_dt: np.dtype) -> None:
    """A finite value the cast to a narrower float turns into Inf (1e300 to float32, 1e5 to float16) is
    refused with its position, as an integer that does not fit is: it had been written as Inf."""
    top = float(np.finfo(out_dt).max)
    parts = (data.real, data.imag) if data.dtype.kind == "c" else (data,)
    # as Python floats: a float32 max compared with a float64 one is cast to float32 (NumPy 2), which overflows
    if data.dtype.kind in "fc" and float(np.finfo(data.dtype).max) <= top or data.dtype.kind in "iu" and \
            float(np.iinfo(data.dtype).max) <= top:
        return  # every finite value of the input dtype fits
    with np.errstate(invalid="ignore", over="ignore"):
        if all(float(np.nanmax(p)) <= top and float(np.nanmin(p)) >= -top or not np.isfinite(p).any() for p in parts):
            return
        for p in parts:  # rare: find a finite value that the cast overflows
            bad = np.isfinite(p) & np.isinf(p.astype(np.finfo(out_dt).dtype))
            if bad.any():
                i, j = np.argwhere(bad)[0]
                raise DTypeError(explain("dtype", f"values must fit {out_dt.name} (magnitudes up to {top:.6g})",
                                         f"{data[i, j]} at {reader.locate(r0 + int(i), c0 + int(j))}",
                                         "pick a wider dtype, or scale the data first"))


def _staged(src: Any, out: Any, kw: dict) -> dict[str, Any]:
    """Sequential source and sink in opposite orders: go through a temporary zarr (rechunker's way)."""
    import uuid

    from blocklin.storage.cleanup import sweep_stale
    from blocklin.storage.ownership import end_work_folder, start_work_folder

    cfg = kw["cfg"]
    root = as_location(cfg.temp_dir, cfg.storage_options, name="temp_dir")
    if root.is_local:  # what killed runs left there goes first, as a job's first temp_dir() does
        sweep_stale(root)
    stage_dir = root / f"blocklin-stage-{uuid.uuid4().hex[:12]}"
    stage = stage_dir / "stage.zarr"
    t0 = kw["t0"]
    try:
        start_work_folder(stage_dir, operation="convert-stage")  # owned: a killed run's is swept, or cleaned
        first = convert(src, stage, chunks="auto", dtype=kw["dtype"], codec="none", memory=cfg.memory,
                        from_format=kw["from_format"], shape=kw["shape"], in_dtype=kw["in_dtype"], order=kw["order"],
                        offset=kw["offset"], delimiter=kw["delimiter"], skip_rows=kw["skip_rows"],
                        header=kw["header"], nan=kw["nan"], progress=kw["progress"])
        second = convert(stage, out, chunks=kw["chunks"], codec=kw["codec"], memory=cfg.memory,
                         overwrite=kw["overwrite"], to_format=kw["to_format"], out_order=kw["out_order"],
                         delimiter=kw["delimiter"], progress=kw["progress"])
    finally:
        end_work_folder(stage_dir)
    report = dict(second)
    report.update(input=str(src), staged=True, bytes_read=first["bytes_read"], from_=None,
                  seconds=time.perf_counter() - t0, blocks=first["blocks"] + second["blocks"],
                  planned_memory=max(first["planned_memory"], second["planned_memory"]),
                  peak_memory=_peak_rss(), **{"from": first["from"]})
    report.pop("from_", None)
    return report


__all__ = ["convert", "output_dtype", "parse_chunks", "FormatError"]
