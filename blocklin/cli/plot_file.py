"""The ``--plot FILE`` of ``svd``, ``eigs`` and ``solve``: a picture blocklin writes beside its results.

A plot is an output like any other, under the storage layer's rules for a file output
(:func:`blocklin.storage.guard.check_replaceable`, kind ``"plot"``): it never replaces a file blocklin
did not write, nor follows a link onto another file (``savefig`` had overwritten an existing file, and
written through a link onto the input it pointed at, exit 0), and appears only when complete. It is
written as every file export is (:class:`blocklin.storage.formats.base.AtomicFile`): under a temporary
name in the same folder, the target checked again, renamed into place and recorded as blocklin's
(:mod:`blocklin.storage.file_records`) even when interrupted once renamed, so that ``--overwrite``
replaces a plot of an earlier run and nothing else.
"""

from __future__ import annotations

import os
from typing import Any

from blocklin.storage.formats.base import AtomicFile
from blocklin.errors import ParameterError, explain
from blocklin.storage.guard import check_output, relation

#: The record's ``format`` of a plot (the storage layer's output kind).
KIND = "plot"
#: The option named in refusals.
OPTION = "--plot"


def check_target(path: str, *, overwrite: bool, outputs: tuple[str, ...] = ()) -> None:
    """Refuse, before the run, a ``--plot`` path that holds something the plot may not replace: any
    existing entry without ``overwrite``; with it, anything but a plot blocklin wrote (its record
    matches) or an empty regular file. Also one that is, holds or lies inside the command's
    ``outputs`` (``-o x.png --plot x.png`` had written the results, then refused the plot as existing:
    exit 1 after a complete run)."""
    for out in outputs:
        where = {"same": "the same path as", "inside": "inside", "contains": "holding"}.get(
            relation(os.path.abspath(path), out if "://" in out else os.path.abspath(out)))
        if where:
            raise ParameterError(explain(OPTION, "must lie outside the command's output (the results are written "
                                         "there)", f"{path!r}, {where} the output {out!r}",
                                         f"draw it beside the output, e.g. --plot {_beside(out)}"))
    check_output(os.path.abspath(path), overwrite=overwrite, name=OPTION, kind=KIND)


def _beside(out: str) -> str:
    head, name = os.path.split(out.rstrip("/"))
    return os.path.join(head, os.path.splitext(name)[0] + "-plot.png")


def save(fig: Any, path: str, *, overwrite: bool, **kwargs: Any) -> None:
    """``fig.savefig`` to ``path`` whole: under a temporary name in its folder, the target checked again
    (a file may have appeared during the run), renamed into place and recorded. The format is the one
    ``path``'s extension names (checked while parsing)."""
    atomic = AtomicFile(os.path.abspath(path), overwrite=overwrite, kind=KIND, name=OPTION)
    try:
        fig.savefig(atomic.partial, format=os.path.splitext(path)[1][1:].lower(), **kwargs)
        atomic.commit()
    except BaseException:
        atomic.abort()
        raise


__all__ = ["KIND", "OPTION", "check_target", "save"]
