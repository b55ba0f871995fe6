"""Token strings as pictures and printouts show them, in one convention for every sub-word
family: WordPiece's (BERT). A word's first piece is bare, a piece that continues it starts
with "##".

- Byte-level BPE (GPT-2, RoBERTa) writes each byte as a character ("Ġ" a space, "Ċ" a
  newline, "ĉ" a tab): the bytes are decoded, the space that starts a word is dropped, and
  a piece that continues a word gets "##": "ĠUnbeliev", "able" -> "Unbeliev", "##able".
- SentencePiece (Llama, T5) starts a word with "▁": "▁the" -> "the", its other pieces "##".
- WordPiece tokens and plain words are shown as they are.

Whitespace that remains is made visible: a space "␣", a newline "↵", a tab "⇥" (a token
that is only a space would otherwise be an empty label); other control characters are
escaped ("\\x04"). A character whose bytes are split over pieces is shown by the piece that
ends it; the pieces before show their bytes ("<0xF0>", as SentencePiece writes bytes).
Special tokens ("[CLS]", "<s>", "<|endoftext|>") stay as they are and start a new word.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Sequence

__all__ = ["CONTINUATION", "WORD_START", "token_labels"]

CONTINUATION = "##"  # WordPiece: this piece continues the word before it
WORD_START = ("Ġ", "▁")  # byte-level BPE / SentencePiece: this piece starts a word
SPECIAL = re.compile(r"^(\[[A-Za-z_]+\]|<\|?[^<>\s]*\|?>)$")  # [CLS], <s>, <|endoftext|>
VISIBLE = str.maketrans({" ": "␣", "\n": "↵", "\t": "⇥", "\r": "↵"})


def _byte_alphabet() -> dict[str, int]:
    """Byte-level BPE's character for each byte -> the byte: printable Latin-1 bytes stand
    for themselves, the other 68 (controls, space, NBSP, soft hyphen) for chr(256 + n) in
    byte order (Radford et al. 2019, GPT-2's encoder)."""
    kept = {*range(33, 127), *range(161, 173), *range(174, 256)}
    table, shifted = {}, 0
    for b in range(256):
        if b in kept:
            table[chr(b)] = b
        else:
            table[chr(256 + shifted)] = b
            shifted += 1
    return table


BYTES = _byte_alphabet()


def _byte_level(pieces: list[str]) -> bool:
    """Whether `pieces` are byte-level BPE: all in its alphabet, and some character stands for
    a byte that is no printable Latin-1 ("Ġ", "Ċ", ...), or the bytes are UTF-8 that is
    not the pieces themselves ("Ã©" for "é"; a Latin-1 "é" alone is no UTF-8)."""
    if not pieces or not all(c in BYTES for t in pieces for c in t):
        return False
    if any(ord(c) >= 0x100 for t in pieces for c in t):
        return True
    joined = "".join(pieces)
    try:
        return bytes(BYTES[c] for c in joined).decode("utf-8") != joined
    except UnicodeDecodeError:
        return False


def _family(tokens: Sequence[str], special: Sequence[bool]) -> str:
    pieces = [t for t, s in zip(tokens, special, strict=True) if not s]
    if any(t.startswith(CONTINUATION) for t in pieces):
        return "wordpiece"
    if _byte_level(pieces):
        return "bytes"
    if any(t.startswith("▁") for t in pieces):
        return "sentencepiece"
    return "plain"


def _visible(text: str) -> str:
    """Whitespace as a visible sign, other control characters as escapes."""
    text = text.translate(VISIBLE)
    return "".join(f"\\x{ord(c):02x}" if ord(c) < 32 or ord(c) == 127 else c for c in text)


def token_labels(tokens: Sequence[str], special: Sequence[bool] | None = None) -> list[str]:
    """The N labels to draw or print for N token strings (module docstring).

    `special`: N flags for the tokens left as they are; default: those written like
    ``[CLS]`` or ``<s>``. Labels already shown this way come back unchanged.
    """
    tokens = [str(t) for t in tokens]
    flags = [bool(SPECIAL.match(t)) for t in tokens] if special is None else list(special)
    if len(flags) != len(tokens):
        raise ValueError(f"special: wanted {len(tokens)} flags, one per token, got {len(flags)}")
    family = _family(tokens, flags)
    if family in ("wordpiece", "plain"):
        return tokens
    labels: list[str] = []
    before = ""  # the previous piece's text; "" after a special token or at the start
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="backslashreplace")
    for token, is_special in zip(tokens, flags, strict=True):
        if is_special:
            labels.append(token)
            before = ""
            utf8.reset()
            continue
        if family == "bytes":  # a character split over pieces belongs to the piece ending it
            raw = bytes(BYTES[c] for c in token)
            text = utf8.decode(raw)
            if not text:  # only the first bytes of a character
                labels.append("".join(f"<0x{b:02X}>" for b in raw))
                continue
            starts = text.startswith(" ") and bool(text.strip())  # "Ġcat": a word's first piece
            text = text[1:] if starts else text
        else:
            starts = token.startswith("▁") and len(token) > 1
            text = token[1:] if starts else token
        joined = not starts and before[-1:].isalnum() and text[:1].isalnum()
        labels.append((CONTINUATION if joined else "") + _visible(text))
        before = text
    return labels
