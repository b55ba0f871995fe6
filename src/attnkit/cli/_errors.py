"""The error types of the command line: one line on stderr, never a traceback.

`UsageError`: bad input from the user -> exit code 2. `FileError`: a file the command
reads is damaged or does not fit (a checkpoint whose weights belong to another model, a
tokenizer.json that is not JSON) -> exit code 1. The message names the argument or the file.
"""

from __future__ import annotations

__all__ = ["EXIT_FAILURE", "EXIT_USAGE", "FileError", "UsageError"]

EXIT_FAILURE = 1
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


class FileError(UsageError):
    """A file the command reads is unusable: damaged, or not what its folder says it is.

    Printed like a `UsageError` (one line naming the file), but the exit code is
    `EXIT_FAILURE`: the arguments were fine, the file is not.
    """
