"""Up-front checks that a store about to be written fits, and can be written, where it goes.

A job that would fill the disk fails hours in, leaving a partial output or a temp folder that
fills ``/tmp`` for everyone; a matrix whose metadata declares 10^6 x 10^6 makes an 8 TB output.
Every zarr array blocklin creates (outputs, scratch stores, staged operands) and every converted
file is checked here first against the free space of the file system it lands on, with the
figure, the path and the setting that moves it. Only local destinations are checked: object
stores report no free space.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
from collections.abc import Iterator
from typing import Any, NoReturn

from blocklin.errors import DiskSpaceError, TempDirError, explain


_PARTIAL = re.compile(r"^\.(.+)\.partial-[0-9a-zA-Z]+$")


def _climb(path: str, found: Any) -> str:
    """The nearest folder at or above ``path`` for which ``found`` holds (the root where none does)."""
    folder = os.path.abspath(path)
    while not found(folder):
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    return folder


def _existing_folder(path: str) -> str:
    """The nearest folder at or above ``path`` that exists (where the new files will land)."""
    return _climb(path, os.path.isdir)


def _mount_point(folder: str) -> str:
    """The mount point of the file system holding the existing ``folder``."""
    return _climb(folder, os.path.ismount)


def _final_name(path: str) -> str:
    """The path a user named: ``DIR/.NAME.partial-TOKEN`` (an output being written) is ``DIR/NAME``."""
    head, tail = os.path.split(path.rstrip(os.sep))
    match = _PARTIAL.match(tail)
    return os.path.join(head, match.group(1)) if match else path


def _unwritable(folder: str) -> str:
    """Why ``folder`` cannot take new files ("" when it can); root passes ``os.access`` on a
    read-only file system, so that is asked of the file system itself."""
    if os.path.exists(folder) and not os.path.isdir(folder):
        return "a file, not a folder"
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return "a read-only file system"
    except OSError:  # pragma: no cover - no statvfs: the write itself will say
        pass
    if not os.access(folder, os.W_OK | os.X_OK):
        return "this user may not write there"
    return ""


def _under_temp_dir(path: str) -> bool:
    from blocklin.config import get_config

    temp = get_config().temp_dir
    if not isinstance(temp, str) or "://" in temp:
        return False
    root = os.path.realpath(temp).rstrip(os.sep) + os.sep
    real = os.path.realpath(path)
    # blocklin's work folders there (blocklin-OPERATION-TOKEN, or the partial folder of a temporary result being
    # written, .blocklin-OPERATION-TOKEN.zarr.partial-TOKEN), not any file a user keeps under /tmp
    first = real[len(root):].split(os.sep, 1)[0]
    match = _PARTIAL.match(first)
    return real.startswith(root) and (match.group(1) if match else first).startswith("blocklin-")


def _fix(path: str, folder: str, need: str = "free space in {folder}", where: str = "a larger disk") -> str:
    first = need.format(folder=folder)
    if _under_temp_dir(path):
        return f"{first}, or point the temp dir at {where} (--temp-dir DIR, or BLOCKLIN_TEMP_DIR=DIR)"
    return f"{first}, or write the output to {where} (another -o/out= path)"


def check_writable(path: Any, what: str = "out") -> None:
    """Refuse a local destination whose nearest existing folder cannot be written (read-only file
    system, permissions, a file where a folder should be)."""
    check_space(path, 0, what)


def check_space(path: Any, nbytes: int, what: str, detail: str = "") -> None:
    """Refuse to write ``nbytes`` to ``path`` unless its file system has them free and the folder is writable.

    Parameters
    ----------
    path : str, path-like or Location
        The store or file about to be written (it need not exist yet).
    nbytes : int
        Bytes it will hold at most (uncompressed).
    what : str
        What it is, for the message (``"out"``, ``"scratch store"``).
    detail : str
        How the figure comes about (``"1000000 x 1000000 float64"``).

    Raises
    ------
    DiskSpaceError
        Too little free space, or the folder cannot be written.
    """
    if path is None or getattr(path, "is_local", True) is False:
        return
    local = getattr(path, "url", path)
    local = os.fspath(local)
    if "://" in local and not local.startswith("file://"):
        return
    if local.startswith("file://"):
        local = local[len("file://"):]
    if _PARTIAL.match(os.path.basename(local.rstrip(os.sep))):
        what = "out"
    elif _under_temp_dir(local):
        what = f"{what} in the temp dir"
    local = _final_name(local)
    folder = _existing_folder(os.path.dirname(os.path.abspath(local)))
    problem = _unwritable(folder)
    if problem:
        raise DiskSpaceError(explain(what, "its folder must be writable", f"{folder} (for {local}): {problem}",
                                     _fix(local, folder, "make {folder} writable", "a writable folder")))
    try:
        free = shutil.disk_usage(folder).free
    except OSError:  # pragma: no cover - a file system that reports nothing is not refused
        return
    if nbytes > free:
        from blocklin.config import format_size

        how = f" ({detail}, uncompressed)" if detail else ""
        raise DiskSpaceError(explain(what, "must fit the free space of its destination",
                                     f"{format_size(nbytes)}{how} for {local}, where {folder} has "
                                     f"{format_size(free)} free", _fix(local, folder)))


@contextlib.contextmanager
def writing(arr: Any) -> Iterator[None]:
    """Run a write to the zarr array ``arr``; an ``OSError`` that names no file (a full disk seen by
    ``write()``) is raised again naming the array's folder, so that its message can say where."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None or exc.errno is None:
            raise
        from blocklin.storage.location import store_location

        try:
            loc = store_location(arr.store)
        except Exception:  # noqa: BLE001 - no location: the error stays as it was
            loc = None
        if loc is None or not loc.is_local:
            raise
        raise OSError(exc.errno, exc.strerror, loc.url) from exc


def naming(exc: BaseException, path: str | None) -> BaseException:
    """``exc`` with ``path`` as its file name when it is an ``OSError`` of a write that names no file
    (``write()``/``pwrite()`` on a full disk names none), so that :func:`describe_os_error` can say
    where and what to do; any other exception as it is."""
    if not isinstance(exc, OSError) or exc.filename is not None or exc.errno is None or not path:
        return exc
    named = OSError(exc.errno, exc.strerror, os.path.abspath(path))
    named.__cause__ = exc
    return named


def raise_naming(exc: BaseException, path: str | None) -> NoReturn:
    """Raise ``exc``, or the :func:`naming` copy of it that names ``path`` (from ``exc``): in the ``except``
    of a write whose ``OSError`` may name no file (a full disk's)."""
    named = naming(exc, path)
    if named is exc:
        raise exc
    raise named from exc


@contextlib.contextmanager
def named_as_output(output: Any, what: str) -> Iterator[None]:
    """Run an operation's writes into its partial output ``output`` (a :class:`~blocklin.storage.location.Location`
    or path): a full disk (ENOSPC, EDQUOT) met writing anywhere in it (the operation's internal work store kept
    there, ``what``, or a chunk of the result) is raised again naming ``output`` itself, the one path the user
    named and can act on (free space there, or write elsewhere: :func:`describe_os_error`), the internal file kept
    as its cause. Other errors pass as they are."""
    try:
        yield
    except OSError as exc:
        root = _local(output)
        name = os.fspath(exc.filename) if exc.filename is not None else None
        if root is None or name is None or exc.errno not in (errno.ENOSPC, errno.EDQUOT) \
                or not os.path.abspath(name).startswith(root + os.sep):
            raise
        shown = _final_name(root)
        raise OSError(exc.errno, f"{exc.strerror} (writing {what} inside {shown}, which needs the room until the "
                                 "result is committed)", root) from exc


def _local(path: Any) -> str | None:
    """``path`` (a path or Location) as an absolute local path, or None for an object store."""
    if path is None or getattr(path, "is_local", True) is False:
        return None
    local = os.fspath(getattr(path, "url", path))
    if "://" in local and not local.startswith("file://"):
        return None
    return os.path.abspath(local[len("file://"):] if local.startswith("file://") else local)


def make_temp_folder(path: str) -> None:
    """Create a work folder under the temp dir; an unusable temp dir is a :class:`TempDirError`
    naming the folder, the setting and the fix."""
    try:
        os.makedirs(path)
    except OSError as exc:
        from blocklin.config import get_config

        root = get_config().temp_dir
        raise TempDirError(explain("temp_dir", "must be a writable folder for the job's intermediates",
                                   f"{root!r}: cannot create {path} ({_ERRNO_WORDS.get(exc.errno or 0, exc.strerror)})",
                                   "point BLOCKLIN_TEMP_DIR (or --temp-dir, temp_dir=) at a writable folder with "
                                   "room, e.g. --temp-dir /var/tmp")) from None


_ERRNO_WORDS = {errno.ENOSPC: "no space left", errno.EDQUOT: "disk quota exceeded",
                errno.EROFS: "a read-only file system", errno.EACCES: "permission denied",
                errno.EPERM: "operation not permitted", errno.ENOTDIR: "a file where a folder should be",
                errno.ENOENT: "no such file or folder"}


def describe_os_error(exc: OSError) -> str | None:
    """A one-line message with the path, the setting and a fix for a raw ``OSError`` of a write
    (full disk, read-only folder, unusable temp dir); None when ``exc`` is not one of those."""
    words = _ERRNO_WORDS.get(exc.errno or 0)
    path = exc.filename
    if words is None or not path:
        return None
    path = os.fspath(path)
    folder = _existing_folder(os.path.dirname(os.path.abspath(path)))
    parts = os.path.abspath(path).split(os.sep)
    in_place = not _under_temp_dir(path) and not any(_PARTIAL.match(p) for p in parts)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT) and in_place:
        # a write into a stored matrix itself (an append): there is no other -o path to suggest
        fix = f"free space on the file system mounted at {_mount_point(folder)}, then run the command again"
    elif exc.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = _fix(path, folder)
    elif exc.errno == errno.ENOENT:
        fix = _fix(path, folder, "create {folder}'s missing subfolders or check the path", "an existing folder")
    else:
        fix = _fix(path, folder, "make {folder} writable", "a writable folder")
    what = "temp dir" if _under_temp_dir(path) else "out" if any(_PARTIAL.match(p) for p in parts) else "path"
    shown = os.sep.join(_final_name(p) if _PARTIAL.match(p) else p for p in path.split(os.sep))
    return explain(what, "must be writable with room for the job's data", f"{shown}: {words} "
                   f"({type(exc).__name__} errno {exc.errno})", fix)


__all__ = ["check_space", "check_writable", "describe_os_error", "make_temp_folder", "named_as_output", "naming",
           "raise_naming"]


def folder_size(path: str) -> int:
    """Bytes of the files under a local folder (0 when it is gone)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total
