"""What every subcommand shares: one-line usage errors, the output folder rule, exit codes.

Imports nothing heavy: `attnkit --help` builds every parser through this module.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from attnkit.cli._errors import EXIT_USAGE, UsageError

__all__ = [
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "OUT_ROOT",
    "Parser",
    "add_out_options",
    "add_report_options",
    "default_out",
    "emit",
    "int_list",
    "positive_int",
    "prepare_out",
    "progress",
    "remove_results",
]

EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C
OUT_ROOT = Path("attnkit-out")


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr (not usage + error) and exit 2."""

    def error(self, message: str):  # type: ignore[override]
        line = " ".join(message.split())
        print(f"{self.prog}: error: {line} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def add_command_group(subparsers, name: str, help: str, doc: str, dest: str):
    """A command with subcommands (``attnkit lm train|sample``): its parser, and the
    subparsers to add them to. Called without a subcommand it prints its help on stderr
    and exits with the usage code."""
    parser = subparsers.add_parser(
        name, help=help, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.set_defaults(run=lambda args: _print_help(parser))
    return parser, parser.add_subparsers(dest=dest, metavar="COMMAND")


def _print_help(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return EXIT_USAGE


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def int_list(text: str) -> list[int]:
    """argparse type: '3', '0,11', '3-5' or '0,3-5' -> a list of integers >= 0."""
    values: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if part.startswith("-") and part[1:].isdigit():  # -1: the last, for who counts from the end
            values.append(int(part))
            continue
        low, dash, high = part.partition("-")
        try:
            lo = int(low)
            hi = int(high) if dash else lo
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a list of numbers: write e.g. 3, 0,11 or 3-5"
            ) from None
        if lo < 0 or hi < lo:
            raise argparse.ArgumentTypeError(
                f"{part!r} is not a range: write LOW-HIGH, LOW <= HIGH"
            )
        values.extend(range(lo, hi + 1))
    return values


def default_out(command: str) -> Path:
    """The one default layout: attnkit-out/<command>/."""
    return OUT_ROOT / command


def add_out_options(p: argparse.ArgumentParser, command: str, what: str) -> None:
    """--out DIR and --force, the same for every command that writes files."""
    p.add_argument(
        "--out",
        type=Path,
        default=default_out(command),
        metavar="DIR",
        help=f"folder to write {what} into, created if needed (default: {default_out(command)})",
    )
    p.add_argument(
        "--force", action="store_true", help="overwrite results already in the --out folder"
    )


def add_report_options(p: argparse.ArgumentParser) -> None:
    """--json and --quiet: what goes to stdout."""
    p.add_argument(
        "--json", action="store_true", help="print one JSON summary on stdout and nothing else"
    )
    p.add_argument(
        "--quiet", action="store_true", help="print only the last line (what was written where)"
    )


def prepare_out(
    out: Path, names: Iterable[str], *, force: bool = False, option: str = "--out"
) -> Path:
    """Check and create the output folder before any work; UsageError naming `option` if it
    is a file, cannot be created or written, has a name too long, or already holds one of
    `names` (the command's result files) and `force` is not set."""
    shown = str(out)
    if len(shown) > 80:
        shown = shown[:40] + "..." + shown[-20:]
    try:
        return _prepare(out, names, force, option, shown)
    except OSError as e:  # ENAMETOOLONG and the like, from a stat before any mkdir
        raise UsageError(f"{option} {shown!r}: {_reason(e)}") from None


def _prepare(out: Path, names: Iterable[str], force: bool, option: str, shown: str) -> Path:
    if out.exists() and not out.is_dir():
        raise UsageError(f"{option} {shown!r} is a file: give a folder to write into")
    if out.is_dir() and not force:
        taken = sorted(n for n in names if (out / n).exists())
        if taken:
            raise UsageError(
                f"{option} {shown!r} already holds {', '.join(taken)}: "
                "pass --force to overwrite, or give another folder"
            )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{option} {shown!r}: {_reason(e)}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {shown!r} is not writable: give a folder you may write into")
    return out


def _reason(e: OSError) -> str:
    if e.errno == errno.ENAMETOOLONG:
        return "the name is too long for the file system: give a shorter path"
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "permission denied: give a folder you may write into"
    if e.errno in (errno.ENOTDIR, errno.EEXIST):
        return "a part of the path is a file: give a folder path"
    return f"{e.strerror or e}: give another folder"


def progress(total: int, desc: str, *, quiet: bool = False, unit: str = "it", initial: int = 0):
    """A tqdm bar with ETA on stderr that shows itself only after a second (a fast command
    prints nothing), and never with --quiet. stdout stays for the result."""
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        initial=initial,
        desc=desc,
        unit=unit,
        file=sys.stderr,
        disable=quiet,
        delay=1.0,
        leave=False,
    )


def emit(args: argparse.Namespace, command: str, summary: dict, line: str) -> None:
    """The last output of a command: with --json one JSON object (`summary` plus the
    command's name) and nothing else on stdout; otherwise the one summary `line`, prefixed
    with ``attnkit COMMAND:`` (also under --quiet: it is the result)."""
    if getattr(args, "json", False):
        import json

        print(json.dumps({"command": command, **summary}))
    else:
        print(f"attnkit {command}: {line}")


def remove_results(out: Path, names: Iterable[str]) -> None:
    """--force: delete the previous result files named `names` from `out` (after every
    check, right before the work), so that the folder never mixes two runs."""
    for name in names:
        (out / name).unlink(missing_ok=True)
