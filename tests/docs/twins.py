"""What must be equal between a page and its Chinese twin.

Only the English page runs (tests/docs/test_pages.py), so the Chinese one must show the same
program and the same results. A Chinese reader may still get Chinese comments and Chinese
labels, so the comparison is made after this normalisation:

* python code: comments are dropped, and a string literal may differ only when the Chinese
  one contains Chinese characters (a translated label) or is the figures' language ("en" in
  English, "zh" in Chinese); every other token is identical, and the Chinese code must
  compile;
* outputs: the same number of lines; a line may differ only when the Chinese line contains
  Chinese characters and both lines hold the same numbers, in the same order;
* console blocks (CLI commands and what they print): identical.
"""

from __future__ import annotations

import io
import re
import tokenize

from tests.docs.pages import Block

_CJK = re.compile(r"[\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uff00-\uffef]")
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
_LABEL = "<label>"
# A figure's language: the English page passes lang="en", its Chinese twin lang="zh".
_LANG_ARGUMENT = {('"en"', '"zh"'), ("'en'", "'zh'")}


def has_chinese(text: str) -> bool:
    return _CJK.search(text) is not None


def code_tokens(code: str, *, chinese: bool) -> list[str]:
    """The tokens of `code` without comments and layout; in Chinese code a string literal
    holding Chinese characters becomes a placeholder (English code keeps its strings, so a
    Chinese label only ever stands in for a string)."""
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    out = []
    for token in tokenize.generate_tokens(io.StringIO(code).readline):
        if token.type in skip or token.type == tokenize.ENDMARKER:
            continue
        if chinese and token.type == tokenize.STRING and has_chinese(token.string):
            out.append(_LABEL)
        else:
            out.append(token.string)
    return out


def _same_code(english: str, chinese: str) -> bool:
    if english == chinese:
        return True
    english_tokens = code_tokens(english, chinese=False)
    chinese_tokens = code_tokens(chinese, chinese=True)
    if len(english_tokens) != len(chinese_tokens):
        return False
    return all(
        c == e or (c == _LABEL and e[-1:] in "'\"") or (e, c) in _LANG_ARGUMENT
        for e, c in zip(english_tokens, chinese_tokens, strict=True)
    )


def _same_output(english: str | None, chinese: str | None) -> bool:
    if english is None or chinese is None:
        return english == chinese
    english_lines, chinese_lines = english.split("\n"), chinese.split("\n")
    if len(english_lines) != len(chinese_lines):
        return False
    return all(
        e == c or (has_chinese(c) and _NUMBER.findall(e) == _NUMBER.findall(c))
        for e, c in zip(english_lines, chinese_lines, strict=True)
    )


def differences(english: list[Block], chinese: list[Block]) -> list[str]:
    """One line for each block of the Chinese page that is not its English block's twin."""
    if [b.kind for b in english] != [b.kind for b in chinese]:
        return [
            f"the blocks differ: English {[b.kind for b in english]}, "
            f"Chinese {[b.kind for b in chinese]}"
        ]
    bad = []
    for e, c in zip(english, chinese, strict=True):
        where = f"block at zh line {c.line} (en line {e.line})"
        if e.kind == "console":
            if e.key() != c.key():
                bad.append(f"{where}: console blocks must be identical")
            continue
        try:
            compile(c.code, where, "exec")
            same_code = _same_code(e.code, c.code)
        except (SyntaxError, tokenize.TokenError) as err:
            bad.append(f"{where}: the Chinese code does not compile: {err}")
            continue
        if not same_code:
            bad.append(f"{where}: the code differs beyond comments and Chinese labels")
        if not _same_output(e.expected, c.expected):
            bad.append(f"{where}: the output differs beyond Chinese labels with the same numbers")
    return bad
