"""Paths named for what they are: a folder, a device, a FIFO, a symlink loop, a dangling link.

"no such file" for a folder, or "a part of the path is a file" for a dangling symlink, sends
the user looking for the wrong thing. `kind` (`attnkit._io.path_kind`) says what a path that is
not a regular file is; `input_file` refuses anything but a readable regular file before work
starts; `load_torch` reads a checkpoint and names a damaged one as not readable, for every
command that reads one.
"""

from __future__ import annotations

from pathlib import Path

from attnkit._io import path_kind as kind
from attnkit.cli._errors import UsageError

__all__ = ["control_characters", "input_file", "kind", "load_torch"]


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
