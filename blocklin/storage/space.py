"""Up-front checks that a store about to be written fits, and can be written, where it goes.

A job that would fill the disk fails hours in, leaving a partial output or a temp folder that
fills ``/tmp`` for everyone; a matrix whose metadata declares 10^6 x 10^6 makes an 8 TB output.
Every zarr array blocklin creates (outputs, scratch stores, staged operands) and every converted
file is checked here first against the free space of the file system it lands on, with the
figure, the path and the setting that moves it. Only local destinations are checked: object
stores report no free space.
"""

from __future__ import annotations

import os
import re
import shutil
from typing import Any

from blocklin.errors import DiskSpaceError, explain


_PARTIAL = re.compile(r"^\.(.+)\.partial-[0-9a-zA-Z]+$")


def _existing_folder(path: str) -> str:
    """The nearest folder at or above ``path`` that exists (where the new files will land)."""
    folder = os.path.abspath(path)
    while not os.path.isdir(folder):
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    return folder


def _final_name(path: str) -> str:
    """The path a user named: ``DIR/.NAME.partial-TOKEN`` (an output being written) is ``DIR/NAME``."""
    head, tail = os.path.split(path.rstrip(os.sep))
    match = _PARTIAL.match(tail)
    return os.path.join(head, match.group(1)) if match else path


def _under_temp_dir(path: str) -> bool:
    from blocklin.config import get_config

    temp = get_config().temp_dir
    if not isinstance(temp, str) or "://" in temp:
        return False
    root = os.path.realpath(temp).rstrip(os.sep) + os.sep
    real = os.path.realpath(path)
    # blocklin's work folders there (blocklin-OPERATION-TOKEN), not any file a user keeps under /tmp
    return real.startswith(root) and real[len(root):].startswith("blocklin-")


def _fix(path: str, folder: str) -> str:
    if _under_temp_dir(path):
        return (f"free space in {folder}, or point the temp dir at a larger disk (--temp-dir DIR, or "
                "BLOCKLIN_TEMP_DIR=DIR)")
    return f"free space in {folder}, or write the output to a larger disk (another -o/out= path)"


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
    if getattr(path, "is_local", True) is False:
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
    if not os.access(folder, os.W_OK | os.X_OK):
        raise DiskSpaceError(explain(what, "its folder must be writable", f"{folder} (for {local}), which this "
                                     "user cannot write", _fix(local, folder).replace("free space in", "make writable")))
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


__all__ = ["check_space"]
