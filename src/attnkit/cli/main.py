"""`attnkit` command line: one module per subcommand, registered here."""

from __future__ import annotations

import argparse
import sys

from attnkit import __version__
from attnkit.cli import explain_image, train


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnkit", description=__doc__)
    parser.add_argument("--version", action="version", version=f"attnkit {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in (train, explain_image):
        module.register(subparsers)  # each sets `run=` with set_defaults
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    return args.run(args)
