"""What an output may be: the rules that keep a write from destroying anything blocklin did not write.

Every output of every operation and converter is checked here before anything is claimed:

* **Not an input, not inside one, not holding one.** Local paths are compared resolved (symlinks
  followed), URLs by scheme and normalized bucket/prefix, component by component: ``s3://b/x``
  holds ``s3://b/x/y`` but not ``s3://b/xy``. The file of an HDF5 or ``.npz`` member
  (``file.h5:/dataset``) is what is compared. Two existing local paths that are one file (a hard
  link; device and inode equal) are the same too: an HDF5 output written into the input's file would
  modify the input.
* **Not the temp dir, nor a folder above it**: jobs create and remove their work folders there,
  other runs' included. The temp dir must not be an input or inside one either (inputs are never
  modified, not even by a work folder that comes and goes).
* **``overwrite`` replaces only what may go**: a zarr array or group blocklin wrote (its root
  attributes carry ``"blocklin"`` provenance, written by ``AtomicOutput.commit``, and it holds
  nothing but zarr metadata, chunks and blocklin's records, of its root and of the member arrays its
  provenance lists: another array or folder put inside it later is someone else's), an empty folder,
  or for a file export a file blocklin wrote and nobody changed since: its record
  ``.NAME.blocklin`` (:mod:`blocklin.storage.file_records`, written by every file commit) still
  matches its size, times, device and inode, and it is still of that format (``.npy`` magic,
  Matrix Market header, text for CSV/TSV, the zip signature for ``.npz``; a CLI ``--plot`` image,
  whose formats have no one signature, by its record's format); or an empty file.
  Anything else (a zarr array or a file another tool wrote, blocklin's file rewritten since, a
  folder of other files, a file where a zarr folder would go, a folder where a file would go, a
  symbolic link, even to a blocklin output: the commit would replace the link, not its target) is
  refused with the command that removes it by hand. An HDF5 output names a dataset and goes into
  a new file or, in place, into a file blocklin created whose record still matches (an empty file
  too), replacing only a dataset the record lists (checked by the writer); another program's HDF5
  file is refused whatever it holds, with the way to copy the dataset in by hand.
* **Object stores** hold zarr outputs only (``convert`` refuses a file format at a URL, and sparse
  exports are local): their prefixes obey the zarr rule above (:func:`check_replaceable_prefix`).

Refusing is always safe; deleting cannot be undone. So URLs are compared without their storage
options (two endpoints with the same bucket name are treated as one).
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Iterable
from typing import Any

from blocklin.errors import OutputExistsError, OutputIsInputError, ParameterError, TempDirError, explain
from blocklin.storage import file_records
from blocklin.storage.location import Location, as_location

#: Output kinds: the zarr store every operation writes, and the file formats of ``convert``.
FILE_KINDS = ("npy", "npz", "mtx", "csv", "tsv", "raw", "hdf5")
_MEMBER_RE = re.compile(r"^(.*?\.(?:npz|h5|hdf5|he5|hdf)):.*$", re.IGNORECASE)
_SCHEME_ALIASES = {"s3a": "s3", "gcs": "gs", "abfss": "abfs", "az": "abfs"}
_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


# -- comparing locations ---------------------------------------------------------------------------
def _key(x: Any) -> tuple[str, tuple[str, ...]] | None:
    """``(scheme, path components)`` of a location, local paths resolved; None for what names no storage."""
    if isinstance(x, Location):
        if x.is_local or x.scheme == "file":
            return _local_key(x.path)
        return _url_key(x.url)
    if isinstance(x, os.PathLike):
        x = os.fspath(x)
    if isinstance(x, bytes):
        x = x.decode()
    if not isinstance(x, str):
        try:
            return _key(as_location(x))  # a zarr store or array
        except (TypeError, ValueError):
            return None
    if "://" in x:
        scheme, rest = x.split("://", 1)
        return _local_key(rest) if scheme.lower() == "file" else _url_key(x)
    path = os.path.expanduser(x)
    m = _MEMBER_RE.match(path)
    if m and not os.path.exists(path):
        path = m.group(1)
    return _local_key(path)


def _local_key(path: str) -> tuple[str, tuple[str, ...]]:
    real = os.path.realpath(os.path.abspath(os.path.expanduser(path)))
    return "local", tuple(p for p in real.split(os.sep) if p)


def _url_key(url: str) -> tuple[str, tuple[str, ...]]:
    scheme, rest = url.split("://", 1)
    scheme = scheme.lower()
    return _SCHEME_ALIASES.get(scheme, scheme), tuple(p for p in rest.split("/") if p)


def relation(a: Any, b: Any) -> str | None:
    """How location ``a`` stands to ``b``: ``"same"``, ``"inside"`` (a below b), ``"contains"`` or None."""
    ka, kb = _key(a), _key(b)
    if ka is None or kb is None or ka[0] != kb[0]:
        return None
    pa, pb = ka[1], kb[1]
    if pa == pb or (ka[0] == "local" and same_file(pa, pb)):
        return "same"
    if pa[: len(pb)] == pb:
        return "inside"
    if pb[: len(pa)] == pa:
        return "contains"
    return None


def same_file(pa: tuple[str, ...], pb: tuple[str, ...]) -> bool:
    """Whether two existing local paths (resolved components) are one file under two names: a hard
    link, or a folder reached through a bind mount (device and inode compared)."""
    try:
        return pa != pb and os.path.samefile(os.sep + os.sep.join(pa), os.sep + os.sep.join(pb))
    except OSError:  # one does not exist (yet): not the same file
        return False


def _shown(x: Any) -> str:
    return x.url if isinstance(x, Location) else os.fspath(x) if isinstance(x, (str, os.PathLike)) else str(x)


def check_not_input(out: Any, inputs: Iterable[Any], name: str = "out") -> None:
    """Refuse an output equal to, inside or holding any input (:class:`OutputIsInputError`)."""
    shown = _shown(out)
    for inp in inputs:
        if inp is None:
            continue
        rel = relation(out, inp)
        if rel == "same":
            linked = _key(out) != _key(inp)  # names differ: a hard link (or mount) to the input
            got = (f"{shown!r}, the same file as the input {_shown(inp)!r} under another name (a hard link "
                   "or a bind mount)" if linked
                   else f"{shown!r}, which is also an input")
            path = os.sep + os.sep.join(_key(out)[1])
            # a second name of a file may go (the input stays); a mount's contents are the input's
            fix = f"remove that name first (rm {shlex.quote(path)}: the input stays) or choose another output " \
                "path" if linked and not os.path.isdir(path) else "choose another output path"
            raise OutputIsInputError(explain(name, "must differ from every input (inputs are never modified)",
                                             got, fix))
        if rel == "inside":
            raise OutputIsInputError(explain(name, "must not be inside an input (inputs are never modified)",
                                             f"{shown!r}, inside the input {_shown(inp)!r}",
                                             "choose an output path outside every input"))
        if rel == "contains":
            raise OutputIsInputError(explain(name, "must not hold an input (replacing it would delete the input)",
                                             f"{shown!r}, which holds the input {_shown(inp)!r}",
                                             f"name a new store instead, such as {_join(shown, 'C.zarr')}"))


def check_not_output(out: Any, others: Iterable[Any], name: str = "outputs") -> None:
    """Refuse an output equal to, inside or holding another output of the same operation (the
    commit of one would replace, or be replaced by, the other)."""
    for other in others:
        rel = relation(out, other)
        if rel is not None:
            where = {"same": "the same as", "inside": "inside", "contains": "holding"}[rel]
            raise ParameterError(explain(name, "must not overlap each other (one commit would replace the other)",
                                         f"{_shown(out)!r}, {where} the output {_shown(other)!r}",
                                         "give each output its own path (siblings such as R.zarr and Q.zarr)"))


def check_temp_dir(out: Any, inputs: Iterable[Any], temp_dir: Any, name: str = "out") -> None:
    """Refuse an output that is (or holds) the temp dir, and a temp dir that is (or is inside) an input."""
    if temp_dir is None:
        return
    rel = relation(out, temp_dir)
    if rel in ("same", "contains"):
        raise TempDirError(explain(name, "must not be the temp dir or hold it (jobs create and remove their work "
                                   "folders there)", f"{_shown(out)!r}, temp dir {_shown(temp_dir)!r}",
                                   "choose another output path, or another temp dir (--temp-dir, "
                                   "BLOCKLIN_TEMP_DIR)"))
    for inp in inputs:
        if inp is not None and relation(temp_dir, inp) in ("same", "inside"):
            raise TempDirError(explain("temp_dir", "must not be an input or inside one (inputs are never modified)",
                                       f"{_shown(temp_dir)!r}, input {_shown(inp)!r}",
                                       "pass another temp dir (--temp-dir DIR, BLOCKLIN_TEMP_DIR)"))


def _join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name


# -- what overwrite may replace --------------------------------------------------------------------
def removal_command(loc: Any, *, folder: bool = True) -> str:
    """The shell command that removes ``loc`` by hand (what the refusals suggest)."""
    loc = as_location(loc) if not isinstance(loc, Location) else loc
    if loc.is_local or loc.scheme == "file":
        return f"rm {'-r ' if folder else ''}{shlex.quote(loc.path)}"
    prefix = loc.url.rstrip("/") + "/"  # the slash: never a sibling whose name starts the same
    if loc.scheme in ("s3", "s3a"):
        return f"aws s3 rm --recursive {shlex.quote('s3://' + prefix.split('://', 1)[1])}"
    if loc.scheme in ("gs", "gcs"):
        return f"gcloud storage rm --recursive {shlex.quote('gs://' + prefix.split('://', 1)[1])}"
    return f"remove every object under {prefix} with your storage's tools"


def zarr_provenance(read: Any) -> str | None:
    """``"blocklin"`` (a zarr node whose attributes carry blocklin's provenance), ``"zarr"`` (another
    zarr node, or unreadable metadata) or None (no zarr metadata); ``read(key)`` returns bytes or None."""
    raw = read("zarr.json")
    if raw is not None:
        try:
            meta = json.loads(raw)
        except ValueError:
            return "zarr"
        attrs = meta.get("attributes") if isinstance(meta, dict) else None
        return "blocklin" if isinstance(attrs, dict) and isinstance(attrs.get("blocklin"), dict) else "zarr"
    if read(".zarray") is None and read(".zgroup") is None:
        return None
    raw = read(".zattrs")
    try:
        attrs = json.loads(raw) if raw is not None else {}
    except ValueError:
        return "zarr"
    return "blocklin" if isinstance(attrs, dict) and isinstance(attrs.get("blocklin"), dict) else "zarr"


#: Keys of a zarr v3 store that are blocklin's wherever they lie: its own records, and the temporary
#: chunk names a killed writer leaves (blocklin's, zarr's).
_RECORD_KEY = re.compile(r"^(?:.*/)?(?:\.blocklin-[^/]*|[^/]*\.tmp-\d+-[0-9a-f]+|[^/]*\.[0-9a-f]{32}\.partial)$"
                         r"|^(?:.*/)?\.blocklin-[^/]*/.*$")
#: A zarr node's own keys: ``NODE/zarr.json`` and its chunks (default ``c/i/j`` encoding); group 1 is
#: the node's path (empty at the root).
_NODE_KEY = re.compile(r"^(?:(.*)/)?(?:zarr\.json|c(?:/\d+)+)$")
#: The provenance entry listing the member arrays of a blocklin output (node paths below its root).
MEMBERS_KEY = "members"


def foreign_keys(keys: Iterable[str], members: Iterable[str] = ()) -> list[str]:
    """The keys (relative paths) of a store that blocklin would not have written there: anything but
    its records and the metadata and chunks of the root and of ``members`` (the node paths its commit
    listed, :func:`output_members`). A zarr array someone put inside a blocklin output is not blocklin's:
    its keys look like blocklin's own but lie under a node that no commit listed."""
    nodes = {""} | set(members)
    out = []
    for k in keys:
        if _RECORD_KEY.match(k):
            continue
        m = _NODE_KEY.match(k)
        if m is None or (m.group(1) or "") not in nodes:
            out.append(k)
    return out


def output_members(keys: Iterable[str]) -> list[str]:
    """The paths of the zarr nodes below the root among a partial output's ``keys`` (what its
    commit records in the provenance's :data:`MEMBERS_KEY`, for :func:`foreign_keys`)."""
    from blocklin.storage.records import DEFERRED_META

    nodes = set()
    for k in keys:
        head, _, leaf = k.rpartition("/")
        if head and leaf in ("zarr.json", DEFERRED_META) and not _RECORD_KEY.match(head + "/x"):
            nodes.add(head)
    return sorted(nodes)


def recorded_members(read: Any) -> list[str]:
    """The member node paths the provenance of the blocklin output read by ``read(key)`` lists; for a
    group committed before commits listed them, those of its operation's layout
    (:func:`blocklin.storage.layouts.layout_members`); none otherwise (its root alone is blocklin's)."""
    prov = _provenance(read)
    members = prov.get(MEMBERS_KEY) if prov else None
    if isinstance(members, list):
        return [m for m in members if isinstance(m, str)]
    if prov is None:
        return []
    from blocklin.storage.layouts import layout_members

    try:
        layout = layout_members(json.loads(read("zarr.json") or b"null"))
    except ValueError:
        return []
    # a layout's name is blocklin's only as a plain array: a group, or an output of its own (provenance
    # in its attributes), put there under that name is someone else's
    return [m for m in layout if _plain_array(read(f"{m}/zarr.json"))]


def _plain_array(raw: bytes | None) -> bool:
    try:
        meta = json.loads(raw) if raw is not None else None
    except ValueError:
        return False
    attrs = meta.get("attributes") if isinstance(meta, dict) else None
    return isinstance(meta, dict) and meta.get("node_type") == "array" and not (isinstance(attrs, dict)
                                                                              and "blocklin" in attrs)


def _provenance(read: Any) -> dict | None:
    """The ``"blocklin"`` attributes of the zarr node read by ``read(key)`` (v3, or v2 ``.zattrs``)."""
    raw = read("zarr.json")
    try:
        if raw is not None:
            attrs = json.loads(raw).get("attributes")
        else:
            raw = read(".zattrs")
            attrs = json.loads(raw) if raw is not None else None
    except (ValueError, AttributeError):
        return None
    prov = attrs.get("blocklin") if isinstance(attrs, dict) else None
    return prov if isinstance(prov, dict) else None


def _local_keys(folder: str) -> list[str]:
    out = []
    for root, _dirs, files in os.walk(folder):
        for f in files:
            out.append(os.path.relpath(os.path.join(root, f), folder).replace(os.sep, "/"))
    return out


def _with_foreign(what: str, keys: list[str]) -> str:
    shown = ", ".join(sorted(keys)[:3]) + (", ..." if len(keys) > 3 else "")
    return f"{what} holding {len(keys)} file{'s' if len(keys) != 1 else ''} blocklin did not write ({shown})"


def _read_local(folder: str) -> Any:
    def read(key: str) -> bytes | None:
        try:
            with open(os.path.join(folder, key), "rb") as f:
                return f.read()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
    return read


def _refuse(name: str, rule: str, loc: Location, what: str, *, folder: bool) -> OutputExistsError:
    return OutputExistsError(explain(name, rule, f"{loc.url!r}, {what}",
                                     f"remove it by hand if it may go ({removal_command(loc, folder=folder)}) and "
                                     "rerun, or choose another path"))


_ZARR_RULE = ("overwrite replaces only a zarr output blocklin wrote (blocklin provenance in its attributes) "
              "or an empty folder")


def check_replaceable(out: Any, kind: str = "zarr", name: str = "out") -> None:
    """Refuse, with the command that removes it by hand, an existing local ``out`` that ``overwrite``
    may not replace (see the module docstring); nothing happens when ``out`` does not exist."""
    loc = as_location(out) if not isinstance(out, Location) else out
    path = loc.url
    if not os.path.lexists(path):
        return
    real = os.path.realpath(path)
    isdir, isfile = os.path.isdir(real), os.path.isfile(real)
    if kind == "zarr":
        if os.path.islink(path):  # the commit renames onto the link: it had gone, its target left stale
            raise _refuse(name, _ZARR_RULE, loc, "a symbolic link (the commit would replace the link, not its "
                          f"target {real})", folder=False)
        if isdir:
            entries = sorted(os.listdir(real))
            if not entries:
                return
            prov = zarr_provenance(_read_local(real))
            if prov == "blocklin":
                extra = foreign_keys(_local_keys(real), recorded_members(_read_local(real)))
                if not extra:
                    return
                raise _refuse(name, _ZARR_RULE, loc, _with_foreign("a blocklin output", extra), folder=True)
            what = ("a zarr store blocklin did not write (no blocklin provenance in its attributes)" if prov == "zarr"
                    else f"a folder holding {len(entries)} entr{'y' if len(entries) == 1 else 'ies'} "
                         f"({', '.join(entries[:3])}{', ...' if len(entries) > 3 else ''}), not a zarr store")
            raise _refuse(name, _ZARR_RULE, loc, what, folder=True)
        raise _refuse(name, _ZARR_RULE, loc, "a file, where a zarr folder would go" if isfile else
                      "not a folder", folder=False)
    label = _LABEL[kind]
    rule = (_HDF5_RULE if kind == "hdf5" else _FILE_RULE).format(label=label, record=_record_name(path))
    if isdir:
        raise _refuse(name, rule, loc, "a folder, where a file would go", folder=True)
    if not isfile:
        raise _refuse(name, rule, loc, "not a regular file", folder=False)
    if not is_format(real, kind):
        raise _refuse(name, rule, loc, _NOT_FORMAT[kind], folder=False)
    if os.path.isfile(path) and not os.path.islink(path) and os.path.getsize(path) == 0:
        return  # nothing to lose
    rec = file_records.read(path)
    if file_records.matches(path, rec) and (kind not in _RECORDED_KINDS or rec.get("format") == kind):
        return
    what = _why_not_ours(path, label, rec) if not file_records.matches(path, rec) else \
        f"a file blocklin wrote as {rec.get('format')}, not as a {label}"
    if kind == "hdf5":
        stem = os.path.splitext(path)[0]
        raise OutputExistsError(explain(name, rule, f"{loc.url!r}, {what}",
                                        f"write the dataset to a new file (blocklin convert IN {stem}-new.h5:/NAME), "
                                        f"then copy it into this one with h5py or h5copy (h5copy -i {stem}-new.h5 "
                                        f"-o {path} -s /NAME -d /NAME)"))
    raise _refuse(name, rule, loc, what, folder=False)


_LABEL = {"npy": ".npy", "npz": ".npz", "mtx": "Matrix Market", "csv": "text", "tsv": "text", "raw": "raw binary",
          "hdf5": "HDF5", "plot": "plot"}
#: Kinds with no signature of their own to read (a plot is any image format matplotlib writes): only a
#: record of that kind makes the file one overwrite may replace (a .png exported as raw binary is not a plot).
_RECORDED_KINDS = frozenset({"plot"})
_FILE_RULE = ("overwrite replaces only a {label} file blocklin wrote and nobody changed since (its record {record} "
              "matches it) or an empty file")
_HDF5_RULE = ("an HDF5 output goes into a new file, or into an HDF5 file blocklin created and nobody changed "
              "since (its record {record} matches it); other programs' HDF5 files are never modified")


def _record_name(path: str) -> str:
    return os.path.basename(file_records.record_path(path))


def _why_not_ours(path: str, label: str, rec: dict | None) -> str:
    """Why the existing file at ``path`` is not one blocklin may replace or modify (its record is missing
    or no longer matches), in words."""
    if os.path.islink(path):
        return "a symbolic link (blocklin writes regular files)"
    shown = _record_name(path)
    if rec is None:
        return f"{'an' if label == 'HDF5' else 'a'} {label} file blocklin did not write (no record {shown} beside it)"
    writing = rec.get("writing")
    if isinstance(writing, dict):
        return (f"a file blocklin was writing {writing.get('dataset')} into in place (pid {writing.get('pid')} on "
                f"{writing.get('host')}; interrupted, or still running): it changed since its record {shown}, and "
                "blocklin cannot tell by whom")
    return (f"a file blocklin wrote that changed since (its size, times or inode differ from its record {shown}: "
            "another program wrote it, or replaced it)")


_NOT_FORMAT = {"npy": "a file that is not a .npy file (no NumPy magic)",
               "npz": "a file that is not a .npz file (no zip signature)",
               "mtx": "a file that is not a Matrix Market file (no %%MatrixMarket header)",
               "csv": "a file that is not text (it holds NUL bytes)", "tsv": "a file that is not text (it holds NUL bytes)",
               "hdf5": "a file that is not an HDF5 file (no HDF5 signature)"}


def is_format(path: str, kind: str) -> bool:
    """Whether the regular file ``path`` is a file of ``kind`` (an empty file is any kind: nothing to lose)."""
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    if not head or kind in ("raw", "plot"):  # a plot's format is told by its record (_RECORDED_KINDS)
        return True
    if kind == "npy":
        return head.startswith(b"\x93NUMPY")
    if kind == "npz":
        return head.startswith((b"PK\x03\x04", b"PK\x05\x06"))
    if kind == "mtx":
        return head[:14].lower() == b"%%matrixmarket"
    if kind in ("csv", "tsv"):
        return b"\0" not in head
    if kind == "hdf5":
        return is_hdf5(path)
    return False


def is_hdf5(path: str) -> bool:
    """An HDF5 signature at offset 0 or a user-block offset (512, 1024, 2048, ...)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        offset = 0
        while offset + 8 <= size:
            f.seek(offset)
            if f.read(8) == _HDF5_SIGNATURE:
                return True
            offset = 512 if offset == 0 else offset * 2
    return False


def check_replaceable_prefix(be: Any, loc: Location, name: str = "out") -> None:
    """The object-store form of :func:`check_replaceable` for the zarr output at ``loc`` (backend
    ``be``), whose prefix holds objects and no pending record: only blocklin's own output may go."""
    prov = zarr_provenance(be.try_read)
    if prov == "blocklin":
        extra = foreign_keys(be.keys(""), recorded_members(be.try_read))
        if not extra:
            return
        raise _refuse(name, _ZARR_RULE, loc, _with_foreign("a blocklin output", extra), folder=True)
    what = ("a zarr store blocklin did not write (no blocklin provenance in its attributes)" if prov == "zarr"
            else "which holds other objects, not a zarr store")
    raise _refuse(name, _ZARR_RULE, loc, what, folder=True)


def complete_output_refusal(loc: Location, read: Any = None, name: str = "out") -> OutputExistsError | None:
    """The refusal of ``resume=True`` on an output that is already complete: a committed blocklin
    output at ``loc`` (``read(key)`` returns bytes or None; default: the local folder's), named with what its provenance says made
    it; None when ``loc`` holds anything else (the ordinary refusals then apply).

    Its record keeps no identity of the run (token) nor a stamp of every input, so it cannot be
    returned as the resumed run's result: the user opens it, or recomputes it with ``overwrite``."""
    read = read or _read_local(loc.url)
    if zarr_provenance(read) != "blocklin":
        return None
    try:
        prov = json.loads(read("zarr.json") or b"{}").get("attributes", {}).get("blocklin", {})
    except (ValueError, AttributeError):
        prov = {}
    made = f"the complete result of {prov.get('operation', 'a blocklin operation')}"
    if prov.get("created"):
        made += f" written {prov['created']}"
    shown = loc.url
    return OutputExistsError(explain(
        name, "resume continues an unfinished run, and this output is complete (no unfinished run of it is left)",
        f"{loc.url!r}, {made}",
        f"open it (blocklin.open({shown!r}); `blocklin info {shlex.quote(shown)}` says whether it is current "
        "with its inputs), or pass overwrite=True (CLI: --overwrite) to compute it again"))


#: The name of a local partial output: ``.OUT.partial-`` and the run's token (16 hex digits), with the letter a
#: run with a second output adds for it (``qr``'s ``Q``: ``token + "q"``).
PARTIAL_TOKEN = re.compile(r"\.partial-[0-9a-f]{16}[a-z]?$")


def blocklin_partial(path: str) -> bool:
    """Whether the local folder ``path``, named like a partial output, is one a blocklin run made: it
    holds an owner record, or its name ends in blocklin's token and it holds a zarr store or nothing
    but blocklin's records (a run killed before its record was written). A user's folder such as
    ``.data.zarr.partial-notes`` is neither: no run removes, resumes or writes into it."""
    from blocklin.storage.ownership import read_record

    if os.path.islink(path) or not os.path.isdir(path):
        return False
    if read_record(Location(path)) is not None:
        return True
    if not PARTIAL_TOKEN.search(os.path.basename(path.rstrip("/"))):
        return False
    return any(os.path.exists(os.path.join(path, m)) for m in ("zarr.json", ".zarray")) or \
        not foreign_keys(_local_keys(path))


def partial_folders(loc: Location, *, foreign: bool = False) -> list[str]:
    """The names of the partial folders that runs to the local output ``loc`` left beside it (with
    ``foreign``: the folders named like them that are not blocklin's, :func:`blocklin_partial`)."""
    parent, prefix = os.path.dirname(loc.url) or ".", f".{loc.name}.partial-"
    if not os.path.isdir(parent):
        return []
    return sorted(f for f in os.listdir(parent)
                  if f.startswith(prefix) and blocklin_partial(os.path.join(parent, f)) != foreign)


#: fsspec protocols that read archives or the web: nothing blocklin writes can go there (a ``zip://``
#: URL names a member of a local archive, which the comparisons with inputs do not see through).
READ_ONLY_SCHEMES = frozenset({"zip", "tar", "libarchive", "http", "https", "github", "git", "reference"})


def check_writable_scheme(loc: Location, name: str = "out") -> None:
    """Refuse an output on a read-only fsspec protocol, naming it (zarr's own error named none)."""
    if loc.scheme in READ_ONLY_SCHEMES or "::" in loc.url:
        raise ParameterError(explain(name, "must be a local path or a URL of writable storage (s3://, gs://, "
                                     "abfs://, memory://, file://)", f"{loc.url!r} ({loc.scheme}:// is read-only, or a "
                                     "chained URL)", "write a local .zarr or an object-store URL, and archive it "
                                     "afterwards if an archive is wanted"))


def check_output(out: Any, inputs: Iterable[Any] = (), *, overwrite: bool = False, name: str = "out",
                 kind: str = "zarr", temp_dir: Any = None, resume: bool = False) -> Location:
    """Check an output before anything is claimed; returns its location.

    Parameters
    ----------
    out : path, URL or Location
        The output (for HDF5, the file).
    inputs : iterable
        The operation's inputs (paths, URLs, Locations; ``file.h5:/dataset`` members; None skipped).
    overwrite : bool
        Whether an existing output may be replaced (only what the module docstring lists may be).
    name : str
        The parameter named in errors.
    kind : {"zarr", "npy", "npz", "mtx", "csv", "tsv", "raw", "hdf5", "plot"}
        What is written: a zarr store (a folder or prefix) or a file of that format (``"plot"``: the
        CLI's ``--plot`` image).
    temp_dir : path, URL or Location, optional
        The temp dir of the job, which ``out`` may not be nor hold.
    resume : bool
        The run asks to continue an unfinished one: a complete zarr output with no partial beside it
        is refused as complete (:func:`complete_output_refusal`).

    Raises
    ------
    OutputIsInputError
        ``out`` is, is inside, or holds an input.
    TempDirError
        ``out`` is or holds the temp dir, or the temp dir is an input or inside one.
    OutputExistsError
        ``out`` exists without ``overwrite``, or is something ``overwrite`` may not replace, or its
        parent folder is missing. Object-store prefixes are checked by the commit protocol when the
        job starts (:func:`check_replaceable_prefix`).
    """
    inputs = [i for i in inputs if i is not None]
    check_not_input(out, inputs, name)
    check_temp_dir(out, inputs, temp_dir, name)
    loc = as_location(out, name=name) if not isinstance(out, Location) else out
    check_writable_scheme(loc, name)
    if not loc.is_local:
        return loc
    path = loc.url
    if os.path.lexists(path):
        if not overwrite and kind != "hdf5":
            # (the partial of an interrupted overwriting run continues with overwrite=True: the refusal below)
            complete = complete_output_refusal(loc, name=name) if resume and kind == "zarr" and \
                os.path.isdir(path) and not partial_folders(loc) else None
            if complete is not None:
                raise complete
            raise OutputExistsError(explain(name, "must not exist unless overwriting is asked for",
                                            f"{_shown(out)!r} exists",
                                            "pass overwrite=True (CLI: --overwrite) or choose another path"))
        check_replaceable(loc, kind, name)
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise OutputExistsError(explain(name, "must be in an existing folder", f"parent {parent!r} is missing",
                                        f"create it first: mkdir -p {shlex.quote(parent)}"))
    return loc


__all__ = ["FILE_KINDS", "MEMBERS_KEY", "PARTIAL_TOKEN", "READ_ONLY_SCHEMES", "blocklin_partial", "check_writable_scheme", "check_not_input", "check_not_output", "foreign_keys", "check_output", "check_replaceable", "check_replaceable_prefix",
           "check_temp_dir", "is_format", "is_hdf5", "output_members", "recorded_members", "relation", "removal_command", "same_file", "zarr_provenance"]
