"""Paths named for what they are: a folder, a device, a FIFO, a symlink loop, a dangling link.

"no such file" for a folder, or "a part of the path is a file" for a dangling symlink, sends
the user looking for the wrong thing. `kind` says what a path that is not a regular file is;
`input_file` refuses anything but a readable regular file before work starts; `load_torch`
reads a checkpoint and names a damaged one as not readable, for every command that reads one.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from attnkit.cli._errors import UsageError

__all__ = ["control_characters", "input_file", "kind", "load_torch"]


def kind(path: Path) -> str | None:
    """What `path` is when it is not a regular file: "a folder", "a device", "a FIFO (named
    pipe)", "a socket", "a symlink loop", "a dangling symlink (to TARGET)", "missing"; None
    for a regular file."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "a symlink loop" if os.path.islink(path) else "a path through a symlink loop"
        if os.path.islink(path):
            return f"a dangling symlink (to {os.readlink(path)!r})"
        return "missing"
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    return "a socket" if stat.S_ISSOCK(mode) else "not a regular file"


def input_file(path: Path, option: str, want: str) -> Path:
    """`path` if it is a regular file; else UsageError naming `option` and what it is."""
    what = kind(path)
    if what == "missing":
        raise UsageError(f"{option} {str(path)!r}: no such file: give {want}")
    if what is not None:
        raise UsageError(f"{option} {str(path)!r} is {what}, not a file: give {want}")
    return path


def control_characters(text: str) -> list[str]:
    """The control characters (newline, tab, escape, ...) in `text`, as repr()s."""
    return sorted({repr(c) for c in text if ord(c) < 32 or ord(c) == 127})


def load_torch(path: Path, option: str):
    """`torch.load(path, weights_only=True)`; UsageError naming `option` and the file when it
    cannot be read (truncated, not a torch file, not a file), with no warning of torch's
    before it."""
    from attnkit._io import UnreadableFile, load_weights_only

    try:
        return load_weights_only(path)
    except UnreadableFile as e:
        raise UsageError(f"{option}: {path} is not readable ({e})") from None
