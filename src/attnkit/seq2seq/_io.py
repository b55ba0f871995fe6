"""Atomic file writes: a temporary file in the same directory, then `os.replace`.

An interrupted run never leaves a half-written checkpoint, report or picture.
(The `viz` branch has the same helper as `attnkit._io`; when both are merged,
this module should re-export that one.)
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch

__all__ = ["atomic_torch_save", "atomic_write_bytes", "atomic_write_json"]


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` atomically; creates the parent directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_json(path: str | Path, obj) -> Path:
    return atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def atomic_torch_save(path: str | Path, obj) -> Path:
    import io

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return atomic_write_bytes(path, buffer.getvalue())
