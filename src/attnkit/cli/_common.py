"""What every subcommand shares: one-line usage errors, the output folder rule, exit codes,
and the argparse types of the options several commands have (--seed, --threads, --out).
The --out folder's checks and lock live in `attnkit.cli._out_folder` (re-exported here).

Imports nothing heavy: `attnkit --help` builds every parser through this module.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from attnkit.cli._errors import EXIT_FAILURE, EXIT_USAGE
from attnkit.cli._out_folder import prepare_out, release_out_locks, remove_results
from attnkit.cli._paths import control_characters

__all__ = [
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "MAX_SEED",
    "OUT_ROOT",
    "Parser",
    "add_max_time",
    "add_out_options",
    "add_report_options",
    "default_out",
    "emit",
    "int_list",
    "max_threads",
    "out_folder",
    "positive_float",
    "positive_int",
    "prepare_out",
    "progress",
    "release_out_locks",
    "remove_results",
    "seed_number",
    "thread_count",
]

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C
OUT_ROOT = Path("attnkit-out")


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr (not usage + error) and exit 2,
    and which refuses text arguments that are not valid UTF-8 (see `_check_text`).

    Every (sub)command's parser is one (argparse makes subparsers of the parent's class), and
    each refuses the arguments it does not know itself, so that a mistyped option of
    ``attnkit lm train`` points to ``attnkit lm train --help``, not to ``attnkit --help``."""

    def error(self, message: str):  # type: ignore[override]
        line = " ".join(message.split())
        print(f"{self.prog}: error: {line} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        namespace, extras = super().parse_known_args(args, namespace)
        self._check_text(namespace)
        if extras:  # here, not in the top parser: the error names this subcommand's --help
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras

    def _check_text(self, namespace: argparse.Namespace) -> None:
        """Python hands argv bytes that are not UTF-8 over as lone surrogates
        ("surrogateescape"); a tokenizer or a JSON writer then fails far from the cause.
        Text (str) arguments are refused here, naming the argument; paths (Path) keep such
        bytes, which the file system takes back unchanged. Each (sub)parser checks its own."""
        for action in self._actions:
            value = getattr(namespace, action.dest, None)
            values = value if isinstance(value, list) else [value]
            if any(isinstance(v, str) and not _is_utf8(v) for v in values):
                name = _argument_name(action)
                self.error(f"argument {name}: is not valid UTF-8 text: give it as UTF-8")


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _argument_name(action: argparse.Action) -> str:
    """How the user spells the argument: its first long option, else its metavar or name."""
    longs = [o for o in action.option_strings if o.startswith("--")]
    if longs or action.option_strings:
        return (longs or action.option_strings)[0]
    return str(action.metavar or action.dest)


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


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:  # also a number of more than 4300 digits
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number") from None


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = _whole(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


# torch's generators take seeds below 2**64, Python's and numpy's more or fewer; 0..2**63-1
# fits every one attnkit seeds (also after the small offsets some commands add).
MAX_SEED = 2**63 - 1


def seed_number(text: str) -> int:
    """argparse type of every --seed: a whole number from 0 to 2**63 - 1."""
    value = _whole(text)
    if not 0 <= value <= MAX_SEED:
        shown = text if len(text) <= 40 else text[:20] + "..."
        raise argparse.ArgumentTypeError(
            f"must be a whole number from 0 to 2**63 - 1 = {MAX_SEED}, got {shown}"
        )
    return value


def max_threads() -> int:
    """The most --threads any command takes: 4 per CPU of this machine. More only wait on
    each other, and each costs a thread stack: under a memory limit, creating hundreds made
    torch fail with "error return without exception set" or OpenMP abort the process."""
    return 4 * (os.cpu_count() or 1)


def thread_count(text: str) -> int:
    """argparse type of every --threads: 1 .. `max_threads()`."""
    value = positive_int(text)
    limit = max_threads()
    if value > limit:
        raise argparse.ArgumentTypeError(
            f"{value} threads is more than {limit}, 4 per CPU of this machine "
            f"({os.cpu_count() or 1} CPUs): give at most {limit}"
        )
    return value


def out_folder(text: str) -> Path:
    """argparse type of --out: a folder path, not empty. ``--out ""`` (an unset shell
    variable, typically) would otherwise mean the current folder, and --force would
    overwrite what is there; ``--out .`` says so on purpose and is accepted."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"{text!r} is empty: give a folder (--out . for the current one)"
        )
    bad = control_characters(text)
    if bad:  # a newline would split the summary's last line (what was written where) in two
        raise argparse.ArgumentTypeError(
            f"{text!r} holds control characters ({', '.join(bad)}): give a folder name without"
        )
    return Path(text)


def int_list(text: str) -> list[range]:
    """argparse type: '3', '0,11', '3-5' or '0,3-5' -> ranges of integers >= 0 (-1 alone
    counts from the end). Ranges stay ranges: '0-99999999999' costs nothing until the
    command has checked it against what exists (see `attnkit.cli.explain`)."""
    values: list[range] = []
    for part in text.split(","):
        part = part.strip()
        if part.startswith("-") and part[1:].isdigit():  # -1: the last, for who counts from the end
            values.append(range(int(part), int(part) + 1))
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
        values.append(range(lo, hi + 1))
    return values


def default_out(command: str) -> Path:
    """The one default layout: attnkit-out/<command>/."""
    return OUT_ROOT / command


def add_out_options(p: argparse.ArgumentParser, command: str, what: str) -> None:
    """--out DIR and --force, the same for every command that writes files."""
    p.add_argument(
        "--out",
        type=out_folder,
        default=default_out(command),
        metavar="DIR",
        help=f"folder to write {what} into, created if needed; one run at a time "
        f"(default: {default_out(command)})",
    )
    p.add_argument(
        "--force", action="store_true", help="overwrite results already in the --out folder"
    )


def add_max_steps(
    p: argparse.ArgumentParser,
    what: str = "stop after S optimizer steps in all, e.g. for a quick try (default: no limit)",
) -> None:
    """``--max-steps S``: the training commands' cap on optimizer steps (None: no limit)."""
    p.add_argument("--max-steps", type=positive_int, metavar="S", help=what)


def positive_float(text: str, *, unit: str = "") -> float:
    """argparse type: a finite number > 0 (`unit`, e.g. " of seconds", says what it counts)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a number{unit}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number{unit} > 0, got {text}")
    return value


def positive_seconds(text: str) -> float:
    """argparse type of --max-time: a finite number of seconds > 0."""
    return positive_float(text, unit=" of seconds")


def add_max_time(p: argparse.ArgumentParser) -> None:
    """``--max-time SECONDS``: a training command's cap on wall-clock time (None: no limit).
    The run stops after the step in which the time runs out and saves a checkpoint there,
    which --resume continues exactly (the schedule is the one of the whole run)."""
    p.add_argument(
        "--max-time",
        type=positive_seconds,
        metavar="SECONDS",
        help="stop after the step during which SECONDS of training have passed, save the "
        "checkpoint there; --resume continues it (default: no limit)",
    )


def add_report_options(p: argparse.ArgumentParser) -> None:
    """--json and --quiet: what goes to stdout."""
    p.add_argument(
        "--json", action="store_true", help="print one JSON summary on stdout and nothing else"
    )
    p.add_argument(
        "--quiet", action="store_true", help="print only the last line (what was written where)"
    )


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
