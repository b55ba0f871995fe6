"""Training rows from documents: packed without padding, or padded one document per row.

Dimensions: D documents, R rows, W row width (tokens), L the longest row of a padded batch.

`pack` concatenates the documents and cuts the stream into rows of exactly W tokens, each
token labelled with its document's id within its row (0, 1, ... from the row's start). A
document that runs past a row's end goes on at the start of the next row as a document of
that row (its positions restart there: a row is all a model sees). Nothing is padded; the
last tokens that do not fill a row (fewer than W) are left out. `GPT(ids, document_ids=)`,
`GPT.loss(ids, document_ids=)` and `BertEncoder(..., document_ids=)` take the rows as they
are: attention and the loss stay inside each document.

`pad` is the alternative it replaces: each document in a row of its own (cut into pieces of
at most W tokens), right-padded to the longest row of the batch (transformers'
`DataCollatorWithPadding` habit). The padding is computed and thrown away;
`benchmarks/bench_packing.py` measures what that costs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["Packed", "pack", "pad", "paragraphs", "pieces"]

_BLANK_LINES = re.compile(r"(\n[ \t]*\n(?:[ \t]*\n)*)")  # a newline, then blank lines


@dataclass(frozen=True)
class Packed:
    """Rows of packed documents."""

    ids: Tensor  # (R, W) token ids, no padding
    document_ids: Tensor  # (R, W) int64, each token's document within its row: 0, 1, ...

    def __len__(self) -> int:
        return self.ids.shape[0]

    def __getitem__(self, index) -> Packed:
        """The rows `index` selects (an int keeps a row dimension of 1)."""
        if isinstance(index, int):
            index = slice(index, index + 1)
        return Packed(self.ids[index], self.document_ids[index])

    @property
    def documents(self) -> int:
        """Documents (or pieces of one cut at a row's end) over all rows."""
        return int(self.document_ids[:, -1].sum()) + len(self)


def _width(width) -> int:
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ValueError(f"width must be a positive integer, got {width!r}")
    return width


def _stream(documents: Sequence[Sequence[int] | Tensor]) -> tuple[Tensor, Tensor]:
    """All tokens one after another (T,) and each one's document index (T,)."""
    docs = [torch.as_tensor(d, dtype=torch.long).reshape(-1) for d in documents]
    if not docs:
        return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    lengths = torch.tensor([len(d) for d in docs])
    return torch.cat(docs), torch.repeat_interleave(torch.arange(len(docs)), lengths)


def paragraphs(text: str) -> list[str]:
    """`text` cut after every run of blank lines: the documents `attnkit lm train --pack`
    packs. Each keeps its blank lines at its end (a model learns where a paragraph ends) and
    the next starts with its own indentation; joined, they are `text` again."""
    parts = _BLANK_LINES.split(text)  # paragraph, separator, paragraph, ...
    docs = [a + b for a, b in zip(parts[::2], [*parts[1::2], ""], strict=True)]
    return [d for d in docs if d]


def pack(documents: Sequence[Sequence[int] | Tensor], width: int) -> Packed:
    """Pack `documents` (token id sequences, in order) into rows of `width` tokens.

    Returns `Packed` with R = (total tokens) // width rows; empty documents vanish."""
    width = _width(width)
    tokens, owner = _stream(documents)  # (T,) each
    rows = tokens.numel() // width
    ids = tokens[: rows * width].view(rows, width)  # (R, W)
    owner = owner[: rows * width].view(rows, width)  # (R, W): global document index
    starts = torch.ones_like(owner, dtype=torch.bool)
    starts[:, 1:] = owner[:, 1:] != owner[:, :-1]  # a document (or its rest) starts here
    return Packed(ids, starts.cumsum(1) - 1)


def pieces(documents: Sequence[Sequence[int] | Tensor], width: int) -> list[Tensor]:
    """Every document cut into pieces of at most `width` tokens, in order (1-D tensors)."""
    width = _width(width)
    out: list[Tensor] = []
    for d in documents:
        out.extend(torch.as_tensor(d, dtype=torch.long).reshape(-1).split(width))
    return [p for p in out if p.numel()]


def pad(rows: Sequence[Tensor], pad_id: int) -> tuple[Tensor, Tensor]:
    """Right-pad 1-D token tensors to the longest: ids (B, L) and their lengths (B,)."""
    if not rows:
        raise ValueError("pad: no rows to pad")
    lengths = torch.tensor([len(r) for r in rows])
    out = torch.full((len(rows), int(lengths.max())), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out, lengths
