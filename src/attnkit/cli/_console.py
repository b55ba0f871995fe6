"""Output that prints on any console: a stream whose encoding cannot write attnkit's
characters (× in shapes, ᵀ and √ in formulas, · ...) gets ASCII stand-ins for them and "?"
for the rest, instead of a UnicodeEncodeError (a Windows console in cp1252,
PYTHONIOENCODING=ascii, LANG=C on an old Python)."""

from __future__ import annotations

import codecs
import sys

__all__ = ["ERRORS", "portable_streams"]

ERRORS = "attnkit-ascii"  # the codecs error handler's name
STAND_INS = {
    "×": "x", "ᵀ": "^T", "√": "sqrt", "·": "*", "…": "...", "—": "-", "–": "-", "≈": "~",
    "≤": "<=", "≥": ">=", "≠": "!=", "→": "->", "←": "<-", "²": "^2", "³": "^3", "±": "+/-",
    "µ": "u", "μ": "u", "‘": "'", "’": "'", "“": '"', "”": '"', "■": "#", "□": ".",
    "█": "#", "▏": "|", "░": ".", "✓": "ok", "✗": "x",
}  # fmt: skip


def _stand_in(err: UnicodeError) -> tuple[str, int]:
    if not isinstance(err, UnicodeEncodeError):
        raise err
    text = err.object[err.start : err.end]
    return "".join(STAND_INS.get(c, "?") for c in text), err.end


codecs.register_error(ERRORS, _stand_in)


def _writes_all(encoding: str) -> bool:
    try:
        "".join(STAND_INS).encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def portable_streams() -> None:
    """Give sys.stdout and sys.stderr the stand-ins where their encoding lacks a character
    attnkit prints; streams that can write them all (UTF-8) are left as they are."""
    for stream in (sys.stdout, sys.stderr):
        encoding = getattr(stream, "encoding", None)
        if encoding and hasattr(stream, "reconfigure") and not _writes_all(encoding):
            stream.reconfigure(errors=ERRORS)
