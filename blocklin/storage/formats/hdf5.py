"""HDF5 datasets (``file.h5:/group/dataset``), read and written with h5py (extra ``hdf5``).

Reads go through ``Dataset.read_direct`` into a fresh block, so only the block (and HDF5's chunk
cache, capped here) is resident.

The output is one dataset (``file.h5:/group/name``, default ``/data``). Into a new file it is
written under a temporary file name and renamed into place, and the file is recorded as blocklin's
(:mod:`blocklin.storage.file_records`: ``.file.h5.blocklin``, listing the datasets blocklin wrote).
Only such a file, unchanged since its record, is written into in place (an empty file too): as a
temporary dataset of that file (``/.blocklin-partial-NAME``) moved to its name when complete, so
the file's other datasets and groups are never touched, and with ``overwrite`` an old dataset of
that name (one blocklin wrote) stays readable until the new one replaces it (``del`` then
``Group.move``); the record is rewritten once the file is closed. An HDF5 file another program
wrote (or changed since) is refused, as is a file there that is not HDF5, a dataset blocklin did
not write, and a group (not a dataset) at the name, since replacing it would delete what it holds.
HDF5 has no crash-safe update of a file: a process killed mid-write leaves the temporary dataset
and a file that no longer matches its record (refused from then on, naming the interrupted write),
and HDF5 does not give the space of deleted datasets back (``h5repack`` does).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from blocklin.errors import ConfigError, DTypeError, FormatError, OutputExistsError, explain
from blocklin.storage import file_records
from blocklin.storage.cleanup import note_written
from blocklin.storage.guard import check_output
from blocklin.storage.formats.base import AtomicFile, Reader, Writer, check_2d, check_matrix_dtype, require_file

_CACHE_BYTES = 4 << 20  # HDF5 raw-chunk cache per open file


def complex_parts(dt: np.dtype) -> tuple[str, str] | None:
    """The field names of a compound of two floats of one precision that other writers use for complex
    values (``real``/``imag``, ``re``/``im``, ``r``/``i`` in another case): h5py reads its own layout
    (fields ``r`` and ``i``) as complex, these as structured records."""
    names = dt.names or ()
    if len(names) != 2 or dt.fields[names[0]][0] != dt.fields[names[1]][0] or dt.fields[names[0]][0].kind != "f":
        return None
    pair = tuple(n.lower() for n in names)
    return names if pair in (("real", "imag"), ("re", "im"), ("r", "i")) else None


def _matrix_dtype(ds: Any, path: str) -> np.dtype:
    """A dataset's dtype where it holds numbers; a compound of real and imaginary parts is refused naming
    them and the rewrite into h5py's complex layout (the generic refusal, "must hold numbers (bool, integer,
    float or complex)", had named no dataset and no way out for data that is complex)."""
    dt = np.dtype(ds.dtype)
    parts = complex_parts(dt)
    if parts is None:
        return check_matrix_dtype(dt, f"hdf5 dataset {ds.name}")
    re, im = parts
    raise DTypeError(explain(
        f"hdf5 dataset {ds.name}", "must hold numbers; complex values must be in h5py's complex layout (what "
        "h5py writes for a complex NumPy array: a compound of two floats named 'r' and 'i')",
        f"complex values as a compound of fields {re!r} and {im!r} ({dt.fields[re][0].name} each)",
        f"rewrite them as a complex dataset with h5py: with h5py.File({path!r}, 'r+') as f: "
        f"f['{ds.name}_c'] = f['{ds.name}']['{re}'] + 1j * f['{ds.name}']['{im}'] (or row blocks of it), then "
        f"convert {path}:{ds.name}_c"))


def _h5py():
    try:
        import h5py
    except ImportError:  # pragma: no cover - depends on the environment
        raise ConfigError(explain("hdf5", "needs the h5py package", "h5py is not installed",
                                  "pip install 'blocklin[hdf5]'")) from None
    return h5py


class Hdf5Reader(Reader):
    """One 2-D dataset of an HDF5 file, or a 1-D one read as an ``n x 1`` column."""

    format = "hdf5"

    def __init__(self, path: str, dataset: str | None = None, **_: Any) -> None:
        h5py = _h5py()
        super().__init__(require_file(path))
        try:
            self._f = h5py.File(path, "r", rdcc_nbytes=_CACHE_BYTES)
        except OSError as exc:
            raise FormatError(explain("hdf5 input", "must be a readable HDF5 file", f"{path!r} ({exc})",
                                      "check the file, or pass --from")) from None
        if dataset is None:
            found: list[str] = []
            self._f.visititems(lambda name, obj: found.append("/" + name)
                               if isinstance(obj, h5py.Dataset) and obj.ndim == 2 else None)
            if len(found) != 1:
                self._f.close()
                raise FormatError(explain("hdf5 input", "must name its dataset unless the file holds one 2-D dataset",
                                          f"2-D datasets {found}", f"write {path}:{found[0] if found else '/NAME'}"))
            dataset = found[0]
        obj = self._f.get(dataset)
        if not isinstance(obj, h5py.Dataset):
            names: list[str] = []
            self._f.visititems(lambda name, o: names.append("/" + name) if isinstance(o, h5py.Dataset) else None)
            self._f.close()
            raise FormatError(explain("hdf5 dataset", "must name a dataset in the file", repr(dataset),
                                      f"pick one of {names[:10]}"))
        self._ds = obj
        self.dataset = obj.name
        self.shape = check_2d(obj.shape, "hdf5 dataset", vector=True)  # 1-D: an n x 1 column, as a .npy's
        self.ndim = obj.ndim
        self.dtype = _matrix_dtype(obj, path)
        self.chunks = (tuple(obj.chunks) if obj.ndim == 2 else (obj.chunks[0], 1)) if obj.chunks else None
        self.overhead_bytes = _CACHE_BYTES

    def read(self, rows: slice, cols: slice) -> np.ndarray:
        r0, r1, _ = rows.indices(self.shape[0])
        c0, c1, _ = cols.indices(self.shape[1])
        out = np.empty((r1 - r0, c1 - c0), self.dtype)
        if out.size:  # a 1-D dataset's rows into the column's contiguous buffer (its one column, c0 = 0)
            self._ds.read_direct(out, np.s_[r0:r1, c0:c1]) if self.ndim == 2 else \
                self._ds.read_direct(out.reshape(-1), np.s_[r0:r1])
        self.bytes_read += out.nbytes
        return out

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d.update(dataset=self.dataset, codec=self._ds.compression or "none")
        try:
            d["bytes_on_disk"] = int(self._ds.id.get_storage_size())
        except Exception:  # pragma: no cover
            pass
        return d

    def close(self) -> None:
        self._f.close()


class Hdf5Writer(Writer):
    """One dataset (default ``/data``) of a new or an existing HDF5 file; ``codec`` none or gzip."""

    format = "hdf5"

    def __init__(self, path: str, shape: tuple[int, int], dtype: Any, *, dataset: str | None = None,
                 chunks: Any = None, codec: str | None = None, inputs: list[str] = (), overwrite: bool = False,
                 token: str | None = None, **_: Any) -> None:
        h5py = _h5py()
        super().__init__(path, shape, check_matrix_dtype(dtype, "dtype"))
        codec = (codec or "none").lower()
        if codec not in ("none", "gzip"):
            raise ConfigError(explain("codec", "HDF5 output supports 'none' or 'gzip'", repr(codec),
                                      "pass --codec none or --codec gzip"))
        # Only an HDF5 file blocklin created (or an empty one) is written into; anything else is refused.
        check_output(path, inputs, overwrite=overwrite, kind="hdf5")
        rec = file_records.read(path)
        self._ours = list(rec.get("datasets") or []) if rec else []  # the datasets blocklin wrote there
        self._marked = False
        self.dataset = "/" + (dataset or "/data").strip("/")
        self.overwrite = overwrite
        self._atomic = None if os.path.lexists(path) else AtomicFile(path, inputs=list(inputs), overwrite=overwrite,
                                                                      token=token, kind="hdf5")
        h5chunks = None
        if codec == "gzip" or isinstance(chunks, tuple):
            h5chunks = tuple(max(1, min(int(c), max(1, s))) for c, s in zip(
                chunks if isinstance(chunks, tuple) else (256, 256), self.shape))
            self.unit = h5chunks
            self.chunks = h5chunks
        self._tmp = self.dataset if self._atomic else "/.blocklin-partial-" + self.dataset.strip("/").replace("/", "%")
        self._f = None
        if not self._atomic and os.path.getsize(path):  # a refusal leaves the file as it was: checked read-only
            with h5py.File(path, "r") as f:
                self._check_target(h5py, f)
        try:
            self._f = h5py.File(self._atomic.partial if self._atomic else path, "w" if self._atomic else "a",
                                rdcc_nbytes=_CACHE_BYTES)
            if not self._atomic:
                # the file is open (h5py holds its lock): say so before the first change
                file_records.write(path, "hdf5", datasets=self._ours, writing=self.dataset)
                self._marked = True
                self._check_target(h5py, self._f)
                if self._tmp in self._f:  # what a killed write to this name left
                    del self._f[self._tmp]
            self._ds = self._f.create_dataset(self._tmp, shape=self.shape, dtype=self.dtype,
                                              chunks=h5chunks if min(self.shape, default=0) > 0 else None,
                                              compression="gzip" if codec == "gzip" else None)
        except BaseException:
            self.abort()
            raise
        self.overhead_bytes = _CACHE_BYTES
        self.overhead_per_element = self.dtype.itemsize  # a C-contiguous copy of the block
        self.bytes_written = 0

    def _check_target(self, h5py: Any, f: Any) -> None:
        """In an existing file ``f``: the named dataset exists only with ``overwrite``, is a dataset, and
        is one blocklin wrote."""
        parts = self.dataset.strip("/").split("/")
        for i in range(1, len(parts)):  # every parent must be a group (or not exist yet)
            parent = "/" + "/".join(parts[:i])
            if parent in f and not isinstance(f.get(parent), h5py.Group):
                raise OutputExistsError(explain("out", "an HDF5 dataset's parents must be groups",
                                                f"{self.path}:{parent} is a dataset",
                                                f"name a dataset beside it, e.g. {self.path}:{parent}_{parts[-1]}"))
        old = f.get(self.dataset, getlink=True)
        if old is None:
            return
        where = f"{self.path}:{self.dataset}"
        node = f.get(self.dataset)
        if not isinstance(node, h5py.Dataset):
            what = "a group" if isinstance(node, h5py.Group) else "a link to no dataset"
            raise OutputExistsError(explain("out", "an HDF5 output replaces a dataset only, never a group (it holds "
                                            "other data)", f"{where!r}, {what}", "name a new dataset, e.g. "
                                            f"{self.path}:{self.dataset.rstrip('/')}/data"))
        if not self.overwrite:
            raise OutputExistsError(explain("out", "must not exist unless overwriting is asked for",
                                            f"dataset {where!r} exists", "pass overwrite=True (CLI: --overwrite) "
                                            "to replace that dataset (the file's others are kept), or name another"))
        if node.name not in self._ours:
            raise OutputExistsError(explain("out", "overwrite replaces only a dataset blocklin wrote (listed in the "
                                            f"file's record {os.path.basename(file_records.record_path(self.path))})",
                                            f"dataset {where!r}, which blocklin did not write",
                                            "name another dataset, or remove that one by hand if it may go "
                                            f"(h5py: del f[{self.dataset!r}])"))

    def write(self, rows: slice, cols: slice, block: np.ndarray) -> None:
        if block.size:
            self._ds[rows, cols] = np.ascontiguousarray(block, dtype=self.dtype)
        self.bytes_written += block.size * self.dtype.itemsize

    def commit(self, **_: Any) -> str:
        if self._atomic is not None:
            self._f.close()
            return str(self._atomic.commit(datasets=[self.dataset]))
        import h5py

        try:
            self._check_target(h5py, self._f)  # checked again: another writer may have made it meanwhile
            if self.dataset in self._f:
                del self._f[self.dataset]  # the new one is complete: only now does the old one go
            parent = self.dataset.rsplit("/", 1)[0]
            if parent:
                self._f.require_group(parent)
            self._f.move(self._tmp, self.dataset)
        except BaseException:
            self.abort()
            raise
        self._f.close()
        self._f = None
        self._ours.append(self.dataset)
        note_written(f"{self.path}:{self.dataset}")
        file_records.write(self.path, "hdf5", datasets=self._ours)
        self._marked = False
        return self.path

    def abort(self) -> None:
        if self._f is not None:
            try:
                if self._atomic is None and self._f.id.valid and self._tmp in self._f:
                    del self._f[self._tmp]
                self._f.close()
            except Exception:
                pass
            self._f = None
        if self._marked:  # closed: the file is blocklin's, as it was, but for its temporary dataset
            file_records.write(self.path, "hdf5", datasets=self._ours)
            self._marked = False
        if self._atomic is not None:
            self._atomic.abort()
