"""``blocklin clean [PATH...]``: remove what killed runs left (partial outputs, work folders) and the
records of file exports whose file is gone."""

from __future__ import annotations

import argparse

_EPILOG = """Looks in each PATH (one level deep), beside it (PATH's own partial outputs), or at PATH itself;
by default in the temp dir (--temp-dir, BLOCKLIN_TEMP_DIR) and the current folder. Removes a
partial output (.OUT.partial-*) or job work folder (blocklin-OP-*) only when the run that owns it
is gone: on this host its process has ended; on another host its heartbeat is older than the lease.
A live run's data is never touched. Also removes the record .NAME.blocklin of a file export whose
file NAME is gone (one blocklin wrote; a file of another kind with that name is left alone).
A PATH that has a leftover's name but that blocklin did not write is refused (exit 1) before
anything is removed; found in a folder or beside an output, such a look-alike is listed as skipped.
A PATH that does not exist, with no leftovers of an output of that name beside it, is refused (exit 1).
A PATH that is an ordinary file blocklin did not write (no .NAME.blocklin record of its export) is
never touched: clean removes the leftovers beside it (.NAME.partial-*, .NAME.old-*) and says the file
was left alone (exit 0), or, with none to remove there, refuses it (exit 1) before anything is removed.

examples:
  blocklin clean --dry-run
  blocklin clean results/C.zarr /scratch/tmp
  blocklin clean s3://bucket/out.zarr --json"""


def register(sub: argparse._SubParsersAction) -> None:
    from blocklin.cli import ui

    p = sub.add_parser("clean", help="remove partial outputs and work folders of runs that are gone, and "
                                     "orphan export records",
                       description="Find the partial outputs and work folders that interrupted or killed runs "
                                   "left behind and remove those whose owner is gone, and the records of file "
                                   "exports whose file is gone, saying what was removed and its size.",
                       epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", metavar="PATH", nargs="*", help="folder, output path or URL to look in "
                                                            "(default: the temp dir and the current folder)")
    p.add_argument("--dry-run", action="store_true", help="only say what would be removed")
    ui.add_common(p, memory=False, device=False, scheduler=False, output=False)
    p.set_defaults(func=run)


def _missing(paths: list) -> list[str]:
    """The local paths named that do not exist."""
    import os

    from blocklin.storage.location import as_location

    out = []
    for p in paths:
        loc = as_location(p, name="path")
        if loc.is_local and not os.path.lexists(os.path.abspath(os.path.expanduser(loc.url))):
            out.append(str(p))
    return out


def run(args: argparse.Namespace) -> dict:
    from blocklin.cli import ui
    from blocklin.config import format_size
    from blocklin.errors import ParameterError, explain
    from blocklin.storage.cleanup import clean, find_leftovers, foreign_named, unowned_files

    foreign = foreign_named(args.paths)  # before anything is removed: a refusal does nothing
    if foreign:
        raise ParameterError(explain(
            "path", "must name a leftover blocklin wrote (a partial output, work folder, old output or record of "
            "a run that is gone) or a folder or output path to look in: clean removes nothing blocklin did not "
            "write", "; ".join(f"{i.path} ({i.reason})" for i in foreign),
            "leave it out of the command; if it is yours and no longer needed, remove it yourself"))
    unowned = unowned_files(args.paths)
    bare = [p for p in unowned if not any(i.action == "remove" for i in find_leftovers([p], sizes=False))]
    if bare:  # before anything is removed, as above
        raise ParameterError(explain(
            "path", "must be a folder to look in, an output blocklin wrote or one of its leftovers: beside a file "
            "clean looks for the partial outputs and old versions of an output of that name (.NAME.partial-*, "
            ".NAME.old-*, their work folders) and removes nothing blocklin did not write",
            "; ".join(f"{p} (a file blocklin did not write, with nothing to clean beside it; left alone)"
                      for p in bare),
            "name the folder to look in (or nothing: the temp dir and the current folder); a file of your own "
            "is yours to remove"))
    missing = [p for p in _missing(args.paths) if not any(i.action == "remove" for i in find_leftovers([p], sizes=False))]
    if missing:  # a mistyped path had said "nothing to clean", exit 0, as though it had been looked at
        raise ParameterError(explain(
            "path", "must exist, or be an output path with leftovers of a run beside it (.NAME.partial-*, "
            ".NAME.old-*, their work folders)", "; ".join(f"{p} (no such file or folder, nothing to clean beside it)"
                                                         for p in missing),
            "check the path; blocklin clean with no path looks in the temp dir and the current folder"))
    items = clean(args.paths, dry_run=args.dry_run)
    gone = [i for i in items if i.action in ("removed", "would remove")]
    freed = sum(i.bytes for i in gone)
    summary = {"dry_run": bool(args.dry_run), "items": [i.to_dict() for i in items],
               "removed": len(gone) if not args.dry_run else 0, "bytes": freed}
    lines = [f"{i.action} {i.kind} {i.path} ({format_size(i.bytes)}): {i.reason}" for i in items]
    lines += [f"{p}: not a file blocklin wrote, left alone (clean looked beside it for an output's partials and "
              "work folders)" for p in unowned]
    verb = "would free" if args.dry_run else "freed"
    lines.append(f"{len(gone)} of {len(items)} leftover(s) {'to remove' if args.dry_run else 'removed'}, "
                 f"{verb} {format_size(freed)}" if items else "nothing to clean")
    ui.emit(args, summary, "\n".join(lines))
    return summary
