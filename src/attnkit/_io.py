"""Atomic file writes: a temporary file in the target's directory, then ``os.replace``.

An interrupted run therefore never leaves a half-written report, picture or checkpoint:
readers see either the old file or the complete new one.
"""

from __future__ import annotations

import errno
import io
import json
import os
import stat
import uuid
from pathlib import Path
from typing import Any

__all__ = [
    "UnreadableFile",
    "atomic_save",
    "atomic_save_figure",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "load_weights_only",
    "path_kind",
]


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, mode: int | None = None) -> Path:
    """Write ``data`` to ``path`` atomically and return the path.

    Missing parent directories are created. The temporary file lives in the same
    directory (``os.replace`` is only atomic within one file system) and is removed
    if writing fails. The new file gets the usual permissions (0o666 minus umask), or exactly
    ``mode`` when given (no umask; and the temporary name is never followed as a symlink:
    for files whose permissions are checked later, such as the kernel cache's).
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ValueError(f"data: expected bytes, got {type(data).__name__}")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:12]}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    if mode is not None:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    # os.open with an explicit mode (instead of tempfile, which uses 0o600) so the
    # final file has the permissions any normal write would give it.
    fd = os.open(tmp, flags, 0o666 if mode is None else mode)
    try:
        with os.fdopen(fd, "wb") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def atomic_write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically (encoded with ``encoding``) and return the path."""
    if not isinstance(text, str):
        raise ValueError(f"text: expected str, got {type(text).__name__}")
    return atomic_write_bytes(path, text.encode(encoding))


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    """JSON of ``obj`` (indented, trailing newline) written atomically."""
    return atomic_write_text(path, json.dumps(obj, indent=2) + "\n")


def atomic_save(path: str | os.PathLike[str], obj: Any) -> Path:
    """``torch.save(obj)`` written atomically: a checkpoint is complete or absent."""
    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return atomic_write_bytes(path, buffer.getvalue())


def atomic_save_figure(path: str | os.PathLike[str], figure: Any, **savefig_kwargs) -> Path:
    """A matplotlib figure as PNG (or the format of ``savefig_kwargs``), written atomically."""
    buffer = io.BytesIO()
    figure.savefig(buffer, **{"format": "png", **savefig_kwargs})
    return atomic_write_bytes(path, buffer.getvalue())


class UnreadableFile(ValueError):
    """`load_weights_only` could not read the file; the message is torch's reason, short."""


def load_weights_only(path: str | os.PathLike[str]) -> Any:
    """``torch.load(path, map_location="cpu", weights_only=True)``, quietly.

    torch's unpickler warns (a UserWarning about the pickle protocol) before it refuses a
    file that is not a weights file; a refusal must be attnkit's one line, so warnings are
    kept back while loading and shown only if the load succeeds. A failure raises
    `UnreadableFile` with torch's reason in one line (its advice to set weights_only=False
    and its terminal colour codes left out)."""
    import pickle
    import re
    import warnings

    import torch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except (RuntimeError, pickle.UnpicklingError, EOFError, OSError, ValueError) as e:
            text = re.sub(r"\x1b\[[0-9;]*m", "", " ".join(str(e).split()))
            reason = text.split("WeightsUnpickler error: ")[-1]  # the cause, not the advice
            reason = reason.split(" Check the documentation of torch.load")[0]
            raise UnreadableFile(f"{type(e).__name__}: {reason[:160]}") from None
    for w in caught:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return state


def path_kind(path: str | os.PathLike[str]) -> str | None:
    """What `path` is when it is not a regular file: "a folder", "a device", "a FIFO (named
    pipe)", "a socket", "a symlink loop", "a dangling symlink (to TARGET)", "missing"; None
    for a regular file. Messages name paths by it: "no such file" for a folder, or "a part of
    the path is a file" for a dangling link, sends the user looking for the wrong thing."""
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
