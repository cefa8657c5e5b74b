"""Shared CLI plumbing: common options, progress, JSON output, error-to-exit-code mapping."""

from __future__ import annotations

import argparse
import contextlib
import sys
import traceback
from typing import Any

from blocklin import jsonsafe
from blocklin.errors import BlocklinError

EXIT_OK = 0
EXIT_ERROR = 1  # bad input or failed operation
EXIT_USAGE = 2  # argparse's code for bad arguments
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: stdout's reader closed the pipe (``blocklin ... --json | head -c0``)


def count_arg(option: str, *, minimum: int = 1, auto: tuple[str, ...] = (), example: str = "",
              maximum: int | None = None, why: str = "") -> Any:
    """An ``argparse`` type for a size or count option: an integer ``>= minimum`` (at most
    :data:`blocklin.validate.MAX_COUNT`) or one of the ``auto`` words, checked by
    :func:`blocklin.validate.count` while parsing, so a bad value is a usage error (exit 2) naming
    ``option``, before any file is opened. ``example`` is the fix's value."""
    from blocklin.errors import ParameterError
    from blocklin.validate import count

    fix = f"pass {option} {example or max(minimum, 1) * 10}" + (f" (or {' / '.join(auto)})" if auto else "")

    def parse(text: str) -> Any:
        if text in auto:
            return text
        try:
            value = int(text.strip())
        except ValueError:  # "5.5", "hi", "2**63": a size is a whole number
            value = text
        try:
            return count(option, value, fix=fix, minimum=minimum, auto=auto, maximum=maximum, why=why)
        except ParameterError as exc:
            raise argparse.ArgumentTypeError(_without_name(str(exc), option)) from None

    parse.__name__ = option.lstrip("-").replace("-", "_")  # argparse names the type in some messages
    return parse


def number_arg(option: str, *, positive: bool = False, nonnegative: bool = False, example: str = "1.0") -> Any:
    """An ``argparse`` type for a real option (``--tol``, ``--alpha``): a finite number, ``> 0`` when
    ``positive``, ``>= 0`` when ``nonnegative``, checked while parsing, so a bad value is a usage error
    (exit 2) naming ``option`` as typed. The operations check the same values (``tol=nan`` raises), but
    name their Python argument and exit 1 after the inputs were opened."""
    import math

    rule = "a positive finite number" if positive else "a finite number >= 0" if nonnegative else "a finite number"

    def parse(text: str) -> float:
        try:
            value = float(text.strip())
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or (positive and value <= 0) or (nonnegative and value < 0):
            raise argparse.ArgumentTypeError(f"must be {rule}; got {text!r}. Fix: pass {option} {example}")
        return value

    parse.__name__ = option.lstrip("-").replace("-", "_")
    return parse


def plot_arg(text: str) -> str:
    """``--plot PNG``: a file path whose folder exists, not a folder, with matplotlib installed, checked
    while parsing. The plot is drawn after the run: a missing folder had failed it once the result was
    written (exit 1 with the output left), and a folder had been given matplotlib's ``.png`` suffix."""
    import importlib.util
    import os

    def refuse(rule: str, fix: str) -> argparse.ArgumentTypeError:
        return argparse.ArgumentTypeError(f"{rule}; got {text!r}. Fix: {fix}")

    if os.path.isdir(text):
        raise refuse("must be a file path, not a folder", f"pass --plot {os.path.join(text, 'spectrum.png')}")
    folder = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(folder):
        raise refuse(f"must be in an existing folder ({folder} does not exist)",
                     f"create {folder} first, or pass a path in an existing folder")
    if importlib.util.find_spec("matplotlib") is None:
        raise refuse("needs matplotlib, which is not installed", "pip install 'blocklin[plot]', or drop --plot")
    from matplotlib.backend_bases import FigureCanvasBase

    # the extension names the format: matplotlib had refused an unknown one after the run (exit 1 with the
    # result written), and had appended .png to a path without one (the summary named a file never written)
    kinds = sorted(FigureCanvasBase.get_supported_filetypes())
    if os.path.splitext(text)[1][1:].lower() not in kinds:
        raise refuse(f"must end in an image format's extension ({', '.join('.' + k for k in kinds)})",
                     f"pass --plot {os.path.splitext(text)[0]}.png")
    return text


plot_arg.__name__ = "plot"


def temp_dir_arg(text: str) -> str:
    """``--temp-dir``: a URL, or a local folder (created when a job first needs it), never an existing
    file: a file had been accepted and, by a run that needed no intermediates, never looked at."""
    import os

    if "://" not in text and os.path.exists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"must be a folder (or a URL) for the jobs' intermediates, not a file; got "
                                         f"{text!r}. Fix: pass --temp-dir {os.path.dirname(os.path.abspath(text))}")
    return text


temp_dir_arg.__name__ = "temp_dir"


def pair_arg(option: str, *, auto: tuple[str, ...] = (), example: str = "1000,1000") -> Any:
    """An ``argparse`` type for ``R,C`` options (``--chunks``, ``--shape``): two positive integers
    (or one of the ``auto`` words), returned as given once checked."""
    from blocklin.errors import ParameterError, explain
    from blocklin.validate import count

    fix = f"pass {option} {example}" + (f" (or {' / '.join(auto)})" if auto else "")

    def parse(text: str) -> str:
        if text in auto:
            return text
        parts = text.split(",")
        try:
            for part in parts if len(parts) == 2 else [None]:
                value: Any = part
                with contextlib.suppress(ValueError, AttributeError):
                    value = int(part.strip())
                count(option, value, fix=fix, minimum=1)
        except ParameterError:
            words = " or ".join(repr(a) for a in auto)
            raise argparse.ArgumentTypeError(_without_name(explain(
                option, f"must be two positive integers R,C{' or ' + words if words else ''}", repr(text), fix),
                option)) from None
        return text

    parse.__name__ = option.lstrip("-").replace("-", "_")
    return parse


def memory_arg(text: str) -> int:
    """``--memory``: a positive byte size (``1GiB``, ``512MB``, ``1073741824``), parsed while parsing."""
    from blocklin.config import parse_size
    from blocklin.errors import ConfigError

    try:
        return parse_size(text, "--memory")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(_without_name(str(exc), "--memory")) from None


memory_arg.__name__ = "memory"


def _without_name(message: str, option: str) -> str:
    """``"--tile: must be ...; got 0. Fix: ..."`` without the name argparse already prints."""
    prefix = f"{option}: "
    return message[len(prefix):] if message.startswith(prefix) else message


def add_common(parser: argparse.ArgumentParser, *, memory: bool = True, device: bool = True,
               scheduler: bool = True, output: bool = True) -> None:
    """Options most commands share."""
    if memory:
        parser.add_argument("--memory", metavar="SIZE", type=memory_arg, help="host memory budget, e.g. 1GiB (default: config)")
    if device:
        parser.add_argument("--device", choices=("auto", "cpu", "gpu"), help="compute device (default: auto)")
    if scheduler:
        parser.add_argument("--scheduler", metavar="S",
                            help="threads (default), sync, processes, distributed, or tcp://host:port")
    if output:
        parser.add_argument("--overwrite", action="store_true", help="replace an existing output that blocklin wrote "
                            "and nobody changed since (or an empty folder or file); other data is refused")
    parser.add_argument("--storage-option", action="append", metavar="KEY=VALUE", dest="storage_option",
                        help="fsspec option for s3://, gs://, ... paths (repeatable), e.g. "
                             "endpoint_url=http://host:9000; dotted keys nest (client_kwargs.region_name=eu-west-1); "
                             "values are JSON when they parse")
    parser.add_argument("--temp-dir", metavar="DIR_OR_URL", dest="temp_dir", type=temp_dir_arg,
                        help="folder or URL for intermediates, e.g. s3://bucket/tmp on a cluster "
                             "(default: BLOCKLIN_TEMP_DIR, else the system temp dir)")
    parser.add_argument("--require-complete", action="store_true", dest="require_complete",
                        help="refuse input zarr stores with a missing chunk file (read as the fill value "
                             "otherwise; blocklin's own outputs are always checked)")
    parser.add_argument("--json", action="store_true", help="print one JSON object with the summary")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")


def add_run_options(parser: argparse.ArgumentParser, *, unit: str | None = "tasks", resume: str | None = None,
                    explain: bool = True) -> None:
    """Options of a command that runs an operation: ``--workers`` (concurrent ``unit``; None: none),
    ``--no-check-finite``, ``--resume`` (when ``resume`` gives its help) and ``--explain``."""
    if unit:
        from blocklin.config import MAX_WORKERS

        parser.add_argument("--workers", type=count_arg("--workers", example="4", maximum=MAX_WORKERS,
                                                        why="more tasks than cores only queue"), help=f"concurrent {unit} (local schedulers)")
    parser.add_argument("--no-check-finite", action="store_true", help="skip the NaN/Inf check")
    if resume:
        parser.add_argument("--resume", action="store_true", help=resume)
    if explain:
        parser.add_argument("--explain", action="store_true", help="print the plan and exit")


#: ``--resume`` of the commands whose passes are checkpointed (svd, pca, eigs).
RESUME_PASSES = ("continue the interrupted run that was writing OUT (same input, options and budget): completed "
                 "passes are skipped, the result is identical to an uninterrupted run")


def run_settings(args: argparse.Namespace, **extra: Any) -> dict:
    """The keyword settings every operation takes, from the options of :func:`add_common` and
    :func:`add_run_options` (``workers``, ``overwrite`` and ``resume`` where the command has them)."""
    kw = dict(memory=args.memory, device=args.device, scheduler=args.scheduler, progress=progress_arg(args),
              check_finite=False if args.no_check_finite else None)
    for name in ("workers", "overwrite", "resume"):
        if hasattr(args, name):
            kw[name] = getattr(args, name)
    return {**kw, **extra}


def progress_arg(args: argparse.Namespace) -> bool:
    """Progress bars in a terminal unless --json or --no-progress."""
    return not (getattr(args, "no_progress", False) or getattr(args, "json", False)) and sys.stderr.isatty()


def emit(args: argparse.Namespace, summary: dict[str, Any], human: str | None = None) -> None:
    """Print the JSON summary with --json, else the human text."""
    if getattr(args, "json", False):
        print(jsonsafe.dumps(summary, default=_default, sort_keys=True))  # NaN/Inf as null, named in "nonfinite"
    elif human:
        print(human)


def with_read_notes(human: str, report: dict) -> str:
    """``human`` followed by the report's advice on forced extra reads (``read_notes``), if any."""
    notes = report.get("read_notes") or []
    return "\n".join([human] + [f"note: {n}" for n in notes])


#: The report's entries that say what bounded the run (:meth:`blocklin.runtime.job.Job.report`; the
#: roofline ones on a GPU only).
FEED_KEYS = ("feed_gbps", "compute_fraction", "wait_fraction", "bound", "roofline_seconds", "roofline_efficiency",
             "roofline")


def feed_line(report: dict) -> str | None:
    """``feed 1.2 GB/s, device computing 34% of the run: bound by feed`` (None for a report without them);
    a GPU run's adds its roofline: ``; 42% of the roofline (0.12 s, default rates)``."""
    if "bound" not in report:
        return None
    gbps = float(report.get("feed_gbps") or 0.0)
    rate = f"{gbps:.2g}" if gbps < 10 else f"{gbps:.0f}"
    if report["bound"] == "unknown" or report.get("compute_fraction") is None:
        line = f"feed {rate} GB/s; no task streamed its data: bound unknown"
    else:
        line = (f"feed {rate} GB/s, device computing {report['compute_fraction']:.0%} of the run: "
                f"bound by {report['bound']}")
    return line + _roofline_part(report)


def _roofline_part(report: dict) -> str:
    """``; 42% of the roofline (0.12 s, measured rates)`` for a report with a roofline, else ``""``."""
    eff, rl = report.get("roofline_efficiency"), report.get("roofline") or {}
    if eff is None or not rl.get("gflops_source"):
        return ""
    sources = {"default" if str(rl[k]).startswith("default") else "measured" for k in ("gflops_source", "feed_source")}
    which = sources.pop() if len(sources) == 1 else "measured and default"
    secs = float(report["roofline_seconds"])
    return f"; {eff:.0%} of the roofline ({secs:.2g} s, {which} rates)"


def feed_summary(report: dict) -> dict:
    """The :data:`FEED_KEYS` of ``report`` (for a command's ``--json`` summary)."""
    return {k: report[k] for k in FEED_KEYS if k in report}


def plan_device(args: argparse.Namespace, plan: Any = None) -> str:
    """Where ``--explain`` expects ``plan`` to compute: the plan's own device where it has one (GEMM),
    else ``"gpu"`` when ``--device`` (or the configured device) says ``gpu``, else ``"cpu"``."""
    from blocklin.config import resolve

    if getattr(plan, "device", None) in ("cpu", "gpu"):
        return plan.device
    return "gpu" if resolve(device=getattr(args, "device", None)).device == "gpu" else "cpu"


def report_text(human: str, report: dict) -> str:
    """``human``, the report's :func:`feed_line` and its read notes (:func:`with_read_notes`)."""
    line = feed_line(report)
    return with_read_notes(human if line is None else f"{human}\n{line}", report)


def _default(obj: Any) -> Any:
    import numpy as np

    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return str(obj)


def _storage_settings(args: argparse.Namespace) -> Any:
    """Scope ``--storage-option`` and ``--temp-dir`` over the command (they reach every location it opens)."""
    import contextlib

    from blocklin import config
    from blocklin.storage.location import storage_options_from_items

    settings: dict[str, Any] = {}
    items = getattr(args, "storage_option", None)
    if items:
        settings["storage_options"] = {**(config.get_config().storage_options or {}),
                                       **storage_options_from_items(items)}
    if getattr(args, "temp_dir", None):
        settings["temp_dir"] = args.temp_dir
    if getattr(args, "require_complete", False):
        settings["require_complete"] = True
    return config.set(**settings) if settings else contextlib.nullcontext()


def _written_urls(args: argparse.Namespace) -> tuple[str, ...]:
    """The object-store URLs a command writes (its outputs and temp dir), to name a missing bucket."""
    values = [getattr(args, key, None) for key in ("out", "output", "q", "temp_dir")]
    return tuple(str(v) for v in values if isinstance(v, str) and "://" in v)


def _used_urls(args: argparse.Namespace) -> tuple[str, ...]:
    """Every object-store URL among the command's arguments (inputs, outputs, temp dir), to name
    the store that missing credentials were for; scheduler addresses are not stores."""
    values = [v for key, v in vars(args).items() if key != "scheduler"]
    flat = [x for v in values for x in (v if isinstance(v, list) else [v])]
    return tuple(str(v) for v in flat if isinstance(v, str) and "://" in v)


def _one_line_warning(message, category, filename, lineno, line=None) -> str:  # noqa: ANN001
    return f"blocklin: warning: {message}\n"


def run_command(args: argparse.Namespace) -> int:
    """Run ``args.func(args)`` and map errors to exit codes with a one-line message.

    Ctrl-C (SIGINT) and SIGTERM both stop the command through the same cleanup (tasks in flight
    finish or stop; a resumable operation's partial output and work folders are kept for a rerun with
    ``--resume``, other partials are removed), then print one line (naming what was kept, and how to
    continue or remove it) and exit 130 or 143.
    """
    import warnings

    from blocklin.interrupt import stop_io_at_exit

    warnings.formatwarning = _one_line_warning
    stop_io_at_exit()  # the command's exit waits for zarr's I/O thread, interrupted or not
    try:
        return _run_command(args)
    except BrokenPipeError:
        # the reader of stdout (``| head``) went away: what the command wrote (its output store) is
        # committed, so end quietly, as a process killed by SIGPIPE would (Python's signal docs)
        quiet_stdout()
        return EXIT_BROKEN_PIPE


def quiet_stdout() -> None:
    """Point stdout at ``/dev/null`` after its pipe closed, so that the interpreter's final flush
    does not print a second ``BrokenPipeError``."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout already closed or replaced
        pass
    finally:
        os.close(devnull)


def interrupted_while_starting() -> int:
    """Say that Ctrl-C stopped the CLI before its command ran anything (while it imported its
    modules); the exit status. ``blocklin_console``, the console script's entry, prints the same line."""
    print("blocklin: interrupted while starting; nothing was run", file=sys.stderr)
    return EXIT_INTERRUPTED


def _interrupted(args: argparse.Namespace, exc: KeyboardInterrupt) -> int:
    """The one line an interrupted command prints (what a resumable run kept), and its exit status."""
    from blocklin import interrupt
    from blocklin.storage.cleanup import kept_message, take_kept, take_written

    interrupt.quiet_shutdown()
    terminated = isinstance(exc, interrupt.Terminated)
    kept = take_kept()  # what a resumable run kept, said in this one line
    # an interrupt after a commit (while the job removes its work folder, or between a QR's R and Q): the
    # committed outputs are complete; "no output was written" had been said of them
    written = take_written()
    done = f"{', '.join(written)} {'was' if len(written) == 1 else 'were'} written (complete)" if written \
        else "no output was written"
    print(f"blocklin {args.command}: {'terminated' if terminated else 'interrupted'}; "
          f"{done}{'; ' + kept_message(kept) if kept else ''}", file=sys.stderr)
    return interrupt.EXIT_TERMINATED if terminated else EXIT_INTERRUPTED


def _run_command(args: argparse.Namespace) -> int:
    from blocklin import interrupt
    from blocklin.storage.cleanup import take_written

    take_written(record=True)  # this command's commits only (main() may run several in one process)

    try:
        with interrupt.handle_signals(), _storage_settings(args):
            try:
                if getattr(args, "plot", None):
                    from blocklin.cli import plot_file

                    plot_file.check_target(args.plot, overwrite=bool(getattr(args, "overwrite", False)),
                                           outputs=(str(args.out),) if getattr(args, "out", None) else ())
                args.func(args)
            except KeyboardInterrupt as exc:
                # still under the handlers, to the last line: another Ctrl-C while stopping (or while
                # the line is printed) is absorbed; the default handler, back once the block ends,
                # killed the process mid-message (a CI run of test_inverse_resume's twice-Ctrl-C case)
                from blocklin.storage.cleanup import abandon_held

                abandon_held(keep_partials=bool(getattr(args, "resume", False)))
                return _interrupted(args, exc)
        return EXIT_OK
    except KeyboardInterrupt as exc:  # before the handlers, or one interrupt more than they absorb
        return _interrupted(args, exc)
    except BrokenPipeError:
        raise  # stdout's reader went away: run_command ends quietly
    except Exception as exc:  # noqa: BLE001 - storage clients raise their own kinds (botocore's)
        from blocklin.errors import StorageCredentialsError
        from blocklin.storage.readerrors import storage_error

        mapped = storage_error(exc, _written_urls(args), _used_urls(args))  # an unreachable endpoint, a missing bucket
        if isinstance(exc, StorageCredentialsError) and exc.__cause__ is not None:
            # mapped where the command's URLs were unknown (a job before its outputs): said again naming them
            mapped = storage_error(exc.__cause__, _written_urls(args), _used_urls(args))
        if mapped is None and not isinstance(exc, (BlocklinError, FileNotFoundError, ValueError, TypeError,
                                                   MemoryError, OSError)):
            raise
        if getattr(args, "debug", False):
            traceback.print_exc()
        exc = mapped or exc
        name = type(exc).__name__
        if isinstance(exc, OSError) and not isinstance(exc, BlocklinError):
            from blocklin.storage.space import describe_os_error

            exc = describe_os_error(exc) or exc  # a raw write failure: its path, setting and fix
        print(f"blocklin {args.command}: error: {name}: {exc}", file=sys.stderr)
        if getattr(args, "json", False):
            try:
                print(jsonsafe.dumps({"error": name, "message": str(exc)}))
            except BrokenPipeError:
                quiet_stdout()
        return EXIT_ERROR
    finally:
        take_written()  # recording stops with the command
