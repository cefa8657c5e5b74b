"""The journal of an append under way and the rules around it, shared by the dense and the sparse append.

An append (:mod:`blocklin.storage.append`, :mod:`blocklin.storage.sparse_append`) writes
``A/.blocklin-append.json`` before its first chunk and removes it after its commit: a killed process
leaves it behind, and then only the same append (the same stored rows, by their content stamp) may
finish it, or a rollback undo it. Locally appends to one matrix take turns under an advisory lock
on its folder; an object store has no locks, so there the journal's owner record refuses a second one.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any

from blocklin.errors import OutputBusyError, ParameterError, explain
from blocklin.storage import ownership
from blocklin.storage.backend import backend
from blocklin.storage.location import Location, as_location

#: The journal of an append under way (or interrupted) inside the matrix's folder or prefix.
JOURNAL = ".blocklin-append.json"


def read_journal(loc: Location) -> dict | None:
    """The journal at ``loc`` (``{}`` when it cannot be parsed), or None when there is none."""
    raw = backend(loc).try_read(JOURNAL)
    if raw is None:
        return None
    try:
        rec = json.loads(raw)
    except ValueError:
        return {}
    return rec if isinstance(rec, dict) else {}


def check_not_busy(loc: Location, rec: dict) -> None:
    """Refuse while another living process owns the journal ``rec``."""
    owner = rec.get("owner")
    if ownership.is_alive(owner) and not ownership.is_mine(owner):
        raise OutputBusyError(f"another append is writing {loc.url} ({ownership.describe(owner)}). Fix: wait for it "
                              "to finish; if it was stopped, run the same append again or roll it back "
                              f"(blocklin append --rollback {loc.url})")


def matrix_location(a: Any, storage_options: dict | None) -> Location:
    """The location of the matrix appended to (a path, URL, Location or an opened matrix)."""
    if hasattr(a, "path") and not isinstance(a, (str, Location)):  # a Matrix
        a = a.path
    elif hasattr(a, "location") and not isinstance(a, (str, Location)):  # a SparseMatrix
        a = a.location
    return as_location(a, storage_options, name="a")


@contextlib.contextmanager
def exclusive(loc: Location) -> Iterator[None]:
    """Appends to one local matrix one at a time (an advisory lock on its folder); object stores have
    no locks: there the journal's owner record refuses a second append."""
    if not loc.is_local or not os.path.isdir(loc.url):
        yield
        return
    with ownership.claim_lock(loc.url):
        yield


def interrupted_refusal(loc: Location, rec: dict, stamp: str | None) -> ParameterError:
    """The refusal of an append while another one's journal is there. Rows given in memory carry no stamp,
    so neither an interrupted append of such rows nor one of stored rows can be finished by them: the fix
    says so (it had called the same array "other rows" and asked to run that append again, which is
    refused again)."""
    held = f"{loc.url} holds an append of {rec.get('source', '?')} (rows {rec.get('from_rows')} to " \
           f"{rec.get('to_rows')}) that did not finish"
    rollback = f"blocklin append --rollback {loc.url} (blocklin.rollback_append)"
    if rec.get("source_stamp") is None:
        return ParameterError(explain(
            "a", "must not hold an interrupted append; one of rows given in memory cannot be finished (nothing "
            "identifies them afterwards)", held, f"roll it back first: {rollback}, then append the rows again"))
    if stamp is None:
        return ParameterError(explain(
            "a", "must not hold an interrupted append of stored rows, which rows given in memory cannot finish",
            held, f"run the append of that stored source again to finish it, or roll it back first: {rollback}"))
    return ParameterError(explain("a", "must not hold an interrupted append of other rows", held,
                                  f"run that append again to finish it, or roll it back first: {rollback}"))


def source_stamp(src_loc: Location | None) -> str | None:
    """The content stamp of stored rows (None in memory: an interrupted append of an array is rolled back)."""
    if src_loc is None:
        return None
    from blocklin.storage.stamps import content_stamp

    return content_stamp(src_loc)


__all__ = ["JOURNAL", "check_not_busy", "exclusive", "interrupted_refusal", "matrix_location", "read_journal",
           "source_stamp"]
