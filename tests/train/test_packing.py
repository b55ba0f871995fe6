"""`attnkit.train.packing`: documents packed into rows without padding, or padded per row."""

from __future__ import annotations

import pytest
import torch

from attnkit import masks
from attnkit.train.packing import pack, pad, paragraphs, pieces


def test_pack_cuts_the_stream_into_full_rows_with_document_ids_per_row():
    rows = pack([[1, 2, 3], [4, 5], [], [6, 7, 8, 9, 10], [11]], 4)
    assert rows.ids.tolist() == [[1, 2, 3, 4], [5, 6, 7, 8]]  # 9, 10, 11: not a full row
    # document 1 runs past row 0's end: its rest starts row 1 as that row's document 0
    assert rows.document_ids.tolist() == [[0, 0, 0, 1], [0, 1, 1, 1]]
    assert len(rows) == 2 and rows.documents == 4
    assert rows[1].ids.tolist() == [[5, 6, 7, 8]]
    positions = masks.document_positions(rows.document_ids)
    assert positions.tolist() == [[0, 1, 2, 0], [0, 0, 1, 2]]


def test_pack_of_nothing_and_width_errors():
    assert pack([], 3).ids.shape == (0, 3) and pack([[1, 2]], 3).ids.shape == (0, 3)
    assert pack([torch.tensor([1, 2, 3])], 3).ids.tolist() == [[1, 2, 3]]
    with pytest.raises(ValueError, match="width must be a positive integer"):
        pack([[1]], 0)


def test_pieces_and_pad_are_the_padded_alternative():
    cut = pieces([[1, 2, 3, 4, 5], [], [6]], 2)
    assert [p.tolist() for p in cut] == [[1, 2], [3, 4], [5], [6]]
    ids, lengths = pad(cut, 0)
    assert ids.tolist() == [[1, 2], [3, 4], [5, 0], [6, 0]] and lengths.tolist() == [2, 2, 1, 1]
    with pytest.raises(ValueError, match="no rows"):
        pad([], 0)


def test_paragraphs_split_after_blank_lines_and_join_back():
    text = "def f():\n    pass\n\n\n    # indented\nx = 1\n \t\nlast"
    docs = paragraphs(text)
    assert docs == ["def f():\n    pass\n\n\n", "    # indented\nx = 1\n \t\n", "last"]
    assert "".join(docs) == text
    assert paragraphs("") == [] and paragraphs("one line") == ["one line"]
