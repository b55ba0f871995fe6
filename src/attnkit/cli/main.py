"""attnkit: explain a BERT, train ViT and Transformer models, count what attention costs.

One module per subcommand, registered in SUBCOMMANDS.
"""

from __future__ import annotations

import argparse
import sys

from attnkit import __version__
from attnkit.cli import bench, explain, explain_image, flops, seq2seq, train
from attnkit.cli._errors import EXIT_USAGE, UsageError

# Each subcommand module exposes register(subparsers), which adds its parser and
# sets `run`. Add new subcommands to this tuple.
SUBCOMMANDS = (explain, explain_image, train, seq2seq, flops, bench)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnkit", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"attnkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in SUBCOMMANDS:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        return args.run(args)
    except UsageError as e:
        print(f"attnkit {args.command}: error: {e.one_line()}", file=sys.stderr)
        return EXIT_USAGE
