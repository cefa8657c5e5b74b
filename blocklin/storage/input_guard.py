"""Inputs that must hold one version from a run's first read to its commit.

A run reads its stored inputs tile by tile for as long as it runs. Another program that rewrites an
input meanwhile (new chunk files written with zarr, the folder replaced, a file rewritten) leaves
the run with some tiles of the old values and some of the new ones: a result of no version of the
input, which nothing downstream can tell from a right one. So every output stamps its stored inputs
when it is claimed, before the run reads them (:mod:`blocklin.storage.stamps`: one listing of each),
and its commit lists them again and refuses, committing nothing, when any differs.

Rows appended by :func:`blocklin.append` are the one change a run may meet: it reads the rows it
opened, which an append never changes (:mod:`blocklin.storage.versions`), and the result covers that
version. An input whose history leads from the version the run covers to today's by appends alone
passes; an append still in flight at the commit (its chunks written, its ``zarr.json`` not yet) does
not, and the run is refused though its result would have been right (rerun it).

The stamps see what the file system records (sizes, times in ns, inodes; ETags on object stores),
with the limits :mod:`blocklin.storage.stamps` names; a change undone before the commit is not seen
(what the run read in between is).
"""

from __future__ import annotations

from collections.abc import Iterable

from blocklin.errors import InputChangedError, ParameterError, explain
from blocklin.storage import stamps, versions
from blocklin.storage.location import Location


def coverage(inputs: Iterable[Location], record: list[dict]) -> list[dict]:
    """The version of each zarr input the run reads (:func:`blocklin.storage.versions.coverage`, from
    the listing in ``record``): what :func:`check_unchanged` lets appends grow."""
    listed = {r["url"]: r.get("entries") for r in record}
    out = []
    for loc in inputs:
        try:
            c = versions.coverage(loc, entries=listed.get(loc.url))
        except (OSError, ValueError, TypeError, KeyError):  # not a zarr array
            c = None
        if c is not None:
            out.append(c)
    return out


def _only_appended(covered: dict | None, loc: Location) -> bool:
    if covered is None:
        return False
    try:
        versions.growth(covered, loc)
    except (ParameterError, OSError, ValueError, KeyError):
        return False
    return True


def check_unchanged(recorded: list[dict], inputs: Iterable[Location], output: str, *,
                    covers: Iterable[dict] = ()) -> None:
    """Refuse to commit ``output`` when an input no longer holds what its ``recorded`` stamps (taken
    before the run read it) say, unless rows were only appended to the version in ``covers`` (see the
    module docstring). One more listing of each input.

    Raises
    ------
    InputChangedError
        Naming each changed input and how many of its files differ.
    """
    if not recorded:
        return
    inputs = list(inputs)
    today = stamps.stamp_inputs(inputs)
    then = {r["url"]: r for r in recorded}
    covered = {c["url"]: c for c in covers}
    by_url = {loc.url: loc for loc in inputs}
    kept = [then[t["url"]] if t["url"] in then and then[t["url"]]["digest"] != t["digest"] and
            _only_appended(covered.get(t["url"]), by_url[t["url"]]) else t for t in today]
    what = stamps.changes(recorded, kept, since="during the run")
    if what:
        raise InputChangedError(explain(
            "inputs", "must keep their values from a run's first read to its commit (a result of old and "
            "new values is no version's)", "; ".join(what),
            f"nothing was written to {output}; rerun once no other program writes the input (a run with "
            "resume starts over on the new values)"))


__all__ = ["check_unchanged", "coverage"]
