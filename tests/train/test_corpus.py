"""Corpora as documents (`attnkit.train.corpus`): folders, JSON Lines, separators, paragraphs,
the limits, and paths that are not files named for what they are."""

from __future__ import annotations

import os

import pytest

from attnkit.train.corpus import CorpusError, cut_documents, read_corpus


def test_a_folder_is_one_document_per_file_in_sorted_order(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "two.py").write_text("print(2)\n\n\nprint(22)\n")  # blank lines inside
    (tmp_path / "a.txt").write_text("one\n")
    (tmp_path / ".hidden").write_text("secret\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref\n")
    (tmp_path / "blob.bin").write_bytes(b"\xff\xfe\x00binary")
    corpus = read_corpus(tmp_path, 10_000)
    assert corpus.documents == ["one\n", "print(2)\n\n\nprint(22)\n"]
    assert corpus.kind == "files" and corpus.skipped == 1 and "2 files" in corpus.source
    assert corpus.stats() == {"documents": 2, "min": 4, "median": 12.5, "mean": 12.5, "max": 21}


def test_json_lines_records_and_their_errors(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "first doc"}\n\n{"body": "x", "text": "second"}\n')
    corpus = read_corpus(path, 10_000)
    assert corpus.documents == ["first doc\n", "second\n"] and corpus.kind == "records"
    with pytest.raises(CorpusError, match=r"d.jsonl:1 has no text field 'body'"):
        read_corpus(path, 10_000, text_field="body")
    path.write_text('{"text": "ok"}\n{not json\n')
    with pytest.raises(CorpusError, match=r"d.jsonl:2 is not JSON"):
        read_corpus(path, 10_000)


def test_a_text_file_by_separator_or_by_paragraph(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("a b\n\nc d<|end|>e f<|end|>g")
    assert read_corpus(path, 100, separator="<|end|>").documents == [
        "a b\n\nc d<|end|>", "e f<|end|>", "g",
    ]  # fmt: skip
    paragraphs = read_corpus(path, 100)
    assert paragraphs.kind == "paragraphs" and paragraphs.documents[0] == "a b\n\n"
    assert paragraphs.text == path.read_text()


def test_max_chars_cuts_the_last_document(tmp_path):
    for name in ("a", "b", "c"):
        (tmp_path / name).write_text(name * 10)
    assert read_corpus(tmp_path, 15).documents == ["a" * 10, "b" * 5]


def test_paths_that_are_not_text_are_named(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    (tmp_path / "blank.txt").write_text("\n \n")
    cases = {
        fifo: "is a FIFO",
        tmp_path / "loop": "is a symlink loop",
        tmp_path / "dangling": "is a dangling symlink",
        tmp_path / "absent": "no such file or folder",
        tmp_path / "empty": "a folder with no UTF-8 text file",
        tmp_path / "blank.txt": "is empty",
    }
    if os.path.exists("/dev/zero"):
        cases[__import__("pathlib").Path("/dev/zero")] = "is a device"
    for path, says in cases.items():
        with pytest.raises(CorpusError, match=says):
            read_corpus(path, 100)


def test_cut_documents_splits_the_straddling_one():
    docs = ["abc", "defg", "hi"]
    assert cut_documents(docs, 5) == (["abc", "de"], ["fg", "hi"])
    assert cut_documents(docs, 3) == (["abc"], ["defg", "hi"])
    assert cut_documents(docs, 9) == (docs, [])
