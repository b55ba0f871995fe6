"""The one error type of the command line: bad input -> exit code 2 and one line on stderr."""

from __future__ import annotations

__all__ = ["EXIT_USAGE", "UsageError"]

EXIT_USAGE = 2


class UsageError(Exception):
    """Bad input from the user (a missing file, an unknown token, ...).

    `attnkit.cli.main.main` prints ``attnkit COMMAND: error: MESSAGE`` as one
    line on stderr (no traceback) and returns `EXIT_USAGE`. The message should
    say what is wrong and what to do.
    """

    def one_line(self) -> str:
        """The message with newlines folded, so it stays one line."""
        return " ".join(str(self).split())
