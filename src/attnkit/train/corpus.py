"""A text corpus as documents: what `attnkit lm train --pack` calls a document.

`read_corpus` reads one of:

* a **folder**: every regular file under it (sorted, recursively; hidden files and folders, and
  files that are not UTF-8 text, left out and counted) — one file is one document;
* a **JSON Lines** file (``.jsonl``): one record is one document, its text in `text_field`;
* a **text file**: documents separated by `separator` when one is given (each keeps its
  separator at its end), else its paragraphs (split after each run of blank lines);
* nothing (``None``): the Python standard library's .py files, one file one document — every
  machine has them and the same Python reads the same text.

The documents joined are the corpus text (`Corpus.text`), so a model trained on windows of
the text and one trained on the packed documents see the same characters. At most `max_chars`
characters are read (the last document cut there). A JSON Lines record gets a newline at its
end, so that a document's end is something a model can learn.
"""

from __future__ import annotations

import json
import statistics
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from attnkit._io import path_kind
from attnkit.train.packing import paragraphs

__all__ = ["Corpus", "CorpusError", "cut_documents", "read_corpus"]


class CorpusError(ValueError):
    """A corpus that cannot be read; the message names the path and why."""


@dataclass(frozen=True)
class Corpus:
    documents: list[str]  # non-empty, in order; "".join(documents) == text
    kind: str  # "files", "records", "separated", "paragraphs"
    source: str  # one line: where the text came from
    skipped: int = 0  # files left out (not UTF-8 text)

    @property
    def text(self) -> str:
        return "".join(self.documents)

    def stats(self) -> dict:
        """count, min, median, mean and max characters per document."""
        sizes = [len(d) for d in self.documents]
        return {"documents": len(sizes), "min": min(sizes), "median": statistics.median(sizes),
                "mean": round(statistics.fmean(sizes), 1), "max": max(sizes)}  # fmt: skip


def _take(docs: list[str], max_chars: int) -> list[str]:
    """Documents up to `max_chars` characters in all (the last one cut), empty ones dropped."""
    out, size = [], 0
    for doc in docs:
        if size >= max_chars:
            break
        doc = doc[: max_chars - size]
        if doc:
            out.append(doc)
            size += len(doc)
    return out


def _files(
    root: Path, max_chars: int, pattern: str = "*", skip=frozenset()
) -> tuple[list[str], int, int]:
    """(documents, files read, files skipped) of the regular files under `root` matching
    `pattern`, in sorted order, leaving out hidden parts and folders named in `skip`."""
    docs, read, skipped, size = [], 0, 0, 0
    paths = sorted(
        p for p in root.rglob(pattern)
        if not any(part.startswith(".") or part in skip for part in p.relative_to(root).parts)
    )  # fmt: skip
    for path in paths:
        if size >= max_chars:
            break
        if not path.is_file():
            continue
        try:
            doc = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            skipped += 1  # binary files, and the few deliberately non-UTF-8 test files
            continue
        if "\x00" in doc:
            skipped += 1
            continue
        docs.append(doc)
        size += len(doc)
        read += 1
    return docs, read, skipped


def _records(path: Path, field: str) -> list[str]:
    docs = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise CorpusError(f"{path}:{number} is not JSON ({err.msg})") from None
            if not isinstance(record, dict) or not isinstance(record.get(field), str):
                raise CorpusError(f"{path}:{number} has no text field {field!r} (a string)")
            docs.append(record[field] + "\n")
    return docs


def read_corpus(
    path: Path | None,
    max_chars: int,
    *,
    text_field: str = "text",
    separator: str | None = None,
) -> Corpus:
    """The documents of `path` (see the module docstring); CorpusError naming the path."""
    if path is None:
        root = Path(sysconfig.get_paths()["stdlib"])
        docs, read, skipped = _files(root, max_chars, "*.py", {"site-packages", "dist-packages"})
        docs = _take(docs, max_chars)
        return Corpus(docs, "files", f"the Python standard library ({root}, {read} files)", skipped)
    what = path_kind(path)
    if what == "missing":
        raise CorpusError(f"{str(path)!r}: no such file or folder")
    if what not in (None, "a folder"):
        raise CorpusError(f"{str(path)!r} is {what}: give a text file, a .jsonl file or a folder")
    if path.is_dir():
        docs, read, skipped = _files(path, max_chars)
        if not docs:
            raise CorpusError(f"{str(path)!r} is a folder with no UTF-8 text file in it")
        return Corpus(_take(docs, max_chars), "files", f"{path} ({read} files)", skipped)
    try:
        if path.suffix == ".jsonl":
            docs, kind = _records(path, text_field), "records"
        else:
            text = path.read_text(encoding="utf-8")[:max_chars]
            if separator:
                parts = text.split(separator)
                docs = [p + separator for p in parts[:-1]] + [parts[-1]]
                kind = "separated"
            else:
                docs, kind = paragraphs(text), "paragraphs"
    except UnicodeDecodeError as err:
        raise CorpusError(f"{str(path)!r} is not UTF-8 text ({err.reason})") from None
    docs = _take(docs, max_chars)
    if not any(d.strip() for d in docs):
        raise CorpusError(f"{str(path)!r} is empty: give a file with some text")
    return Corpus(docs, kind, str(path))


def cut_documents(documents: list[str], split: int) -> tuple[list[str], list[str]]:
    """The documents before and after character `split` of their joined text (the one that
    straddles it cut in two)."""
    before, after, at = [], [], 0
    for doc in documents:
        if at + len(doc) <= split:
            before.append(doc)
        elif at >= split:
            after.append(doc)
        else:
            before.append(doc[: split - at])
            after.append(doc[split - at :])
        at += len(doc)
    return before, after
