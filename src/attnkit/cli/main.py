"""attnkit: explain a BERT, train ViT and Transformer models, count what attention costs.

One module per subcommand, registered in SUBCOMMANDS. Building the parser imports no torch
(subcommands import their heavy parts inside their run functions), so `attnkit --help`,
`--version` and usage errors answer at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

from attnkit._version import __version__
from attnkit.cli import bench, explain, explain_image, flops, lm, seq2seq, train
from attnkit.cli._common import EXIT_FAILURE, EXIT_INTERRUPTED, Parser, release_out_locks
from attnkit.cli._console import portable_streams
from attnkit.cli._errors import EXIT_USAGE, FileError, UsageError

# Each subcommand module exposes register(subparsers), which adds its parser and
# sets `run`. Add new subcommands to this tuple.
SUBCOMMANDS = (explain, explain_image, train, seq2seq, lm, flops, bench)

EPILOG = """\
Every command writes into attnkit-out/COMMAND/ (or --out DIR, one run at a time) and refuses
to overwrite earlier results unless --force; --json prints one JSON summary, --quiet only the
last line.
Run `attnkit COMMAND --help` for its options and examples.
exit codes: 0 done, 1 failed, 2 bad usage, 130 interrupted (Ctrl-C).

examples:
  attnkit explain "The cat sat on the mat." --focus cat
  attnkit train cnn
  attnkit eval --json
  attnkit flops --tokens 197 --dim 768 --heads 12"""


def build_parser() -> Parser:
    import argparse

    parser = Parser(
        prog="attnkit",
        description=__doc__.split("\n\n")[0],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"attnkit {__version__}")
    sub = parser.add_subparsers(
        dest="command", metavar="COMMAND", help="what to do (attnkit COMMAND --help: its options)"
    )
    for module in SUBCOMMANDS:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    portable_streams()  # before argparse prints anything
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if not getattr(args, "run", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    prog = f"attnkit {args.command}"
    try:
        return args.run(args)
    except FileError as e:
        print(f"{prog}: error: {e.one_line()}", file=sys.stderr)
        return EXIT_FAILURE
    except UsageError as e:
        print(f"{prog}: error: {e.one_line()}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; only complete files were written", file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as e:
        where = f" ({e.filename})" if e.filename else ""
        print(f"{prog}: error: {e.strerror or e}{where}", file=sys.stderr)
        return EXIT_FAILURE
    except Exception as e:  # never a traceback for users; ATTNKIT_DEBUG=1 shows it
        if os.environ.get("ATTNKIT_DEBUG"):
            raise
        line = " ".join(f"{type(e).__name__}: {e}".split())
        print(f"{prog}: failed: {line} (set ATTNKIT_DEBUG=1 for the traceback)", file=sys.stderr)
        return EXIT_FAILURE
    finally:
        release_out_locks()  # the --out folder is free for the next run


def console() -> None:
    """The `attnkit` command and `python -m attnkit`: run `main`, exit with its code.

    After Ctrl-C the exit is `os._exit(130)`, everything flushed first. CPython 3.11 marks a
    KeyboardInterrupt that passed through a builtin exec() as unhandled even when it is
    caught later (dataclasses build their methods with exec, which torch's imports do all the
    time), and then kills itself with SIGINT at exit: exit -2 instead of 130, found as a
    flaky Ctrl-C test. attnkit writes its files atomically, so nothing is left to finish.
    """
    try:
        code = main()
    except KeyboardInterrupt:  # after main's own handler: while it printed or let go of --out
        print(INTERRUPTED, file=sys.stderr)
        code = EXIT_INTERRUPTED
    # The command is over; a Ctrl-C from here to the exit (the interpreter's teardown: atexit
    # handlers, threads joined) ends with 130 and the one line too, never a traceback.
    signal.signal(signal.SIGINT, _interrupted_at_exit)
    if code == EXIT_INTERRUPTED:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


INTERRUPTED = "attnkit: interrupted; only complete files were written"


def _interrupted_at_exit(signum, frame) -> None:
    with contextlib.suppress(Exception):  # a closed pipe: nothing more to say there
        sys.stdout.flush()
    os.write(2, (INTERRUPTED + "\n").encode())
    os._exit(EXIT_INTERRUPTED)
