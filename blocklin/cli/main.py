"""``blocklin`` console script: dispatches to one module per subcommand.

Each ``blocklin/cli/<command>.py`` defines ``register(subparsers)``, which adds its parser and sets
``func`` to a ``run(args) -> dict`` callable. ``run`` returns the summary that ``--json`` prints;
human output is printed by the command itself through :mod:`blocklin.cli.ui`.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys

from blocklin.cli import ui

COMMANDS = ("info", "gemm", "gram", "demo", "convert", "append", "update", "svd", "pca", "eigs", "inv", "solve",
            "factor", "clean", "calibrate")

#: Negative numbers as option values, exponents and ``-inf`` included (``--alpha -3.3e-06``); Python
#: 3.11's argparse reads ``-3.3e-06`` as an unknown option. No blocklin option looks like a number. A
#: negative size (``--memory -5MiB``) is a value too, refused by its option's own check (argparse had said
#: "expected one argument", naming no rule and no fix).
NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^-inf$|^-(\d+\.?\d*|\.\d+) ?[KMGTP]?i?B$")


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` that takes negative numbers in every notation as values; its
    subcommand parsers are of the same class."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = NEGATIVE_NUMBER

    def parse_known_args(self, args=None, namespace=None):  # noqa: ANN001, ANN201 - argparse's signature
        if args is not None:
            self._refuse_repeated(list(args))
        return super().parse_known_args(args, namespace)

    def _refuse_repeated(self, args: list[str]) -> None:
        """A single-valued option given twice (``-o C.zarr ... --out D.zarr``) is a usage error:
        argparse keeps the last and drops the first without a word. Repeatable options
        (``--storage-option``) and flags are not single values."""
        seen: dict[int, str] = {}
        for token in args:
            if token == "--":
                break
            name = token.split("=", 1)[0] if token.startswith("--") else token
            action = self._option_string_actions.get(name)
            if action is None or not isinstance(action, argparse._StoreAction):
                continue
            if id(action) in seen:
                self.error(f"argument {'/'.join(action.option_strings)}: given twice ({seen[id(action)]} and "
                           f"{name}); the first value would be dropped. Fix: pass it once")
            seen[id(action)] = name


def build_parser() -> argparse.ArgumentParser:
    from blocklin._version import __version__

    parser = Parser(prog="blocklin",
                    description="Out-of-core blocked linear algebra on chunked zarr matrices.")
    parser.add_argument("--version", action="version", version=f"blocklin {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"blocklin.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"blocklin.cli.{name}":
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:  # the commands' modules import much of blocklin: Ctrl-C here is one line too, before any work
        parser = build_parser()
    except KeyboardInterrupt:
        return ui.interrupted_while_starting()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    from blocklin.storage import ownership

    with ownership.running_command(["blocklin", *(sys.argv[1:] if argv is None else argv)]):
        return ui.run_command(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
