"""Inputs that must hold one version from a run's first read to its end (its commit, or its value's return).

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

A run that returns its value in memory (``norm``, ``cond``, ``slogdet``, an SVD or solve without
``out=``) commits nothing, so the run itself is guarded: :func:`run_inputs` opens the scope of one run
(the outermost :class:`~blocklin.runtime.job.Job`, or a conversion), whose :class:`RunInputs` stamps
each stored input when the run opens it, before its first read, and checks them all before the
value is returned. Outputs claimed inside the scope take those stamps rather than listing the
inputs again at the claim (:func:`stamps_for`), so reads a run makes before it claims its output (a
text file's shape scan, a staged copy of an input, a first pass of peaks) are covered too; an input
a commit has checked is not listed again at the end unless the run read on after the commit.

The stamps see what the file system records (sizes, times in ns, inodes; ETags on object stores),
with the limits :mod:`blocklin.storage.stamps` names; a change undone before the commit is not seen
(what the run read in between is).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterable, Iterator

from blocklin.errors import InputChangedError, ParameterError, explain
from blocklin.storage import stamps, versions
from blocklin.storage.location import Location


def coverage(inputs: Iterable[Location], record: list[dict]) -> list[dict]:
    """The version of each zarr input the run reads (:func:`blocklin.storage.versions.coverage`, from
    the listing in ``record``, or the version the record says it took with its listing): what
    :func:`check_unchanged` lets appends grow."""
    out = []
    for loc in inputs:
        c = covered_by(loc, record)
        if c is not None:
            out.append(c)
    return out


def covered_by(loc: Location, record: list[dict]) -> dict | None:
    """The version of the zarr input ``loc`` its stamp in ``record`` lists (None: not a zarr array). A
    stamp a run took at its first open carries the version read with it (its ``covers``): today's
    metadata, read later, could hold rows appended since."""
    stamp = next((r for r in record if r["url"] == loc.url), None)
    if stamp is not None and "covers" in stamp:
        return stamp["covers"]
    try:
        return versions.coverage(loc, entries=stamp.get("entries") if stamp else None)
    except (OSError, ValueError, TypeError, KeyError):  # not a zarr array
        return None


class RunInputs:
    """The stored inputs of one run: each stamped when the run first opens it, before it reads it,
    and checked (:func:`check_unchanged`) before the run's value is returned (see module docstring).

    Attributes
    ----------
    record : dict
        ``{url: stamp}`` of every input stamped so far (:func:`blocklin.storage.stamps.stamp_inputs`,
        with the version read with it under ``covers``).
    """

    def __init__(self) -> None:
        self.record: dict[str, dict] = {}
        self._locations: dict[str, Location] = {}
        self._checked: set[str] = set()  # checked by a commit, not read since
        self._listed: dict[str, str] = {}  # ... and the stamp that check took of each
        self._written: list[str] = []  # the run's outputs (partial and final), which it rewrites itself

    def stamp(self, loc: Location, taken: dict | None = None, *, own_open: bool = False) -> None:
        """Stamp ``loc`` unless the run already did (one listing, at its first open), or wrote it (an
        output of this run read back, by a later step of it). ``taken``: the stamp a handle took when it
        opened ``loc`` (:func:`opened`), before it read anything of it (a stored sparse matrix's
        attributes and row blocks, an operator's operand): the run's, so the reads the handle made
        before the run are covered too. A :class:`HandleStamp` is checked first (one listing: a change
        since the open is refused as that), unless ``own_open``: the operation running opened the
        handle itself, for this run (a path it was passed), so its open is part of the run."""
        self._checked.discard(loc.url)
        if loc.url in self.record or loc.pending or self._wrote(loc.url):
            return
        rec = taken if taken is not None and taken.get("url") == loc.url else stamps.stamp_inputs([loc])[0]
        if rec is taken and isinstance(taken, HandleStamp) and not own_open:
            rec = _check_handle(taken, loc)
        self.record[loc.url] = rec if "covers" in rec else _with_covers(loc, rec)
        self._locations[loc.url] = loc

    def stamps_for(self, inputs: Iterable[Location]) -> list[dict]:
        """Each input's stamp: the run's, taken at its first open, else one taken now."""
        inputs = list(inputs)
        new = {i.url: i for i in inputs if i.url not in self.record}  # A @ A: A listed once
        fresh = dict(zip(new, stamps.stamp_inputs(list(new.values()))))
        return [self.record.get(i.url) or fresh[i.url] for i in inputs]

    def writes(self, *locs: Location) -> None:
        """The run writes ``locs`` (an output's partial and final location): never stamped as inputs, and
        no longer checked at the end where the run read them before (an output it replaces, whose own
        commit checks it: ``reads_output``)."""
        self._written.extend(loc.url for loc in locs)
        for url in [u for u in self.record if self._wrote(u)]:
            del self.record[url], self._locations[url]

    def _wrote(self, url: str) -> bool:
        return any(url == w or url.startswith(w + "/") for w in self._written)

    def checked(self, record: list[dict], today: Iterable[dict] = ()) -> None:
        """A commit found the inputs of ``record`` unchanged (``today``: its listing of them): not listed
        again at the end (:meth:`check`) unless the run reads on (:meth:`reading`)."""
        mine = {r["url"] for r in record if self.record.get(r["url"]) is r}
        self._checked.update(mine)
        self._listed.update((t["url"], t["digest"]) for t in today if t["url"] in mine)

    def reading(self) -> None:
        """The run reads its inputs again (a pass): every input is checked at the end."""
        self._checked.clear()
        self._listed.clear()

    def digest(self, url: str) -> str | None:
        """The content stamp (:func:`blocklin.storage.stamps.content_stamp`) the run took of the input
        at ``url`` when it first opened it, before any read; None where it took none."""
        rec = self.record.get(url)
        return rec["digest"] if rec is not None else None

    def check(self, result: str) -> dict[str, str]:
        """Refuse to return ``result`` when an input changed since the run opened it (rows appended
        aside): :class:`~blocklin.errors.InputChangedError`. One listing of each input not checked
        by a commit since the run last read it. Returns each input's content stamp taken after the
        run's last read (``{url: digest}``): this listing's, or the commit's that checked it."""
        urls = [u for u in self.record if u not in self._checked]
        recorded = [self.record[u] for u in urls]
        today = check_unchanged(recorded, [self._locations[u] for u in urls], result,
                                covers=[r["covers"] for r in recorded if "covers" in r], returned=True)
        return {**{u: self._listed[u] for u in self._checked if u in self._listed},
                **{t["url"]: t["digest"] for t in today}}


_RUN: contextvars.ContextVar[RunInputs | None] = contextvars.ContextVar("blocklin_run_inputs", default=None)


@contextlib.contextmanager
def run_inputs() -> Iterator[tuple[RunInputs, bool]]:
    """The scope of one run's inputs: ``(inputs, outermost)``. Inside a run already open (an operation
    that runs others: solve's products, an SVD's passes), that run's, so that each input is stamped
    once, at the first open of the whole run, and checked by its outermost caller."""
    outer = _RUN.get()
    if outer is not None:
        yield outer, False
        return
    scope = RunInputs()
    token = _RUN.set(scope)
    try:
        yield scope, True
    finally:
        with contextlib.suppress(ValueError):  # left in another context than it was entered
            _RUN.reset(token)


@contextlib.contextmanager
def run_reading(loc: Location, taken: dict | None, result: str, *, own_open: bool = False) -> Iterator[RunInputs]:
    """A run that reads the stored input ``loc`` outside any job (a stored sparse matrix's ``norm``, an
    operator's product): ``loc`` stamped first (``taken``: its handle's, :func:`opened`; ``own_open``:
    the handle opened by this operation, :meth:`RunInputs.stamp`), checked before ``result`` is
    returned unless the run is part of an outer one, whose end checks it."""
    with run_inputs() as (inputs, outermost):
        inputs.stamp(loc, taken, own_open=own_open)
        yield inputs
        if outermost:
            inputs.check(result)


def _with_covers(loc: Location, rec: dict) -> dict:
    """The stamp ``rec`` of ``loc`` with the version its listing holds (``covers``): rows appended later pass."""
    c = covered_by(loc, [rec])
    return {**rec, "covers": c} if c is not None else rec


class HandleStamp(dict):
    """The stamp a handle (:class:`blocklin.SparseMatrix`) took when it opened its input (:func:`opened`).

    A run that takes it lists the input again first (:meth:`RunInputs.stamp`), so that a change since
    the open, before the run, is refused at once as that ("open it again": the handle's attributes and
    row blocks are the old version's), and a change the run's last listing finds is one made during
    the run. The one run that may take it without that listing is the run of the operation that opened
    the handle itself (a path passed to it), which says so when it stamps it (``own_open``): its open is
    part of that run. That is the caller's word, not the stamp's state, so a handle opened by a call
    that ran nothing with it (a plan explained, a refusal) is checked like any other when used later.
    """


def opened(loc: Location, *, covers: bool = False, handle: bool = False) -> dict | None:
    """The stamp of ``loc`` a handle takes when it opens it, before its first read (one listing), for the
    runs that read through the handle to take (:meth:`RunInputs.stamp`); None where it cannot be listed
    (opening it says why). ``covers``: with the version read now, for a zarr array, whose metadata read
    by a later run would hold rows appended since (a sparse group's history names the version a
    listing holds, so its handle reads no more metadata). ``handle``: a :class:`HandleStamp`."""
    try:
        rec = stamps.stamp_inputs([loc])[0]
    except OSError:
        return None
    rec = _with_covers(loc, rec) if covers else rec
    return HandleStamp(rec) if handle else rec


def _check_handle(taken: HandleStamp, loc: Location) -> dict:
    """Refuse a run through a handle whose input changed since the handle opened it, before the run
    (rows appended aside): one listing. Returns the stamp the run takes: ``taken``, with the version it
    covers where rows were appended since (found only then: a read of the group's metadata)."""
    today = stamps.stamp_inputs([loc])
    if all(t["digest"] == taken["digest"] for t in today):
        return taken
    covered = covered_by(loc, [taken])
    kept = [taken if t["digest"] != taken["digest"] and _only_appended(covered, loc) else t for t in today]
    what = stamps.changes([taken], kept, since="since its handle was opened, before this run")
    if what:
        raise InputChangedError(explain(
            "inputs", "must keep the values a handle read when it opened them (its attributes and row blocks)",
            "; ".join(what), f"nothing was read through the handle: open {loc.url} again (blocklin.open, or the "
            "call that made the handle) and rerun with the new handle"))
    return {**taken, "covers": covered} if covered is not None else taken


def stamps_for(inputs: Iterable[Location]) -> list[dict]:
    """The stamps an output claimed now records of its ``inputs``: those its run took when it opened
    them (:class:`RunInputs`), a new listing for the others."""
    scope = _RUN.get()
    return scope.stamps_for(inputs) if scope is not None else stamps.stamp_inputs(list(inputs))


def writes(*locs: Location) -> None:
    """The run writes ``locs`` (:meth:`RunInputs.writes`)."""
    scope = _RUN.get()
    if scope is not None:
        scope.writes(*locs)


def checked(record: list[dict], today: Iterable[dict] = ()) -> None:
    """A commit found the inputs of ``record`` unchanged, ``today`` its listing (:meth:`RunInputs.checked`)."""
    scope = _RUN.get()
    if scope is not None:
        scope.checked(record, today)


def _only_appended(covered: dict | None, loc: Location) -> bool:
    """``loc`` changed by appends alone since the version ``covered`` (its files differ). A sparse group
    with no rows added is not: its attributes are the matrix (``nnz``, ``row_blocks``), which the data
    stamp leaves out, so a change of them alone had passed as an append of no rows."""
    if covered is None:
        return False
    try:
        grown = versions.growth(covered, loc)
    except (ParameterError, OSError, ValueError, KeyError):
        return False
    return not (covered.get("format") == versions.SPARSE_FORMAT and grown.current)


def check_unchanged(recorded: list[dict], inputs: Iterable[Location], output: str, *,
                    covers: Iterable[dict] = (), returned: bool = False) -> list[dict]:
    """Refuse to commit ``output`` (``returned``: to return the value ``output`` names) when an input no
    longer holds what its ``recorded`` stamps (taken before the run read it) say, unless rows were
    only appended to the version in ``covers`` (see the module docstring). One more listing of each
    input; returns that listing (:func:`blocklin.storage.stamps.stamp_inputs`: ``[]`` with nothing
    recorded).

    Raises
    ------
    InputChangedError
        Naming each changed input and how many of its files differ.
    """
    if not recorded:
        return []
    inputs = list({loc.url: loc for loc in inputs}.values())  # A @ A: A listed once
    today = stamps.stamp_inputs(inputs)
    then = {r["url"]: r for r in recorded}
    covered = {c["url"]: c for c in covers}
    by_url = {loc.url: loc for loc in inputs}
    kept = [then[t["url"]] if t["url"] in then and then[t["url"]]["digest"] != t["digest"] and
            _only_appended(covered.get(t["url"]), by_url[t["url"]]) else t for t in today]
    what = stamps.changes(recorded, kept, since="during the run")
    if what:
        raise InputChangedError(explain(
            "inputs", "must keep their values from a run's first read to its end, its commit or its value's "
            "return (a result of old and new values is no version's)", "; ".join(what),
            (f"{output} was not returned" if returned else f"nothing was written to {output}") +
            "; rerun once no other program writes the input (a run with resume starts over on the new values)"))
    return today


__all__ = ["HandleStamp", "RunInputs", "check_unchanged", "checked", "coverage", "covered_by", "opened",
           "run_inputs", "run_reading", "stamps_for", "writes"]
