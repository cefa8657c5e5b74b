"""The ``--plot FILE`` of ``svd``, ``eigs`` and ``solve``: a picture blocklin writes beside its results.

A plot is an output like any other: it never replaces a file blocklin did not write, nor follows a link
onto another file (``savefig`` had overwritten an existing file, and written through a link onto the
input it pointed at, exit 0), and appears only when complete. It is drawn under a temporary name in the
same folder, renamed into place, then recorded as blocklin's (:mod:`blocklin.storage.file_records`), so
that ``--overwrite`` replaces a plot of an earlier run and nothing else.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

from blocklin.errors import OutputExistsError, explain
from blocklin.storage import file_records

#: The record's ``format`` of a plot.
KIND = "plot"


def check_target(path: str, *, overwrite: bool) -> None:
    """Refuse, before the run, a ``--plot`` path that holds something the plot may not replace: any
    existing entry without ``overwrite``; with it, anything but a plot blocklin wrote (its record
    matches) or an empty regular file."""
    if not os.path.lexists(path):
        return
    rule = "overwrite replaces only a plot blocklin wrote and nobody changed since (its record " \
           f"{os.path.basename(file_records.record_path(path))} matches it) or an empty file"
    if os.path.islink(path):
        what = "a symbolic link (blocklin writes regular files; the link's target is never written)"
    elif not os.path.isfile(path):
        what = "not a regular file"
    elif not overwrite:
        raise OutputExistsError(explain("--plot", "must not exist unless overwriting is asked for", f"{path!r} exists",
                                        "pass --overwrite (a plot blocklin wrote is replaced) or choose another path"))
    elif os.path.getsize(path) == 0:
        return
    else:
        rec = file_records.read(path)
        if file_records.matches(path, rec) and rec.get("format") == KIND:
            return
        what = "a file blocklin did not write as a plot" + (" (its record no longer matches it)" if rec else
                                                           " (no record beside it)")
    raise OutputExistsError(explain("--plot", rule, f"{path!r}, {what}",
                                    f"remove it by hand if it may go (rm {path}), or choose another path"))


def save(fig: Any, path: str, **kwargs: Any) -> None:
    """``fig.savefig`` to ``path`` whole: under a temporary name in its folder, renamed into place, then
    recorded. The format is the one ``path``'s extension names (checked while parsing)."""
    folder, name = os.path.split(os.path.abspath(path))
    fmt = os.path.splitext(name)[1][1:].lower()
    tmp = os.path.join(folder, f".{name}.partial-{uuid.uuid4().hex[:16]}")
    try:
        fig.savefig(tmp, format=fmt, **kwargs)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    file_records.write(path, KIND)


__all__ = ["KIND", "check_target", "save"]
